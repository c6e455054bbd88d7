package deviceplugin

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// The limiter environment's names live in pkg/api (api.EnvVisibleDevices, …).

// Paths are where the limiter lives on the host and in containers.
type Paths struct {
	// LimiterHost is the limiter library on the host; it is mounted
	// read-only at LimiterContainer.
	LimiterHost      string
	LimiterContainer string
	// PreloadHost is a file naming LimiterContainer, mounted read-only
	// over the container's /etc/ld.so.preload.
	PreloadHost string
	// StateRoot holds one directory per container (statedir.Dirs); the
	// state directory in each is mounted at StateContainer.
	StateRoot      string
	StateContainer string
	// BudgetHost holds the budget file of each GPU (one per UUID), which
	// the host-side reconciler writes; a container with a memory ceiling
	// gets the directory read-only at limiterconf.BudgetDir.
	BudgetHost string
	// ReclaimWait is how long a container's limiter retries an allocation
	// within its guarantee that the driver refused, after asking the
	// reconciler for the memory (its need file; shared mode).
	ReclaimWait time.Duration
}

// DefaultPaths are the paths of the DaemonSet in deploy/node-agent. The
// container paths are the ones the webhook keeps pods from mounting over
// (api.ContainerReservedPaths): change them only together.
func DefaultPaths() Paths {
	return Paths{
		LimiterHost:      "/usr/local/tessera/libtessera-limiter.so",
		LimiterContainer: api.ContainerLimiterDir + "/libtessera-limiter.so",
		PreloadHost:      "/usr/local/tessera/ld.so.preload",
		StateRoot:        "/var/lib/tessera/containers",
		StateContainer:   api.ContainerStateDir,
		BudgetHost:       "/var/lib/tessera/burst",
		ReclaimWait:      2 * time.Second,
	}
}

// WritePreload writes the ld.so.preload file the containers get; the
// agent rewrites it at start so it always names LimiterContainer.
func (p Paths) WritePreload() error {
	if err := os.MkdirAll(filepath.Dir(p.PreloadHost), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p.PreloadHost, api.PreloadList(p.LimiterContainer, nil), 0o644)
}

// DeviceListStrategy is how a container's GPUs reach the container
// runtime; its one home is pkg/api, which the webhook reads too (it
// refuses what would select devices where the environment does).
type DeviceListStrategy = api.DeviceListStrategy

// The strategies (api.DeviceListStrategy).
const (
	// DeviceListEnvvar sets NVIDIA_VISIBLE_DEVICES; the NVIDIA runtime
	// reads it from the container's environment, where the pod's own
	// variables would win over it (the webhook refuses the visible ones;
	// envFrom keys it cannot see: docs/security.md).
	DeviceListEnvvar = api.DeviceListEnvvar
	// DeviceListCDI names the GPUs as CDI devices in the CRI request
	// (kind CDIKind, device names by UUID, as `nvidia-ctk cdi generate
	// --device-name-strategy=uuid` writes them); the environment plays no
	// part.
	DeviceListCDI = api.DeviceListCDI
	// DeviceListVolumeMounts mounts /dev/null at
	// /var/run/nvidia-container-devices/<UUID> per GPU, which the NVIDIA
	// runtime reads when it is set to ignore the environment of
	// unprivileged containers.
	DeviceListVolumeMounts = api.DeviceListVolumeMounts
)

// CDIKind is the CDI kind of NVIDIA's GPU devices.
const CDIKind = "nvidia.com/gpu"

// volumeMountsRoot is where the NVIDIA runtime looks for the
// volume-mounts device list.
const volumeMountsRoot = "/var/run/nvidia-container-devices"

// DeviceListStrategies are the strategies, the default first.
func DeviceListStrategies() []DeviceListStrategy { return api.DeviceListStrategies() }

// containerFiles are the container's files on the host: its writable
// state directory and, when the limiter applies, its limits file and,
// when its pod declares preloads (api.AnnotationPreload), its own preload
// list (otherwise the node's shared one, Paths.PreloadHost).
type containerFiles struct {
	StateDir, LimitsFile, PreloadFile string
	// Budgets: the container has a ceiling; Paths.BudgetHost is mounted.
	Budgets bool
}

// limitsFile is the limiter's read-only limits file for a grant: the
// limits the limiter enforces whatever the container's environment says.
// Under MPS the daemon partitions the SMs, so the limiter keeps only its
// memory accounting (no compute share in the file). A grant with a
// memory ceiling on a node in shared mode gets it with its GPU's budget
// file (bursts: docs/isolation.md), under the container's borrower name;
// elsewhere the container is held to its guarantee. In shared mode the
// file names the need file, through which the limiter asks for borrowed
// memory back when the driver refuses an allocation within the guarantee.
func limitsFile(c api.ContainerAllocation, p Paths, mode api.SharingMode, borrower string) ([]byte, error) {
	cfg := limiterconf.Config{StatePath: filepath.Join(p.StateContainer, statedir.LimiterStateFile)}
	for _, d := range c.Devices {
		dev := limiterconf.Device{UUID: d.UUID, MemoryMiB: uint64(d.MemoryMiB), SMPercent: d.Cores}
		if d.Exclusive {
			dev.MemoryMiB = 0 // a whole GPU: no memory limit on it
		}
		if mode == api.SharingMPS {
			dev.SMPercent = 0
		}
		if bursts(d, mode) {
			dev.Burst(uint64(d.CeilingMiB))
			cfg.Borrower = borrower
		}
		cfg.Devices = append(cfg.Devices, dev)
	}
	if mode == api.SharingShared {
		// a refusal within the guarantee asks the reconciler to stop a
		// container bursting on the GPU (docs/isolation.md)
		cfg.ReclaimPath = path.Join(p.StateContainer, statedir.NeedFile)
		ms := uint64(p.ReclaimWait.Milliseconds())
		cfg.ReclaimWaitMs = &ms
	}
	return limiterconf.Encode(cfg)
}

