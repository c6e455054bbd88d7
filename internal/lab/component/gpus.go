package component

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet/cinit"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/nvmlemu"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// containerGPUs is where a GPU container finds its GPUs: the state file of
// each (0, 1, … in the order of NVIDIA_VISIBLE_DEVICES) and the driver
// socket; the fake driver reads them from there (fakegpu/src/fake_common.h).
const containerGPUs = "/run/tessera-fakegpu"

// nodeGPUs is an emulated node's GPUs: the emulated NVML's devices and their
// state files.
type nodeGPUs struct {
	files *fakegpu.Node
	gpus  []fakegpu.GPU // by NVML index
	// mig finds a MIG device of the node (NVIDIA_VISIBLE_DEVICES names it
	// by its UUID, "MIG-…"): its parent's UUID and what it is. Nil: the
	// node has none.
	mig func(uuid string) (parent string, dev fakegpu.GPU, err error)
}

// visibleGPU is a GPU, or a MIG device, a container is given; index is
// the node's index of the GPU (of the MIG device's parent).
type visibleGPU struct {
	fakegpu.GPU
	index int
}

// CreateGPUs creates the state file of each GPU of the node in its
// directory, before the node's agent reads them (its runtime does too).
func CreateGPUs(dir labdir.NodeDir, node, model string, count int, partitioning bool) error {
	_, err := newGPUs(dir, node, model, count, partitioning)
	return err
}

// newGPUs creates the state file of each GPU of the node in its directory
// (kept when it is already there for that GPU); partitioning: their
// driver partitions memory per cgroup.
func newGPUs(dir labdir.NodeDir, node, model string, count int, partitioning bool) (*nodeGPUs, error) {
	lib, err := nvmlemu.NewModel(model, count, node)
	if err != nil {
		return nil, err
	}
	n := &nodeGPUs{files: &fakegpu.Node{Dir: dir.GPUs()}}
	for i := range lib.Devices {
		d := lib.Device(i)
		name, _ := d.GetName()
		name = strings.TrimPrefix(name, "Mock ") // go-nvml's A100-SXM4-40GB is named so
		g := fakegpu.GPU{UUID: d.UUID, Name: name, MemoryBytes: d.MemoryInfo.Total, Partitioning: partitioning}
		if err := fakegpu.Create(n.files.File(g.UUID), g); err != nil {
			return nil, fmt.Errorf("GPU %d of %s: %w", i, node, err)
		}
		n.gpus = append(n.gpus, g)
	}
	return n, nil
}

// visible resolves NVIDIA_VISIBLE_DEVICES as the NVIDIA container runtime
// does: UUIDs (of GPUs or MIG devices) or indexes separated by commas,
// "all", or "none"/"void"/"" for no GPU. It returns the GPUs in that
// order; a MIG device is a GPU of its own (its own state file, created
// here the first time a container is given it), as MIG isolates its
// memory and SMs.
func (n *nodeGPUs) visible(v string) ([]visibleGPU, error) {
	v = strings.TrimSpace(v)
	switch v {
	case "", "none", "void":
		return nil, nil
	case "all":
		out := make([]visibleGPU, len(n.gpus))
		for i, g := range n.gpus {
			out[i] = visibleGPU{g, i}
		}
		return out, nil
	}
	var out []visibleGPU
	seen := map[string]bool{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		var g *visibleGPU
		if i, err := strconv.Atoi(part); err == nil && i >= 0 && i < len(n.gpus) {
			g = &visibleGPU{n.gpus[i], i}
		}
		for i := range n.gpus {
			if strings.EqualFold(n.gpus[i].UUID, part) {
				g = &visibleGPU{n.gpus[i], i}
			}
		}
		if g == nil && strings.HasPrefix(part, "MIG-") && n.mig != nil {
			m, err := n.migDevice(part)
			if err != nil {
				return nil, fmt.Errorf("%s=%q: %w", api.EnvVisibleDevices, v, err)
			}
			g = m
		}
		if g == nil {
			return nil, fmt.Errorf("%s=%q: this node has no GPU %q (its GPUs: 0 to %d, their UUIDs, or its MIG devices' UUIDs)", api.EnvVisibleDevices, v, part, len(n.gpus)-1)
		}
		if seen[g.UUID] {
			return nil, fmt.Errorf("%s=%q names GPU %q twice", api.EnvVisibleDevices, v, part)
		}
		seen[g.UUID] = true
		out = append(out, *g)
	}
	if len(out) > 16 {
		return nil, fmt.Errorf("%s=%q: %d GPUs, the driver shows at most 16", api.EnvVisibleDevices, v, len(out))
	}
	return out, nil
}

