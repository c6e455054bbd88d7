// Package volcano is Volcano's vGPU protocol as a node sees it
// (docs/volcano.md): the node's registration annotation, the per-pod
// annotations Volcano's scheduler writes when it allocates GPU shares,
// what Volcano gives each container of a pod from its spec, and the check
// that a pod's annotations grant exactly that. It is pure (the API types
// and pkg/api only): the node agent's volcano part and the webhook use it.
//
// Volcano's own readers are lenient (a field that does not parse is 0);
// these are strict: anything that does not parse is an error naming it,
// and a node refuses such a pod rather than guess.
package volcano

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// MaxAnnotationBytes bounds what is parsed of a pod's device annotation:
// 64 GPUs per container of ~70 bytes each, for many containers.
const MaxAnnotationBytes = 64 << 10

// Device is one GPU of a container's grant, as the annotation writes it.
type Device struct {
	// UUID is the GPU's, without the MIG position.
	UUID string
	// MIG is the instance Volcano's mig mode chose on the GPU (nil: a
	// share of the GPU, hami-core mode).
	MIG *MIGPosition
	// Type is the device type Volcano writes ("NVIDIA").
	Type string
	// MemoryMiB is the memory asked of the GPU; in mig mode the
	// instance's memory is at least that.
	MemoryMiB int64
	Cores     int
}

// ID is the device as Volcano writes it: the UUID, and the MIG position
// after it.
func (d Device) ID() string {
	if d.MIG == nil {
		return d.UUID
	}
	return d.UUID + d.MIG.String()
}

// DecodePodDevices parses AnnotationVolcanoIDs: per vGPU container (";"
// between containers), "<uuid>,<type>,<MiB>,<cores>:" per GPU.
func DecodePodDevices(s string) ([][]Device, error) {
	if len(s) > MaxAnnotationBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than %d", api.AnnotationVolcanoIDs, len(s), MaxAnnotationBytes)
	}
	if s == "" {
		return nil, fmt.Errorf("%s is empty", api.AnnotationVolcanoIDs)
	}
	var out [][]Device
	for i, cs := range strings.Split(s, ";") {
		var devs []Device
		for j, ds := range strings.Split(cs, ":") {
			if ds == "" {
				continue // the terminator after each device
			}
			d, err := decodeDevice(ds)
			if err != nil {
				return nil, fmt.Errorf("%s: container entry %d, device %d (%.80q): %v", api.AnnotationVolcanoIDs, i, j, ds, err)
			}
			devs = append(devs, d)
		}
		out = append(out, devs)
	}
	return out, nil
}

func decodeDevice(s string) (Device, error) {
	f := strings.Split(s, ",")
	if len(f) != 4 {
		return Device{}, fmt.Errorf("%d fields, want 4 (uuid,type,memory MiB,cores)", len(f))
	}
	uuid, pos, err := parseMIGID(f[0])
	if err != nil {
		return Device{}, err
	}
	if err := checkUUID(uuid); err != nil {
		return Device{}, err
	}
	mem, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || mem < 0 || mem > api.MaxGPUMemoryMiB {
		return Device{}, fmt.Errorf("memory %q is not a number of MiB in [0, %d]", f[2], int64(api.MaxGPUMemoryMiB))
	}
	cores, err := strconv.Atoi(f[3])
	if err != nil || cores < 0 || cores > api.MaxCores {
		return Device{}, fmt.Errorf("cores %q is not a percentage in [0, %d]", f[3], api.MaxCores)
	}
	return Device{UUID: uuid, MIG: pos, Type: f[1], MemoryMiB: mem, Cores: cores}, nil
}

// checkUUID accepts a GPU UUID.
func checkUUID(u string) error {
	if !strings.HasPrefix(u, "GPU-") || len(u) > 128 {
		return fmt.Errorf("%q is not a GPU UUID", u)
	}
	return nil
}

// EncodePodDevices writes AnnotationVolcanoIDs as Volcano does.
func EncodePodDevices(pd [][]Device) string {
	parts := make([]string, len(pd))
	for i, cd := range pd {
		var b strings.Builder
		for _, d := range cd {
			fmt.Fprintf(&b, "%s,%s,%d,%d:", d.ID(), d.Type, d.MemoryMiB, d.Cores)
		}
		parts[i] = b.String()
	}
	return strings.Join(parts, ";")
}

// RegisteredGPU is one GPU of the node's registration annotation.
type RegisteredGPU struct {
	UUID string
	// Split is how many containers may share it (Volcano's
	// deviceSplitCount): the node profile's sharesPerGPU.
	Split     int
	MemoryMiB int64
	// Model is NVML's name; the type is "NVIDIA-<model>".
	Model   string
	Healthy bool
	// Mode is the GPU's sharing mode (api.VolcanoModeHAMiCore or
	// api.VolcanoModeMIG).
	Mode string
}