// bursts reports whether a grant may allocate past its guarantee: it has
// a ceiling, shares the GPU, and the node is in shared mode (under MPS
// the server's pinned-memory limit is the guarantee).
func bursts(d api.DeviceGrant, mode api.SharingMode) bool {
	return d.Bursts() && mode == api.SharingShared
}

// ReasonCeilingHeld is the reason of the Warning event on a pod whose
// container asked a memory ceiling on a GPU shared through MPS, where it
// is held to its guarantee.
const ReasonCeilingHeld = "TesseraGPUMemoryCeilingHeld"

// ceilingHeld tells the pod, with a Warning event, that a container's
// memory ceiling is not honoured on an MPS node: the MPS server's
// per-client pinned-memory limit is set to the guarantee, and nothing
// could give borrowed memory back to a guarantee (the server evicts no
// client on drivers older than r615; the limiter's reclaim cannot reach
// into the server's clients), so the container is held to its guarantee.
func (p *Plugin) ceilingHeld(t *Target, mode api.SharingMode) {
	if mode != api.SharingMPS || p.opts.Recorder == nil {
		return
	}
	for _, d := range t.Grant.Devices {
		if d.Bursts() {
			p.opts.Recorder.Eventf(t.Pod, v1.EventTypeWarning, ReasonCeilingHeld,
				"container %s: its memory ceiling (%d MiB) is not applied on GPU %s, which node %s shares through MPS: the MPS server holds each client to a pinned-memory limit, set to the guarantee (%d MiB); run it on a node in shared mode to burst past the guarantee",
				t.Container, d.CeilingMiB, d.UUID, p.opts.Matcher.Node, d.MemoryMiB)
			return
		}
	}
}

// Bursts reports whether any of a container's grants may burst.
func Bursts(c api.ContainerAllocation, mode api.SharingMode) bool {
	for _, d := range c.Devices {
		if bursts(d, mode) {
			return true
		}
	}
	return false
}

// buildResponse is the kubelet's answer for one container's grant.
// Limited means the limiter is injected (shared GPUs on a node in shared
// mode): its read-only limits file, its library and preload list, the
// writable state directory, and (for HAMi-core, which reads no limits
// file) the limit variables.
func buildResponse(c api.ContainerAllocation, limited bool, f containerFiles, p Paths, s DeviceListStrategy) *pluginapi.ContainerAllocateResponse {
	uuids := make([]string, len(c.Devices))
	for i, d := range c.Devices {
		uuids[i] = d.UUID
	}
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	switch s {
	case DeviceListCDI:
		for _, u := range uuids {
			r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: CDIKind + "=" + u})
		}
	case DeviceListVolumeMounts:
		r.Envs[api.EnvVisibleDevices] = volumeMountsRoot
		for _, u := range uuids {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: filepath.Join(volumeMountsRoot, u), HostPath: "/dev/null", ReadOnly: true})
		}
	default:
		r.Envs[api.EnvVisibleDevices] = strings.Join(uuids, ",")
	}
	if !limited {
		return r
	}
	cores := c.Devices[0].Cores
	for i, d := range c.Devices {
		r.Envs[fmt.Sprintf("%s_%d", api.EnvMemoryLimit, i)] = fmt.Sprintf("%dm", d.MemoryMiB)
		if d.Cores != cores {
			cores = -1
		}
	}
	switch {
	case cores > 0 && cores < api.MaxCores:
		r.Envs[api.EnvSMLimit] = fmt.Sprint(cores)
	case cores < 0:
		// HAMi-core has one SM limit: the smallest share; Tessera's
		// limiter reads the per-device values.
		low := api.MaxCores
		for i, d := range c.Devices {
			if d.Cores > 0 {
				low = min(low, d.Cores)
			}
			r.Envs[fmt.Sprintf("%s_%d", api.EnvSMLimit, i)] = fmt.Sprint(d.Cores)
		}
		r.Envs[api.EnvSMLimit] = fmt.Sprint(low)
	}
	r.Envs[api.EnvSharedCache] = filepath.Join(p.StateContainer, statedir.LimiterStateFile)
	preload := p.PreloadHost
	if f.PreloadFile != "" {
		preload = f.PreloadFile
	}
	r.Mounts = append(r.Mounts,
		&pluginapi.Mount{ContainerPath: p.LimiterContainer, HostPath: p.LimiterHost, ReadOnly: true},
		&pluginapi.Mount{ContainerPath: p.StateContainer, HostPath: f.StateDir},
		&pluginapi.Mount{ContainerPath: api.ContainerPreload, HostPath: preload, ReadOnly: true},
	)
	if f.LimitsFile != "" {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: limiterconf.Path, HostPath: f.LimitsFile, ReadOnly: true})
	}
	if f.Budgets {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: limiterconf.BudgetDir, HostPath: p.BudgetHost, ReadOnly: true})
	}
	return r
}

// needsLimiter reports whether a grant gets the limiter: shared grants on
// a node in shared mode, and MPS clients (for its memory accounting);
// exclusive whole GPUs and time-slicing run unlimited.
func needsLimiter(c api.ContainerAllocation, mode api.SharingMode) bool {
	if mode != api.SharingShared && mode != api.SharingMPS {
		return false
	}
	for _, d := range c.Devices {
		if !d.Exclusive {
			return true
		}
	}
	return false
}
