package hollowkubelet

// CDI devices in the emulated runtime: what containerd or CRI-O do with a
// container's CDIDevices (resolve them against the CDI specs on the node
// and apply their container edits), done with the CDI library itself.

import (
	"fmt"
	"slices"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// CDIEdits are what a container's CDI devices add to it.
type CDIEdits struct {
	// Env overrides the container's environment.
	Env map[string]string
	// Mounts are bind mounts; device nodes are mounts of the device
	// file (the lab's runtime does not create device nodes).
	Mounts []Mount
	// Hooks are the OCI hooks of the stages the runtime runs
	// (StageCreateContainer, StagePoststop); hooks of other stages are
	// refused.
	Hooks []Hook
}

// Hook is an OCI hook of a container.
type Hook struct {
	Stage   string   `json:"stage"`
	Path    string   `json:"path"`
	Args    []string `json:"args,omitempty"`
	Env     []string `json:"env,omitempty"`
	Timeout int      `json:"timeout,omitempty"` // seconds; 0: none
}

// The OCI hook stages the runtime runs. createContainer hooks run once
// the container's first process is in its cgroup, before its command
// runs (a failing one fails the container, as with runc); poststop hooks
// once its processes are gone, before its cgroup is removed (runc runs
// them after removing it).
const (
	StageCreateContainer = "createContainer"
	StagePoststop        = "poststop"
)

// ResolveCDI resolves the fully-qualified CDI device names
// ("vendor/class=name") against the specs in dirs, as a container runtime
// does when it creates the container. A device no spec defines is an
// error naming it (the runtime refuses the container).
func ResolveCDI(dirs []string, devices []string) (CDIEdits, error) {
	out := CDIEdits{Env: map[string]string{}}
	if len(devices) == 0 {
		return out, nil
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dirs...), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return out, fmt.Errorf("CDI spec directories %s: %w", strings.Join(dirs, ", "), err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, devices...); err != nil {
		if len(unresolved) > 0 {
			return out, fmt.Errorf("CDI devices %s: not defined by any spec in %s: %w", strings.Join(unresolved, ", "), strings.Join(dirs, ", "), err)
		}
		return out, fmt.Errorf("CDI devices %s: %w", strings.Join(devices, ", "), err)
	}
	for _, e := range spec.Process.Env {
		k, v, _ := strings.Cut(e, "=")
		out.Env[k] = v
	}
	for _, m := range spec.Mounts {
		out.Mounts = append(out.Mounts, Mount{HostPath: m.Source, ContainerPath: m.Destination, ReadOnly: slices.Contains(m.Options, "ro")})
	}
	for _, d := range spec.Linux.Devices {
		out.Mounts = append(out.Mounts, Mount{HostPath: d.Path, ContainerPath: d.Path})
	}
	if h := spec.Hooks; h != nil {
		//lint:ignore SA1019 a spec that still has prestart hooks is refused, not ignored
		if len(h.Prestart)+len(h.CreateRuntime)+len(h.StartContainer)+len(h.Poststart) > 0 {
			return out, fmt.Errorf("CDI devices %s: the lab's runtime runs only %s and %s hooks", strings.Join(devices, ", "), StageCreateContainer, StagePoststop)
		}
		for _, st := range []struct {
			stage string
			hooks []oci.Hook
		}{{StageCreateContainer, h.CreateContainer}, {StagePoststop, h.Poststop}} {
			for _, x := range st.hooks {
				hk := Hook{Stage: st.stage, Path: x.Path, Args: x.Args, Env: x.Env}
				if x.Timeout != nil {
					hk.Timeout = *x.Timeout
				}
				out.Hooks = append(out.Hooks, hk)
			}
		}
	}
	return out, nil
}
