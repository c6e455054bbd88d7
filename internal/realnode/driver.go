package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
)

// DriverVersion is the version the fake driver reports (fakegpu's
// FAKE_DRIVER_VERSION): its libraries are installed under this suffix, as
// NVIDIA's are.
const DriverVersion = "550.163.01"

// The character device majors of NVIDIA's device nodes: 195 for the GPUs
// and nvidiactl (fixed, as the kernel module registers them).
const (
	nvidiaMajor = 195
	ctlMinor    = 255
)

// GPU is one GPU of the fake driver.
type GPU struct {
	UUID  string
	Model string // as NVML names it: "NVIDIA A100-SXM4-40GB"
	// MemoryMiB is its memory; SMs its multiprocessors.
	MemoryMiB uint64
	SMs       uint32
}

// A100s are count A100 40GB GPUs whose UUIDs derive from seed.
func A100s(count int, seed string) []GPU {
	out := make([]GPU, count)
	for i := range out {
		out[i] = GPU{
			UUID:  "GPU-" + uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "tessera-e2e/%s/%d", seed, i)).String(),
			Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, SMs: 108,
		}
	}
	return out
}

// Driver is the fake NVIDIA driver installed under a driver root the way
// NVIDIA's driver container lays one out (/run/nvidia/driver with the GPU
// Operator): the libraries under usr/lib/<triplet> with their version
// suffix and SONAME links, nvidia-smi in usr/bin, the device nodes in dev
// (made with mknod), and what stands for the kernel module: a state file
// per GPU and the driver socket in run/fakegpu (fakegpu/src/fake_common.h).
type Driver struct {
	Root string
	GPUs []GPU
	// uvmMajor is the major of nvidia-uvm, which the kernel assigns
	// dynamically (a free one of this machine's).
	uvmMajor uint32
}

func (d *Driver) path(p ...string) string { return filepath.Join(append([]string{d.Root}, p...)...) }

// LibDir is the libraries' directory relative to the root.
func LibDir() string {
	if runtime.GOARCH == "arm64" {
		return "usr/lib/aarch64-linux-gnu"
	}
	return "usr/lib/x86_64-linux-gnu"
}

// StateDir is where the fake driver keeps its GPUs' state and socket,
// relative to the driver root (and where a container gets it mounted).
const StateDir = "run/fakegpu"

// driverLibs are the libraries, by SONAME.
var driverLibs = []string{"libcuda.so.1", "libnvidia-ml.so.1"}

