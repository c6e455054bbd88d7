package deviceplugin

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// MIG and MPS answers. They live apart from plugin.go's Allocate, which
// calls before (MIG grants, failRequestsGreaterThanOne) and after (MPS) at
// one place each.

// MIGDevices turns a container's MIG grants into MIG device UUIDs: the
// static layout's devices it names, or, in dynamic mode, instances the
// node agent creates for it (or finds, when the container was already
// answered before an agent restart). It refuses a grant whose parent GPU
// or MIG device is missing or unhealthy.
type MIGDevices interface {
	Prepare(ctx context.Context, pod *v1.Pod, container string, grants []api.DeviceGrant) ([]string, error)
}

// MPS says where a GPU's MPS control daemon pipes are.
type MPS struct {
	// PipeDir is the host directory of GPU uuid's control daemon pipes.
	PipeDir func(uuid string) string
	// ContainerDir is where containers see it (CUDA_MPS_PIPE_DIRECTORY).
	ContainerDir string
	// SlotPercent is the thread percentage of a client whose grant names
	// no core share: one replica's, 100/replicas.
	SlotPercent int
}

// Policy is what the node's configuration adds to the plugin's answers.
type Policy struct {
	// FailRequestsGreaterThanOne refuses a container asking more than
	// one device of the resource (NVIDIA's option for shared resources).
	FailRequestsGreaterThanOne bool
	// MIG answers MIG grants; nil refuses them.
	MIG MIGDevices
	// MPS is set on a node in mps mode.
	MPS *MPS
}

// SetPolicy replaces the plugin's policy.
func (p *Plugin) SetPolicy(pol Policy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pol = pol
}

func (p *Plugin) policy() Policy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pol
}

// before answers what plugin.go's Allocate does not: it refuses a request
// for more than one shared device when the policy says so, and answers a
// container whose grants are MIG devices with their UUIDs (no limiter: a
// MIG device's memory and SMs are the hardware's to enforce). handled is
// false for everything else.
func (p *Plugin) before(ctx context.Context, t *Target, n int) (r *pluginapi.ContainerAllocateResponse, handled bool, err error) {
	pol := p.policy()
	ref := kubeobj.Key(t.Pod)
	if pol.FailRequestsGreaterThanOne && n > 1 {
		return nil, true, fmt.Errorf("%w: pod %s container %s asks for %d %s; this node's configuration sets failRequestsGreaterThanOne (one shared device per container)", ErrNoMatch, ref, t.Container, n, p.opts.Resource)
	}
	if _, mode := p.offered(); mode == api.SharingMPS && pol.MPS != nil && len(t.Grant.Devices) != 1 {
		return nil, true, fmt.Errorf("%w: pod %s container %s holds %d MPS GPUs; an MPS client connects to one GPU's control daemon, so ask for one", ErrNoMatch, ref, t.Container, len(t.Grant.Devices))
	}
	mig := 0
	for _, d := range t.Grant.Devices {
		if d.MIG != nil {
			mig++
		}
	}
	if mig == 0 {
		return nil, false, nil
	}
	if mig != len(t.Grant.Devices) {
		return nil, true, fmt.Errorf("%w: pod %s container %s: its allocation record mixes MIG devices and GPU shares", ErrNoMatch, ref, t.Container)
	}
	if pol.MIG == nil {
		return nil, true, fmt.Errorf("%w: pod %s container %s: its allocation record grants a MIG device, but node %s serves no MIG devices", ErrNoMatch, ref, t.Container, p.opts.Matcher.Node)
	}
	uuids, err := pol.MIG.Prepare(ctx, t.Pod, t.Container, t.Grant.Devices)
	if err != nil {
		return nil, true, fmt.Errorf("%w: pod %s container %s: %v", ErrNoMatch, ref, t.Container, err)
	}
	if _, err := p.opts.Matcher.MarkServed(t.Pod.UID, t.Container); err != nil {
		return nil, true, fmt.Errorf("pod %s container %s: %w", ref, t.Container, err)
	}
	p.logger.Info("Allocated MIG devices", "pod", klog.KObj(t.Pod), "container", t.Container, "devices", uuids)
	if pr := p.opts.Matcher.Protocol; pr != nil {
		pr.Served(ctx, t)
	}
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{api.EnvVisibleDevices: strings.Join(uuids, ",")}}, true, nil
}

// Environment of MPS clients (NVIDIA's names).
const (
	EnvMPSPipeDirectory       = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSThreadPercentage    = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedDeviceMemory  = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	defaultMPSContainerPipeAt = "/tessera/mps"
)

// after completes an MPS client's answer: the GPU's control-daemon pipe
// directory, and its own limits as MPS reads them: the active thread
// percentage from its core share and the pinned device memory limit from
// its memory share. The limiter stays for its memory accounting, without
// its compute pacing (MPS partitions the SMs). (before refused a container
// with more than one GPU: an MPS client connects to one control daemon.)
func (p *Plugin) after(r *pluginapi.ContainerAllocateResponse, t *Target, mode api.SharingMode) error {
	pol := p.policy()
	if mode != api.SharingMPS || pol.MPS == nil {
		return nil
	}
	d := t.Grant.Devices[0] // one: before refused more
	at := pol.MPS.ContainerDir
	if at == "" {
		at = defaultMPSContainerPipeAt
	}
	if r.Envs == nil {
		r.Envs = map[string]string{}
	}
	for k := range r.Envs {
		if strings.HasPrefix(k, api.EnvSMLimit) {
			delete(r.Envs, k)
		}
	}
	r.Envs[EnvMPSPipeDirectory] = at
	r.Envs[EnvMPSThreadPercentage] = strconv.Itoa(MPSThreadPercent(d.Cores, pol.MPS.SlotPercent))
	r.Envs[EnvMPSPinnedDeviceMemory] = MPSMemoryLimit(d.MemoryMiB)
	r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: at, HostPath: pol.MPS.PipeDir(d.UUID)})
	return nil
}

// MPSThreadPercent is an MPS client's active thread percentage: its core
// share, or one replica's (slot) when it asked none.
func MPSThreadPercent(cores, slot int) int {
	if cores <= 0 {
		cores = slot
	}
	return max(1, min(cores, api.MaxCores))
}

// MPSMemoryLimit is CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for device 0 of the
// client ("0=4096M").
func MPSMemoryLimit(mib int64) string { return fmt.Sprintf("0=%dM", mib) }
