package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet/cinit"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// containerGPUs is where a GPU container finds its GPUs: the state file of
// each (0, 1, … in the order of NVIDIA_VISIBLE_DEVICES) and the driver
// socket; the fake driver reads them from there (fakegpu/src/fake_common.h).
const containerGPUs = "/run/tessera-fakegpu"

// nodeGPUs is an emulated node's GPUs: the mock NVML's devices and their
// state files.
type nodeGPUs struct {
	files *fakegpu.Node
	gpus  []fakegpu.GPU // by NVML index
}

// newNodeGPUs creates the state file of each GPU of the node (kept when it
// is already there for that GPU).
func newNodeGPUs(dir, node, model string, count int) (*nodeGPUs, error) {
	lib, err := nvmltest.NewModel(model, count, node)
	if err != nil {
		return nil, err
	}
	n := &nodeGPUs{files: &fakegpu.Node{Dir: dir}}
	for i := range lib.Devices {
		d := lib.Device(i)
		name, _ := d.GetName()
		name = strings.TrimPrefix(name, "Mock ") // go-nvml's A100-SXM4-40GB is named so
		g := fakegpu.GPU{UUID: d.UUID, Name: name, MemoryBytes: d.MemoryInfo.Total}
		if err := fakegpu.Create(n.files.File(g.UUID), g); err != nil {
			return nil, fmt.Errorf("GPU %d of %s: %w", i, node, err)
		}
		n.gpus = append(n.gpus, g)
	}
	return n, nil
}

// visible resolves NVIDIA_VISIBLE_DEVICES as the NVIDIA container runtime
// does: UUIDs or indexes separated by commas, "all", or "none"/"void"/""
// for no GPU. It returns the node indexes of the GPUs, in that order.
func (n *nodeGPUs) visible(v string) ([]int, error) {
	v = strings.TrimSpace(v)
	switch v {
	case "", "none", "void":
		return nil, nil
	case "all":
		out := make([]int, len(n.gpus))
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	var out []int
	seen := map[int]bool{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		idx := -1
		if i, err := strconv.Atoi(part); err == nil && i >= 0 && i < len(n.gpus) {
			idx = i
		}
		for i, g := range n.gpus {
			if strings.EqualFold(g.UUID, part) {
				idx = i
			}
		}
		if idx < 0 {
			return nil, fmt.Errorf("%s=%q: this node has no GPU %q (its GPUs: 0 to %d, or their UUIDs)", api.EnvVisibleDevices, v, part, len(n.gpus)-1)
		}
		if seen[idx] {
			return nil, fmt.Errorf("%s=%q names GPU %q twice", api.EnvVisibleDevices, v, part)
		}
		seen[idx] = true
		out = append(out, idx)
	}
	if len(out) > 16 {
		return nil, fmt.Errorf("%s=%q: %d GPUs, the driver shows at most 16", api.EnvVisibleDevices, v, len(out))
	}
	return out, nil
}

// libDir is the directory of the host's libraries in which the dynamic
// loader looks without configuration: where the driver's libraries go.
func libDir() string {
	dirs := []string{"/usr/lib64", "/usr/lib"}
	if t, ok := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]; ok {
		dirs = append([]string{"/usr/lib/" + t}, dirs...)
	}
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d
		}
	}
	return "/usr/lib"
}

// labContainer adds to each container what the lab's image and GPU
// runtime would: the lab's tools, and for a container given GPUs
// (NVIDIA_VISIBLE_DEVICES, as the NVIDIA container runtime reads it) the
// fake driver's libraries, nvidia-smi and those GPUs' state files.
func labContainer(tools Tools, gpus *nodeGPUs) func(*hollowkubelet.Container, *cinit.Spec) error {
	lib := libDir()
	return func(c *hollowkubelet.Container, s *cinit.Spec) error {
		s.Mounts = append(s.Mounts, cinit.Mount{Source: tools.Bin(), Target: containerTools, ReadOnly: true})
		idx, err := gpus.visible(c.Env[api.EnvVisibleDevices])
		if err != nil || len(idx) == 0 {
			return err
		}
		s.Mounts = append(s.Mounts,
			cinit.Mount{Source: filepath.Join(tools.Lib(), "libcuda.so.1"), Target: lib + "/libcuda.so.1", ReadOnly: true},
			cinit.Mount{Source: filepath.Join(tools.Lib(), "libnvidia-ml.so.1"), Target: lib + "/libnvidia-ml.so.1", ReadOnly: true},
			cinit.Mount{Source: filepath.Join(tools.Bin(), "nvidia-smi"), Target: "/usr/bin/nvidia-smi", ReadOnly: true},
			cinit.Mount{Source: gpus.files.Socket(), Target: containerGPUs + "/" + fakegpu.DriverSocket},
		)
		for k, i := range idx {
			g := gpus.gpus[i]
			s.Mounts = append(s.Mounts, cinit.Mount{Source: gpus.files.File(g.UUID), Target: fmt.Sprintf("%s/%d", containerGPUs, k)})
			c.GPUs = append(c.GPUs, hollowkubelet.GPU{UUID: g.UUID, Index: i})
		}
		return nil
	}
}
