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
}

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
	return out, nil
}