// migDevice finds a MIG device and creates its state file.
func (n *nodeGPUs) migDevice(uuid string) (*visibleGPU, error) {
	parent, dev, err := n.mig(uuid)
	if err != nil {
		return nil, err
	}
	for i, g := range n.gpus {
		if g.UUID == parent {
			if err := fakegpu.Create(n.files.File(dev.UUID), dev); err != nil {
				return nil, fmt.Errorf("MIG device %s: %w", uuid, err)
			}
			return &visibleGPU{dev, i}, nil
		}
	}
	return nil, fmt.Errorf("MIG device %s: its parent GPU %s is not one of this node's", uuid, parent)
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
func labContainer(t tools.Dir, gpus *nodeGPUs) func(*hollowkubelet.Container, *cinit.Spec) error {
	lib := libDir()
	return func(c *hollowkubelet.Container, s *cinit.Spec) error {
		s.Mounts = append(s.Mounts, cinit.Mount{Source: t.Bin(), Target: containerTools, ReadOnly: true})
		vis, err := gpus.visible(c.Env[api.EnvVisibleDevices])
		if err != nil || len(vis) == 0 {
			return err
		}
		s.Mounts = append(s.Mounts,
			cinit.Mount{Source: filepath.Join(t.Lib(), "libcuda.so.1"), Target: lib + "/libcuda.so.1", ReadOnly: true},
			cinit.Mount{Source: filepath.Join(t.Lib(), "libnvidia-ml.so.1"), Target: lib + "/libnvidia-ml.so.1", ReadOnly: true},
			cinit.Mount{Source: filepath.Join(t.Bin(), "nvidia-smi"), Target: "/usr/bin/nvidia-smi", ReadOnly: true},
			cinit.Mount{Source: gpus.files.Socket(), Target: containerGPUs + "/" + fakegpu.DriverSocket},
		)
		for k, g := range vis {
			s.Mounts = append(s.Mounts, cinit.Mount{Source: gpus.files.File(g.UUID), Target: fmt.Sprintf("%s/%d", containerGPUs, k)})
			c.GPUs = append(c.GPUs, hollowkubelet.GPU{UUID: g.UUID, Index: g.index})
		}
		return nil
	}
}

// migFromInventory finds a MIG device in the node's inventory, or in its
// agent's list of MIG devices (dir; a volcano node publishes no
// inventory). The node agent publishes a dynamic instance just after
// making it, so a device not there yet is waited for, up to wait.
func migFromInventory(client kubernetes.Interface, node string, dir labdir.NodeDir, wait time.Duration) func(string) (string, fakegpu.GPU, error) {
	return func(uuid string) (string, fakegpu.GPU, error) {
		var parent string
		var dev fakegpu.GPU
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		lastErr := fmt.Errorf("not in node %s's inventory", node)
		err := poll.Until(ctx, wait, func(ctx context.Context) (bool, error) {
			n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				lastErr = err
				return false, nil
			}
			inv, err := api.DecodeInventory([]byte(n.Annotations[api.AnnotationInventory]))
			if err != nil {
				lastErr = fmt.Errorf("node %s's inventory: %w", node, err)
				inv = &api.NodeInventory{}
			}
			for _, g := range inv.GPUs {
				for _, d := range g.MIG.Devices {
					if strings.EqualFold(d.UUID, uuid) {
						parent, dev = g.UUID, migGPU(g.Model, d)
						return true, nil
					}
				}
			}
			// A volcano node publishes no inventory: its agent's list.
			var devs map[string]LabMIGDevice
			if b, err := os.ReadFile(dir.MIGDevices()); err == nil && json.Unmarshal(b, &devs) == nil {
				for u, d := range devs {
					if strings.EqualFold(u, uuid) {
						parent, dev = d.Parent, migGPU(d.Model, d.MIGDevice)
						return true, nil
					}
				}
			}
			return false, nil
		})
		if err != nil {
			return "", fakegpu.GPU{}, fmt.Errorf("MIG device %s: %v", uuid, lastErr)
		}
		return parent, dev, nil
	}
}

// migGPU is a MIG device of a GPU of the NVML model as a fake GPU.
func migGPU(model string, d api.MIGDevice) fakegpu.GPU {
	return fakegpu.GPU{UUID: d.UUID, Name: strings.TrimPrefix(model, "Mock ") + " MIG " + d.Profile, MemoryBytes: uint64(d.MemoryMiB) << 20, SMs: uint32(d.SMCount)}
}
