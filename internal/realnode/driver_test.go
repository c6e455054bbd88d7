package realnode

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/internal/lab/tools"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
)

// labTools builds the fake driver (make lab-tools' fakegpu part) into a
// temporary directory.
func labTools(t *testing.T) tools.Dir {
	t.Helper()
	dir := t.TempDir()
	if err := testenv.Make("fakegpu", "B="+dir); err != nil {
		t.Fatal(err)
	}
	return tools.Dir(dir)
}

func TestInstalledDriver(t *testing.T) {
	need.Root(t, "the driver's device nodes are made with mknod")
	root := t.TempDir()
	gpus := A100s(3, "test")
	d, err := InstallDriver(root, labTools(t), gpus)
	if err != nil {
		t.Fatal(err)
	}
	smi := func() string {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "usr/bin/nvidia-smi"), "-L")
		// As a program in a container finds the driver's library: by its
		// SONAME, in the library directory.
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(root, LibDir()))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("nvidia-smi -L: %v\n%s", err, out)
		}
		return string(out)
	}
	out := smi()
	for _, g := range gpus {
		if !strings.Contains(out, g.UUID) || !strings.Contains(out, g.Model) {
			t.Fatalf("the installed nvidia-smi does not list %s (%s):\n%s", g.UUID, g.Model, out)
		}
	}

	// What the node agent does: NVML loaded from the driver root.
	lib, err := discovery.Open(filepath.Join(root, LibDir(), "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	res, err := discovery.Discover(lib, discovery.Options{SysfsRoot: t.TempDir()})
	if err != nil || len(res.Devices) != len(gpus) || len(res.Skipped) > 0 {
		t.Fatalf("discovery over the installed driver: %v, %d GPUs, skipped %v", err, len(res.Devices), res.Skipped)
	}
	for i, dev := range res.Devices {
		g := dev.GPU
		if g.UUID != gpus[i].UUID || g.Model != gpus[i].Model || g.MemoryMiB != int64(gpus[i].MemoryMiB) || g.ComputeCapability != "8.0" || g.PCIBusID == "" {
			t.Errorf("GPU %d: discovered %+v, want %+v with compute capability 8.0 and a PCI bus id", i, g, gpus[i])
		}
	}
	if v, ret := lib.SystemGetDriverVersion(); ret != nvml.SUCCESS || v != DriverVersion {
		t.Errorf("driver version %q (%v), want %q (the installed files' suffix)", v, ret, DriverVersion)
	}
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	if ret := res.Devices[0].Handle.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatalf("RegisterEvents: %v", ret)
	}
	start := time.Now()
	if _, ret := set.Wait(200); ret != nvml.ERROR_TIMEOUT || time.Since(start) < 150*time.Millisecond {
		t.Errorf("an event wait: %v after %v, want a timeout after 200 ms", ret, time.Since(start))
	}
	set.Free()

	// A container sees the GPUs whose device nodes its runtime made.
	if err := os.Remove(filepath.Join(root, "dev", "nvidia1")); err != nil {
		t.Fatal(err)
	}
	out = smi()
	if strings.Contains(out, gpus[1].UUID) || !strings.Contains(out, gpus[0].UUID) || !strings.Contains(out, gpus[2].UUID) {
		t.Fatalf("without /dev/nvidia1, nvidia-smi should list GPUs 0 and 2 only:\n%s", out)
	}

	// The CDI spec, as the runtime reads it.
	path := filepath.Join(root, "cdi", "nvidia.yaml")
	if err := d.WriteCDISpec(path); err != nil {
		t.Fatal(err)
	}
	spec, err := cdiapi.ReadSpec(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{gpus[0].UUID, gpus[2].UUID, "all"} {
		if spec.GetDevice(name) == nil {
			t.Errorf("the CDI spec has no device %s", name)
		}
	}
	if got := spec.GetVendor() + "/" + spec.GetClass(); got != "nvidia.com/gpu" {
		t.Errorf("CDI kind %s, want nvidia.com/gpu", got)
	}
}
