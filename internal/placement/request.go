package placement

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Request is what one pod asks of a node.
type Request struct {
	// Pod is the pod's key ("namespace/name"), used in records and messages.
	Pod string
	// CPUMilli and MemoryMiB are the pod's effective CPU and memory requests.
	CPUMilli  int64
	MemoryMiB int64
	// InitContainers run one at a time before the app containers, so their
	// GPU shares may reuse what the app containers hold.
	InitContainers []Container
	Containers     []Container

	// GPU selection (pod-wide, from annotations). Empty = no constraint.
	IncludeModels, ExcludeModels []string
	IncludeUUIDs, ExcludeUUIDs   []string
	// NUMABind requires all GPUs of each container to share one NUMA node.
	NUMABind bool

	// Per-pod policy overrides; empty = the cluster default.
	NodePolicy api.NodePolicy
	GPUPolicy  api.GPUPolicy
}

// Container is one container's GPU request. All values are per GPU.
type Container struct {
	Name string
	// GPUs is the number of distinct GPUs (0 = the container uses none).
	GPUs int
	// MemoryMiB is the memory per GPU. When 0, MemoryPercent applies.
	MemoryMiB int64
	// MemoryPercent is the memory per GPU as a percentage of each GPU's
	// physical memory. When both are 0 the container gets whole GPUs.
	MemoryPercent int
	// Cores is the compute share per GPU in percent (0 = no guarantee,
	// 100 = the whole GPU exclusively).
	Cores int
	// CeilingMiB is the memory ceiling per GPU above MemoryMiB, the
	// guarantee (0 = none). Only the guarantee is charged; the ceiling
	// needs a GPU at least that large whose memory is not overcommitted.
	CeilingMiB int64
	// MIGProfile asks for one MIG device of this GPU-instance profile
	// ("1g.5gb", from the resource nvidia.com/mig-1g.5gb): a static
	// layout's device, or an instance created for the pod on a dynamic
	// MIG GPU. GPUs is then 1 and memory and cores are the profile's.
	MIGProfile string
}

// ask is the container's per-GPU request in gpushare's terms, which
// decide what it is granted (the node agent checks records by the same
// rules).
func (c Container) ask() gpushare.Ask {
	return gpushare.Ask{MemoryMiB: c.MemoryMiB, MemoryPercent: c.MemoryPercent, Cores: c.Cores, CeilingMiB: c.CeilingMiB}
}

// Exclusive reports whether the container takes whole GPUs: all compute,
// all memory by percentage, or no memory asked for at all.
func (c Container) Exclusive() bool { return c.ask().Exclusive() }

// memoryOn is the memory the container is granted on g.
func (c Container) memoryOn(g *GPU) int64 { return c.ask().MemoryOn(g.MemoryMiB) }

// Validate checks a request for values the core cannot place. The messages
// name the container, the field, the value and the limit.
func (r *Request) Validate() error {
	if r.CPUMilli < 0 {
		return fmt.Errorf("pod %s: CPU request %dm is negative", r.Pod, r.CPUMilli)
	}
	if r.MemoryMiB < 0 {
		return fmt.Errorf("pod %s: memory request %d MiB is negative", r.Pod, r.MemoryMiB)
	}
	if n := len(r.InitContainers) + len(r.Containers); n > api.MaxContainersPerPod {
		return fmt.Errorf("pod %s: %d containers, at most %d supported", r.Pod, n, api.MaxContainersPerPod)
	}
	for _, cs := range [][]Container{r.InitContainers, r.Containers} {
		for _, c := range cs {
			if err := c.validate(); err != nil {
				return fmt.Errorf("pod %s: %w", r.Pod, err)
			}
		}
	}
	for _, m := range r.IncludeModels {
		for _, x := range r.ExcludeModels {
			if strings.EqualFold(m, x) {
				return fmt.Errorf("pod %s: GPU model %q is both included and excluded", r.Pod, m)
			}
		}
	}
	if r.NodePolicy != "" && !r.NodePolicy.Valid() {
		return fmt.Errorf("pod %s: unknown node policy %q (want one of %v)", r.Pod, r.NodePolicy, api.NodePolicies())
	}
	if r.GPUPolicy != "" && !r.GPUPolicy.Valid() {
		return fmt.Errorf("pod %s: unknown GPU policy %q (want one of %v)", r.Pod, r.GPUPolicy, api.GPUPolicies())
	}
	return nil
}

