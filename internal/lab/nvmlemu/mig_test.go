package nvmlemu

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/mig"
)

// TestMIGProfilesMatchDocumentation asks every mock model, through NVML,
// for its GPU-instance profiles and their placements, and compares them
// with internal/mig's tables (themselves checked against NVIDIA's
// documented lines). go-nvml's own mocks differ, e.g. A100 2g.10gb
// placements and H100 SM counts; spot checks of those are below.
func TestMIGProfilesMatchDocumentation(t *testing.T) {
	for _, name := range []string{"A100-40GB", "A100-80GB", "A30-24GB", "H100-80GB", "H200-141GB"} {
		n, err := NewModel(name, 1, "mig")
		if err != nil {
			t.Fatal(err)
		}
		d := n.Device(0)
		m, ok := mig.ModelByName(name)
		if !ok {
			t.Fatalf("no geometry for %s", name)
		}
		for _, p := range m.Profiles {
			info, ret := d.GetGpuInstanceProfileInfo(p.NVMLProfile)
			if ret != nvml.SUCCESS {
				t.Errorf("%s %s: GetGpuInstanceProfileInfo: %v", name, p.Name, ret)
				continue
			}
			got := fmt.Sprintf("id %d instances %d SMs %d MiB %d", info.Id, info.InstanceCount, info.MultiprocessorCount, info.MemorySizeMB)
			want := fmt.Sprintf("id %d instances %d SMs %d MiB %d", p.ID, p.MaxInstances, p.SMs, p.MemoryMiB)
			if got != want {
				t.Errorf("%s %s: %s, documented %s", name, p.Name, got, want)
			}
			pl, ret := d.GetGpuInstancePossiblePlacements(&info)
			var starts []string
			for _, x := range pl {
				starts = append(starts, fmt.Sprint(x.Start))
				if int(x.Size) != p.MemorySlices {
					t.Errorf("%s %s: placement size %d, want %d", name, p.Name, x.Size, p.MemorySlices)
				}
			}
			if ret != nvml.SUCCESS || strings.Join(starts, ",") != strings.Trim(strings.Join(strings.Fields(fmt.Sprint(p.Starts)), ","), "[]") {
				t.Errorf("%s %s: placements %v (%v), documented %v", name, p.Name, starts, ret, p.Starts)
			}
		}
	}
	// Where go-nvml's tables differ from NVIDIA's documentation.
	a100, _ := NewModel("A100-40GB", 1, "x")
	info, _ := a100.Device(0).GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	pl, _ := a100.Device(0).GetGpuInstancePossiblePlacements(&info)
	if len(pl) != 3 || pl[0].Start != 0 || pl[1].Start != 2 || pl[2].Start != 4 {
		t.Errorf("A100 2g.10gb placements %v, documented {0,2,4}:2", pl)
	}
	h100, _ := NewModel("H100-80GB", 1, "x")
	info, _ = h100.Device(0).GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if info.MultiprocessorCount != 16 {
		t.Errorf("H100 1g.10gb has %d SMs, documented 16", info.MultiprocessorCount)
	}
}

func create(t *testing.T, d nvml.Device, c, start int) (nvml.GpuInstance, nvml.Return) {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(c)
	if ret != nvml.SUCCESS {
		t.Fatalf("profile %d: %v", c, ret)
	}
	pl, _ := d.GetGpuInstancePossiblePlacements(&info)
	return d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: pl[0].Size})
}

// TestMIGLifecycle: MIG mode, creation within the placement rules, compute
// instances, MIG device handles and destruction, as NVML documents them.
func TestMIGLifecycle(t *testing.T) {
	n, err := NewModel("A100-40GB", 1, "life")
	if err != nil {
		t.Fatal(err)
	}
	d := n.Device(0)
	if _, ret := create(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("instance with MIG off: %v", ret)
	}
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if cur, _, _ := d.GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE {
		t.Fatal("MIG mode not on")
	}
	var gis []nvml.GpuInstance
	for s := range 7 {
		gi, ret := create(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, s)
		if ret != nvml.SUCCESS {
			t.Fatalf("1g@%d: %v", s, ret)
		}
		gis = append(gis, gi)
	}
	if _, ret := create(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 7); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("1g@7 (not a placement): %v", ret)
	}
	info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	if c, _ := d.GetGpuInstanceRemainingCapacity(&info); c != 0 {
		t.Errorf("3g capacity on a full GPU: %d", c)
	}
	// A compute instance makes a MIG device.
	ciInfo, ret := gis[0].GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ci, ret := gis[0].CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	md, ret := d.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	u, _ := md.GetUUID()
	mem, _ := md.GetMemoryInfo()
	attr, _ := md.GetAttributes()
	parent, _ := md.GetDeviceHandleFromMigDeviceHandle()
	if !strings.HasPrefix(u, "MIG-") || mem.Total>>20 != 4864 || attr.MultiprocessorCount != 14 || parent != nvml.Device(d) {
		t.Errorf("MIG device %s: %d MiB, %d SMs, parent %v", u, mem.Total>>20, attr.MultiprocessorCount, parent)
	}
	if _, ret := d.GetMigDeviceHandleByIndex(1); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("second MIG device without a compute instance: %v", ret)
	}
	// Busy and in-use rules.
	n.SetBusy(u, true)
	if ret := ci.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroying a busy compute instance: %v", ret)
	}
	if ret := gis[0].Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroying a GPU instance with a compute instance: %v", ret)
	}
	n.SetBusy(u, false)
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Errorf("MIG off with instances: %v", ret)
	}
	for _, gi := range gis[:4] {
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	if _, ret := create(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("3g@4 over 1g@4-6: %v", ret)
	}
	if _, ret := create(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0); ret != nvml.SUCCESS {
		t.Errorf("3g@0 after freeing slices 0-3: %v", ret)
	}
	if got := strings.Join(n.MIGInstances(0), " "); got != "1g.5gb@4 1g.5gb@5 1g.5gb@6 3g.20gb@0" {
		t.Errorf("instances %s", got)
	}
	// A mode change that needs a reset pends until one.
	m, _ := NewModel("H100-80GB", 1, "reset")
	m.SetResetRequired(true)
	if act, ret := m.Device(0).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.ERROR_RESET_REQUIRED {
		t.Errorf("pending enable: %v %v", act, ret)
	}
	if cur, pend, _ := m.Device(0).GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("current %d pending %d", cur, pend)
	}
	m.ResetGPU(0)
	if cur, _, _ := m.Device(0).GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE {
		t.Error("reset did not apply the pending mode")
	}
}