// EncodeRegister writes AnnotationVolcanoRegister:
// "<uuid>,<split>,<MiB>,NVIDIA-<model>,<healthy>,<mode>:" per GPU. A
// comma or colon in a model name would break Volcano's reader; they are
// replaced.
func EncodeRegister(gpus []RegisteredGPU) string {
	var b strings.Builder
	for _, g := range gpus {
		fmt.Fprintf(&b, "%s,%d,%d,%s,%t,%s:", g.UUID, g.Split, g.MemoryMiB, RegisteredType(g.Model), g.Healthy, g.Mode)
	}
	return b.String()
}

// Ask is what Volcano gives one vGPU container, read from its spec the way
// Volcano's scheduler reads it (devices.ExtractResourceRequest): the GPU
// count (vgpu-number; a container with vgpu-memory but no count gets one
// GPU), the memory per GPU (vgpu-memory MiB, or vgpu-memory-percentage of
// each GPU's memory, which wins when both are given; neither: all of it)
// and the cores per GPU (vgpu-cores, else 0).
type Ask struct {
	Container string
	GPUs      int
	MemoryMiB int64
	// Percent: the memory is MemoryPercent of each GPU's memory, not
	// MemoryMiB.
	Percent       bool
	MemoryPercent int64
	Cores         int
}

// MemoryOn is the memory Volcano grants on a GPU registered with
// gpuMiB: its computation, to the MiB.
func (a Ask) MemoryOn(gpuMiB int64) int64 {
	if a.Percent {
		return int64(float64(gpuMiB) * float64(a.MemoryPercent) / 100.0)
	}
	return a.MemoryMiB
}

// Asks returns what Volcano gives each of the pod's vGPU containers: its
// app containers that name vgpu-number or vgpu-memory in their limits, in
// spec order (Volcano allocates nothing to init containers, nor to a
// container with only cores or a percentage). Values are bounds-checked
// (kubeobj.ReadResources).
func Asks(pod *corev1.Pod) ([]Ask, error) {
	var out []Ask
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		_, hasCount := c.Resources.Limits[api.VolcanoVGPUNumber]
		_, hasMem := c.Resources.Limits[api.VolcanoVGPUMemory]
		if !hasCount && !hasMem {
			continue
		}
		r, err := kubeobj.ReadResources(c, api.VolcanoResourceNames)
		if err != nil {
			return nil, err
		}
		a := Ask{Container: c.Name, GPUs: 1, Cores: int(r.Cores)}
		if hasCount {
			if r.GPUMilli%1000 != 0 {
				return nil, &kubeobj.ResourceError{Container: c.Name, Resource: api.VolcanoVGPUNumber, Value: strconv.FormatInt(r.GPUMilli, 10) + "m", Reason: "must be a whole number"}
			}
			a.GPUs = int(r.GPUMilli / 1000)
		}
		switch {
		case r.HasPercent:
			a.Percent, a.MemoryPercent = true, r.MemoryPercent
		case r.MemoryMiB == 0: // none given, or 0: the whole GPU
			a.Percent, a.MemoryPercent = true, 100
		default:
			a.MemoryMiB = r.MemoryMiB
		}
		out = append(out, a)
	}
	return out, nil
}

// RequestsVGPU reports whether any container of the pod, init containers
// included, names one of Volcano's vGPU resources.
func RequestsVGPU(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, rl := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for _, n := range api.VolcanoResources() {
					if _, ok := rl[corev1.ResourceName(n)]; ok {
						return true
					}
				}
			}
		}
	}
	return false
}

// Record is the pod's grants as Volcano's annotations state them, in the
// shape of Tessera's allocation record (held in memory only: the node
// agent's checks, its ledger and its answers to the kubelet work on it).
// The node is the annotation's, not the pod's: the caller compares them.
// A device with a MIG position (Volcano's mig mode) becomes a MIG grant of
// the instance instance names; an empty one where it cannot tell, which
// Match then refuses saying why.
func Record(pod *corev1.Pod, instance func(Device) api.MIGGrant) (*api.PodAllocation, error) {
	node, ok := pod.Annotations[api.AnnotationVolcanoNode]
	ids, ok2 := pod.Annotations[api.AnnotationVolcanoIDs]
	if !ok || !ok2 {
		return nil, fmt.Errorf("pod %s has no %s and %s annotations: Volcano's scheduler (deviceshare with VGPUEnable) did not allocate its vGPUs, and a share without them would run without limits", kubeobj.Key(pod), api.AnnotationVolcanoNode, api.AnnotationVolcanoIDs)
	}
	pd, err := DecodePodDevices(ids)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %v", kubeobj.Key(pod), err)
	}
	asks, err := Asks(pod)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %v", kubeobj.Key(pod), err)
	}
	if len(pd) != len(asks) {
		return nil, fmt.Errorf("pod %s: %s has %d container entries, the pod has %d vGPU containers", kubeobj.Key(pod), api.AnnotationVolcanoIDs, len(pd), len(asks))
	}
	rec := &api.PodAllocation{Node: node, PodUID: string(pod.UID)}
	for i, a := range asks {
		c := api.ContainerAllocation{Name: a.Container}
		for _, d := range pd[i] {
			g := api.DeviceGrant{UUID: d.UUID, MemoryMiB: d.MemoryMiB, Cores: d.Cores}
			if d.MIG != nil {
				var m api.MIGGrant
				if instance != nil {
					m = instance(d)
				}
				g.MIG = &m
			}
			c.Devices = append(c.Devices, g)
		}
		rec.Containers = append(rec.Containers, c)
	}
	return rec, nil
}

