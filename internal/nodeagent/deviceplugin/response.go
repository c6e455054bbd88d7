package deviceplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
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
	// StateRoot holds one directory per container (statedir.Dirs); each
	// is mounted at StateContainer.
	StateRoot      string
	StateContainer string
}

// DefaultPaths are the paths of the DaemonSet in deploy/node-agent.
func DefaultPaths() Paths {
	return Paths{
		LimiterHost:      "/usr/local/tessera/libtessera-limiter.so",
		LimiterContainer: "/usr/local/tessera/libtessera-limiter.so",
		PreloadHost:      "/usr/local/tessera/ld.so.preload",
		StateRoot:        "/var/lib/tessera/containers",
		StateContainer:   "/tessera/state",
	}
}

// WritePreload writes the ld.so.preload file the containers get; the
// agent rewrites it at start so it always names LimiterContainer.
func (p Paths) WritePreload() error {
	if err := os.MkdirAll(filepath.Dir(p.PreloadHost), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p.PreloadHost, []byte(p.LimiterContainer+"\n"), 0o644)
}

// buildResponse is the kubelet's answer for one container's grant. Limited
// means the limiter is injected (shared GPUs on a node in shared mode).
func buildResponse(c api.ContainerAllocation, limited bool, stateDir string, p Paths) *pluginapi.ContainerAllocateResponse {
	uuids := make([]string, len(c.Devices))
	for i, d := range c.Devices {
		uuids[i] = d.UUID
	}
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{api.EnvVisibleDevices: strings.Join(uuids, ",")}}
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
	r.Mounts = []*pluginapi.Mount{
		{ContainerPath: p.LimiterContainer, HostPath: p.LimiterHost, ReadOnly: true},
		{ContainerPath: p.StateContainer, HostPath: stateDir},
		{ContainerPath: "/etc/ld.so.preload", HostPath: p.PreloadHost, ReadOnly: true},
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