// InstallDriver installs the fake driver from the lab's tools (make
// lab-tools) under root.
func InstallDriver(root string, t tools.Dir, gpus []GPU) (*Driver, error) {
	d := &Driver{Root: root, GPUs: gpus}
	for _, p := range []string{LibDir(), "usr/bin", "dev", StateDir} {
		if err := os.MkdirAll(d.path(p), 0o755); err != nil {
			return nil, err
		}
	}
	for _, soname := range driverLibs {
		file := strings.TrimSuffix(soname, ".1") + "." + DriverVersion
		if err := copyFile(filepath.Join(t.Lib(), soname), d.path(LibDir(), file), 0o755); err != nil {
			return nil, err
		}
		for link, target := range map[string]string{soname: file, strings.TrimSuffix(soname, ".1"): soname} {
			_ = os.Remove(d.path(LibDir(), link))
			if err := os.Symlink(target, d.path(LibDir(), link)); err != nil {
				return nil, err
			}
		}
	}
	if err := copyFile(filepath.Join(t.Bin(), "nvidia-smi"), d.path("usr/bin/nvidia-smi"), 0o755); err != nil {
		return nil, err
	}
	major, err := freeCharMajor()
	if err != nil {
		return nil, err
	}
	d.uvmMajor = major
	nodes := map[string]uint64{
		"nvidiactl":        unix.Mkdev(nvidiaMajor, ctlMinor),
		"nvidia-uvm":       unix.Mkdev(major, 0),
		"nvidia-uvm-tools": unix.Mkdev(major, 1),
		"nvidia-modeset":   unix.Mkdev(nvidiaMajor, 254),
	}
	for i := range gpus {
		nodes[fmt.Sprintf("nvidia%d", i)] = unix.Mkdev(nvidiaMajor, uint32(i))
	}
	for name, dev := range nodes {
		p := d.path("dev", name)
		_ = os.Remove(p)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(dev)); err != nil {
			return nil, fmt.Errorf("mknod %s: %w", p, err)
		}
	}
	for i, g := range gpus {
		if err := fakegpu.Create(d.path(StateDir, fmt.Sprintf("nvidia%d", i)), fakegpu.GPU{UUID: g.UUID, Name: g.Model, MemoryBytes: g.MemoryMiB << 20, SMs: g.SMs}); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Serve answers the driver socket (a process's host pid, as the kernel
// module knows it) until ctx ends.
func (d *Driver) Serve(ctx context.Context) error {
	n := &fakegpu.Node{Dir: d.path(StateDir)}
	l, err := n.ListenDriver()
	if err != nil {
		return err
	}
	go func() { _ = fakegpu.ServeDriver(ctx, l) }()
	return nil
}

// StateFile is GPU i's state file.
func (d *Driver) StateFile(i int) string { return d.path(StateDir, fmt.Sprintf("nvidia%d", i)) }

// UsedBytes is the device memory GPU i's processes hold now.
func (d *Driver) UsedBytes(i int) (uint64, error) { return fakegpu.UsedBytes(d.StateFile(i)) }

// CDISpec is the CDI spec of the GPUs as `nvidia-ctk cdi generate
// --driver-root=ROOT --dev-root=ROOT --device-name-strategy=uuid` writes
// one (kind nvidia.com/gpu, a device per GPU named by UUID and one named
// all; device nodes, the driver's libraries and nvidia-smi mounted
// read-only from the driver root), with two differences: no hooks (they
// are nvidia-ctk's own program: the library SONAME links that its
// create-symlinks and update-ldcache hooks would make are mounted
// instead), and the fake driver's state directory mounted as a real
// spec mounts the persistenced socket.
func (d *Driver) CDISpec() *cdispec.Spec {
	ro := []string{"ro", "nosuid", "nodev", "bind"}
	node := func(name string) *cdispec.DeviceNode {
		return &cdispec.DeviceNode{Path: "/dev/" + name, HostPath: d.path("dev", name)}
	}
	spec := &cdispec.Spec{Kind: "nvidia.com/gpu"}
	var all []*cdispec.DeviceNode
	for i, g := range d.GPUs {
		n := node(fmt.Sprintf("nvidia%d", i))
		all = append(all, n)
		spec.Devices = append(spec.Devices, cdispec.Device{Name: g.UUID, ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{n}}})
	}
	spec.Devices = append(spec.Devices, cdispec.Device{Name: "all", ContainerEdits: cdispec.ContainerEdits{DeviceNodes: all}})
	edits := cdispec.ContainerEdits{
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []*cdispec.DeviceNode{node("nvidiactl"), node("nvidia-uvm"), node("nvidia-uvm-tools"), node("nvidia-modeset")},
	}
	for _, soname := range driverLibs {
		file := strings.TrimSuffix(soname, ".1") + "." + DriverVersion
		for _, name := range []string{file, soname} {
			edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: d.path(LibDir(), file), ContainerPath: "/" + LibDir() + "/" + name, Options: ro})
		}
	}
	edits.Mounts = append(edits.Mounts,
		&cdispec.Mount{HostPath: d.path("usr/bin/nvidia-smi"), ContainerPath: "/usr/bin/nvidia-smi", Options: ro},
		&cdispec.Mount{HostPath: d.path(StateDir), ContainerPath: "/" + StateDir, Options: []string{"rw", "nosuid", "nodev", "bind"}},
	)
	spec.ContainerEdits = edits
	return spec
}

// WriteCDISpec writes the GPUs' CDI spec to path (in a directory the
// runtime reads: /var/run/cdi/nvidia.yaml) and reads it back with the CDI
// library, as the runtime will.
func (d *Driver) WriteCDISpec(path string) error {
	spec := d.CDISpec()
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return err
	}
	spec.Version = v
	b, err := yaml.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	if _, err := cdiapi.ReadSpec(path, 0); err != nil {
		return fmt.Errorf("the CDI spec of the fake driver: %w", err)
	}
	return nil
}

// freeCharMajor is a character device major no driver of this machine
// holds (/proc/devices), from the range Linux leaves to local use.
func freeCharMajor() (uint32, error) {
	b, err := os.ReadFile("/proc/devices")
	if err != nil {
		return 0, err
	}
	used := map[uint64]bool{}
	block := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Block devices") {
			block = true
		}
		f := strings.Fields(line)
		if block || len(f) != 2 {
			continue
		}
		if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
			used[n] = true
		}
	}
	for m := uint64(240); m <= 254; m++ {
		if !used[m] {
			return uint32(m), nil
		}
	}
	return 0, fmt.Errorf("no free character device major in 240-254 (/proc/devices) for nvidia-uvm")
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