// GPUInfo is what Match needs to know of a GPU of the node.
type GPUInfo struct {
	// MemoryMiB is its registered memory.
	MemoryMiB int64
	// MIG: it is registered in mode mig.
	MIG bool
}

// Match checks that the annotations grant the pod exactly what Volcano
// gives its spec (Asks): per vGPU container as many distinct GPUs as it
// asks, each of Volcano's type, with the memory Volcano computes from the
// GPU's registered memory and the cores asked; a MIG position exactly on
// the GPUs registered in mode mig, each checked by instance (nil: none
// is accepted). It cannot tell which GPUs Volcano chose; the node's
// ledger checks that they fit.
func Match(pod *corev1.Pod, gpu func(uuid string) (GPUInfo, bool), instance func(Device) error) error {
	pd, err := DecodePodDevices(pod.Annotations[api.AnnotationVolcanoIDs])
	if err != nil {
		return err
	}
	asks, err := Asks(pod)
	if err != nil {
		return err
	}
	if len(pd) != len(asks) {
		return fmt.Errorf("%s has %d container entries, the pod has %d vGPU containers", api.AnnotationVolcanoIDs, len(pd), len(asks))
	}
	for i, a := range asks {
		devs := pd[i]
		if len(devs) != a.GPUs {
			return fmt.Errorf("container %q asks for %d GPUs, %s grants %d", a.Container, a.GPUs, api.AnnotationVolcanoIDs, len(devs))
		}
		seen := map[string]bool{}
		for _, d := range devs {
			if seen[d.UUID] {
				return fmt.Errorf("container %q is granted GPU %s twice", a.Container, d.UUID)
			}
			seen[d.UUID] = true
			if d.Type != api.VolcanoDeviceType {
				return fmt.Errorf("container %q: GPU %s has device type %q, want %q", a.Container, d.UUID, d.Type, api.VolcanoDeviceType)
			}
			info, ok := gpu(d.UUID)
			if !ok {
				return fmt.Errorf("container %q: GPU %s is not a GPU of this node", a.Container, d.UUID)
			}
			switch {
			case d.MIG != nil && !info.MIG:
				return fmt.Errorf("container %q: %s names a MIG position of Volcano's mig mode; GPU %s is registered in mode %s", a.Container, d.ID(), d.UUID, api.VolcanoModeHAMiCore)
			case d.MIG == nil && info.MIG:
				return fmt.Errorf("container %q: GPU %s is granted as a share, but it is registered in mode %s: a share of a GPU in MIG mode cannot run (does Volcano's scheduler have a MIG geometry for it? docs/volcano.md, \"MIG mode\")", a.Container, d.UUID, api.VolcanoModeMIG)
			}
			if want := a.MemoryOn(info.MemoryMiB); d.MemoryMiB != want {
				return fmt.Errorf("container %q: GPU %s is granted %d MiB, the container asks for %s", a.Container, d.UUID, d.MemoryMiB, a.describeMemory(want))
			}
			if d.Cores != a.Cores {
				return fmt.Errorf("container %q: GPU %s is granted %d percent of the cores, the container asks for %d", a.Container, d.UUID, d.Cores, a.Cores)
			}
			if d.MIG != nil {
				if instance == nil {
					return fmt.Errorf("container %q: %s names a MIG position, and this node serves no MIG instances", a.Container, d.ID())
				}
				if err := instance(d); err != nil {
					return fmt.Errorf("container %q: %s: %v", a.Container, d.ID(), err)
				}
			}
		}
	}
	return nil
}

func (a Ask) describeMemory(want int64) string {
	if a.Percent {
		return fmt.Sprintf("%d percent of its memory (%d MiB)", a.MemoryPercent, want)
	}
	return fmt.Sprintf("%d MiB", want)
}
