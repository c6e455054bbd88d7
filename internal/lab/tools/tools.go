// Package tools is the directory of what the emulated cluster's
// containers run that is not Go: `make lab-tools` builds it (bin/lab-tools
// beside bin/tessera-lab).
package tools

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Dir is the tools' directory:
//
//	tessera-lab-init          first process of every container (cmd/tessera-lab/init)
//	libtessera-limiter.so     the limiter (limiter/), copied to every node
//	lib/libcuda.so.1          the fake CUDA driver (fakegpu/)
//	lib/libnvidia-ml.so.1     the fake NVML (fakegpu/)
//	bin/nvidia-smi            on the PATH of GPU containers
//	bin/gpu-fill, bin/lab-pause  on the PATH of every container
type Dir string

// Default is lab-tools beside the running binary.
func Default() string {
	exe, err := os.Executable()
	if err != nil {
		return "lab-tools"
	}
	return filepath.Join(filepath.Dir(exe), "lab-tools")
}

func (t Dir) path(p ...string) string { return filepath.Join(append([]string{string(t)}, p...)...) }

// Init is the containers' first process.
func (t Dir) Init() string { return t.path("tessera-lab-init") }

// Limiter is the limiter library.
func (t Dir) Limiter() string { return t.path("libtessera-limiter.so") }

// Bin holds the tools on the containers' PATH.
func (t Dir) Bin() string { return t.path("bin") }

// Lib holds the fake driver's libraries.
func (t Dir) Lib() string { return t.path("lib") }

// files are what Check requires.
func (t Dir) files() []string {
	return []string{
		t.Init(), t.Limiter(), t.path("lib", "libcuda.so.1"), t.path("lib", "libnvidia-ml.so.1"),
		t.path("bin", "nvidia-smi"), t.path("bin", "gpu-fill"), t.path("bin", "lab-pause"),
	}
}

// Check reports the files that are missing, and how to build them.
func (t Dir) Check() error {
	var missing []string
	for _, f := range t.files() {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, filepath.Base(f))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the lab's container tools are not in %s (missing %s): build them with `make lab-tools` (gcc, make) or pass --tools DIR",
		t, strings.Join(missing, ", "))
}

// InstallLimiter copies the limiter library to dst, where a node's agent
// mounts it from (deviceplugin.Paths.LimiterHost), as the node agent's
// DaemonSet installs it on a node.
func (t Dir) InstallLimiter(dst string) error {
	b, err := os.ReadFile(t.Limiter())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