func (c Container) validate() error {
	switch {
	case c.GPUs < 0 || c.GPUs > api.MaxGPUsPerNode:
		return fmt.Errorf("container %q: GPU count %d outside [0, %d]", c.Name, c.GPUs, api.MaxGPUsPerNode)
	case c.MemoryMiB < 0:
		return fmt.Errorf("container %q: GPU memory %d MiB is negative", c.Name, c.MemoryMiB)
	case c.MemoryPercent < 0 || c.MemoryPercent > 100:
		return fmt.Errorf("container %q: GPU memory percentage %d outside [0, 100]", c.Name, c.MemoryPercent)
	case c.Cores < 0 || c.Cores > 100:
		return fmt.Errorf("container %q: GPU cores %d%% outside [0, 100]", c.Name, c.Cores)
	case c.MemoryMiB > 0 && c.MemoryPercent > 0:
		return fmt.Errorf("container %q: GPU memory given both as %d MiB and as %d%%; give one", c.Name, c.MemoryMiB, c.MemoryPercent)
	case c.GPUs == 0 && (c.MemoryMiB > 0 || c.MemoryPercent > 0 || c.Cores > 0):
		return fmt.Errorf("container %q: GPU memory or cores requested with a GPU count of 0", c.Name)
	case c.MIGProfile != "" && c.GPUs != 1:
		return fmt.Errorf("container %q: %d MIG devices of %s; a container gets one MIG device (CUDA uses only the first MIG device it is given)", c.Name, c.GPUs, c.MIGProfile)
	case c.MIGProfile != "" && (c.MemoryMiB > 0 || c.MemoryPercent > 0 || c.Cores > 0 || c.CeilingMiB > 0):
		return fmt.Errorf("container %q: MIG profile %s together with GPU memory or cores; the profile fixes both", c.Name, c.MIGProfile)
	case c.CeilingMiB < 0 || c.CeilingMiB > api.MaxGPUMemoryMiB:
		return fmt.Errorf("container %q: GPU memory ceiling %d MiB outside [0, %d]", c.Name, c.CeilingMiB, api.MaxGPUMemoryMiB)
	case c.CeilingMiB > 0 && (c.MemoryMiB == 0 || c.CeilingMiB < c.MemoryMiB):
		return fmt.Errorf("container %q: GPU memory ceiling %d MiB needs a guarantee of at most that much in MiB (memory %d MiB)", c.Name, c.CeilingMiB, c.MemoryMiB)
	case c.CeilingMiB > 0 && c.Exclusive():
		return fmt.Errorf("container %q: GPU memory ceiling %d MiB on a whole GPU, which has nothing to borrow", c.Name, c.CeilingMiB)
	}
	if c.MIGProfile != "" {
		if _, _, _, err := api.ParseMIGProfile(c.MIGProfile); err != nil {
			return fmt.Errorf("container %q: %w", c.Name, err)
		}
	}
	return nil
}

// Compiled is a validated request prepared for repeated fit checks against
// one cluster: containers ordered for placement and selectors resolved
// against the cluster's GPU models. It is read-only, so fit checks on many
// nodes may share it concurrently.
type Compiled struct {
	Req *Request
	// gpu lists the containers that need GPUs: app containers first,
	// largest demand first, then init containers in spec order.
	gpu      []compiledContainer
	numApp   int
	needsGPU bool
	maxCount int
	// modelOK[id] for model IDs known when compiled: 1 allowed, 2 excluded
	// by ExcludeModels, 3 not in IncludeModels.
	modelOK []uint8
	uuidIn  map[string]struct{}
	uuidOut map[string]struct{}
	// selects: the pod selects GPUs by model or UUID (else every healthy
	// GPU is eligible, decided without looking further).
	selects bool
	gpuPol  api.GPUPolicy
	// key is the request's shape for Memo (shapeKey).
	key string
}

type compiledContainer struct {
	c       Container
	init    bool
	specPos int // position in InitContainers or Containers
	// Decided once at compile time (the fit check asks them per GPU):
	// excl is c.Exclusive(), cores the compute share granted (whole GPUs
	// get 100%), ceiling the memory ceiling granted above the guarantee
	// (0: none).
	excl    bool
	cores   int
	ceiling int64
}

func compileContainer(c Container, init bool, specPos int) compiledContainer {
	a := c.ask()
	return compiledContainer{c: c, init: init, specPos: specPos, excl: a.Exclusive(), cores: a.CoresGranted(),
		ceiling: a.CeilingOn(c.MemoryMiB, a.Exclusive())}
}

const (
	modelAllowed uint8 = iota + 1
	modelExcluded
	modelNotIncluded
)

// Compile validates r and prepares it for fit checks in c.
func (c *Cluster) Compile(r *Request) (*Compiled, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	cr := &Compiled{Req: r, gpuPol: r.GPUPolicy}
	if cr.gpuPol == "" {
		cr.gpuPol = c.DefaultGPUPolicy
	}
	for i, ct := range r.Containers {
		if ct.GPUs > 0 {
			cr.gpu = append(cr.gpu, compileContainer(ct, false, i))
		}
	}
	// Hard containers first: more GPUs, then exclusive, then more memory.
	sort.SliceStable(cr.gpu, func(i, j int) bool {
		a, b := cr.gpu[i].c, cr.gpu[j].c
		if a.GPUs != b.GPUs {
			return a.GPUs > b.GPUs
		}
		if a.Exclusive() != b.Exclusive() {
			return a.Exclusive()
		}
		if a.MemoryPercent != b.MemoryPercent {
			return a.MemoryPercent > b.MemoryPercent
		}
		if a.MemoryMiB != b.MemoryMiB {
			return a.MemoryMiB > b.MemoryMiB
		}
		return a.Cores > b.Cores
	})
	cr.numApp = len(cr.gpu)
	for i, ct := range r.InitContainers {
		if ct.GPUs > 0 {
			cr.gpu = append(cr.gpu, compileContainer(ct, true, i))
		}
	}
	cr.needsGPU = len(cr.gpu) > 0
	for _, cc := range cr.gpu {
		cr.maxCount = max(cr.maxCount, cc.c.GPUs)
	}
	cr.modelOK = make([]uint8, len(c.models.names))
	for id, name := range c.models.names {
		cr.modelOK[id] = modelVerdict(name, r.IncludeModels, r.ExcludeModels)
	}
	if len(r.IncludeUUIDs) > 0 {
		cr.uuidIn = toSet(r.IncludeUUIDs)
	}
	if len(r.ExcludeUUIDs) > 0 {
		cr.uuidOut = toSet(r.ExcludeUUIDs)
	}
	cr.selects = len(r.IncludeModels)+len(r.ExcludeModels) > 0 || cr.uuidIn != nil || cr.uuidOut != nil
	cr.key = memoKey(cr)
	return cr, nil
}

// NeedsGPU reports whether any container asks for a GPU.
func (cr *Compiled) NeedsGPU() bool { return cr.needsGPU }

func modelVerdict(model string, include, exclude []string) uint8 {
	for _, x := range exclude {
		if api.ModelMatches(x, model) {
			return modelExcluded
		}
	}
	if len(include) == 0 {
		return modelAllowed
	}
	for _, m := range include {
		if api.ModelMatches(m, model) {
			return modelAllowed
		}
	}
	return modelNotIncluded
}

// modelVerdict for a GPU, from the compiled table when the model was known
// at compile time.
func (cr *Compiled) modelVerdict(g *GPU) uint8 {
	if g.modelID >= 0 && int(g.modelID) < len(cr.modelOK) {
		return cr.modelOK[g.modelID]
	}
	return modelVerdict(g.Model, cr.Req.IncludeModels, cr.Req.ExcludeModels)
}

func toSet(xs []string) map[string]struct{} {
	m := make(map[string]struct{}, len(xs))
	for _, x := range xs {
		m[x] = struct{}{}
	}
	return m
}

// modelTable interns GPU model names so selectors are matched once per
// model rather than once per GPU.
type modelTable struct {
	ids   map[string]int32
	names []string
}

func (t *modelTable) id(name string) int32 {
	if id, ok := t.ids[name]; ok {
		return id
	}
	if t.ids == nil {
		t.ids = map[string]int32{}
	}
	id := int32(len(t.names))
	t.ids[name] = id
	t.names = append(t.names, name)
	return id
}
