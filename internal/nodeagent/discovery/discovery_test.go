package discovery

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestDiscoverDGXA100(t *testing.T) {
	n := nvmltest.DGXA100()
	n.Device(3).SetMigMode(nvml.DEVICE_MIG_ENABLE)
	res, err := Discover(n, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 8 || len(res.Skipped) != 0 {
		t.Fatalf("got %d devices, skipped %v", len(res.Devices), res.Skipped)
	}
	for i, d := range res.Devices {
		g := d.GPU
		if g.UUID != n.Device(i).UUID || g.Index != i {
			t.Errorf("gpu %d: uuid %s index %d", i, g.UUID, g.Index)
		}
		if g.Model != "Mock NVIDIA A100-SXM4-40GB" || g.MemoryMiB != 40960 || g.ComputeCapability != "8.0" {
			t.Errorf("gpu %d: %+v", i, g)
		}
		// The mock does not answer GetAttributes; the model table does.
		if g.SMCount != 108 {
			t.Errorf("gpu %d: smCount %d, want 108", i, g.SMCount)
		}
		if g.NUMANode != i/4 {
			t.Errorf("gpu %d: numa %d", i, g.NUMANode)
		}
		if want := NormalizeBusID(n.Device(i).PciBusID); g.PCIBusID != want {
			t.Errorf("gpu %d: bus %q want %q", i, g.PCIBusID, want)
		}
		if !g.MIG.Capable || g.MIG.Enabled != (i == 3) {
			t.Errorf("gpu %d: mig %+v", i, g.MIG)
		}
		if len(g.Links) != 7 {
			t.Fatalf("gpu %d: %d links", i, len(g.Links))
		}
		for _, l := range g.Links {
			if l.Type != api.LinkNVLink || l.NVLinks != 12 {
				t.Errorf("gpu %d: link %+v, want 12 NVLinks", i, l)
			}
		}
	}
	inv := &api.NodeInventory{MemoryOvercommit: 1}
	for _, d := range res.Devices {
		g := d.GPU
		g.Sharing, g.MaxShares = api.SharingShared, 10
		inv.GPUs = append(inv.GPUs, g)
	}
	if _, err := api.EncodeInventory(inv); err != nil {
		t.Fatalf("discovered inventory does not validate: %v", err)
	}
}

func TestDiscoverDGXH100(t *testing.T) {
	n := nvmltest.DGXH100()
	res, err := Discover(n, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 8 {
		t.Fatalf("got %d devices", len(res.Devices))
	}
	g := res.Devices[5].GPU
	if g.Model != "NVIDIA H100 80GB HBM3" || g.MemoryMiB != 81920 || g.ComputeCapability != "9.0" || g.SMCount != 132 {
		t.Errorf("%+v", g)
	}
	for _, l := range g.Links {
		if l.Type != api.LinkNVLink || l.NVLinks != 18 {
			t.Errorf("link %+v, want 18 NVLinks", l)
		}
	}
}

func TestPCIeTopology(t *testing.T) {
	n := nvmltest.PCIeA100()
	res, err := Discover(n, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]api.LinkType{1: api.LinkPCIeSingle, 2: api.LinkPCIeNUMA, 3: api.LinkPCIeNUMA, 4: api.LinkSystem, 7: api.LinkSystem}
	got := map[string]api.LinkType{}
	for _, l := range res.Devices[0].GPU.Links {
		got[l.PeerUUID] = l.Type
	}
	for j, typ := range want {
		if got[res.Devices[j].GPU.UUID] != typ {
			t.Errorf("link 0-%d: %q, want %q", j, got[res.Devices[j].GPU.UUID], typ)
		}
	}
}

func TestDirectNVLinkAndSysfsNUMA(t *testing.T) {
	n := nvmltest.Complete(nvmltest.DGXA100().Server, nvmltest.Wiring{GPUsPerNUMA: 4, NoNUMA: true})
	// GPUs 0 and 1 bridged by 4 direct links, nothing else.
	for i := 0; i < 2; i++ {
		dev, peer := n.Device(i), n.Device(1-i)
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l < 4 {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for k, c := range "0000:" + peer.PciBusID[9:] { // short domain, as some drivers write it
				p.BusId[k] = int8(c)
			}
			return p, nvml.SUCCESS
		}
	}
	root := t.TempDir()
	dir := filepath.Join(root, "bus", "pci", "devices", "0000:20:00.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Discover(n, Options{SysfsRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	l := res.Devices[0].GPU.Links[0]
	if l.PeerUUID != res.Devices[1].GPU.UUID || l.Type != api.LinkNVLink || l.NVLinks != 4 {
		t.Errorf("0-1 link %+v", l)
	}
	if res.Devices[0].GPU.Links[1].Type != api.LinkPCIeNUMA {
		t.Errorf("0-2 link %+v", res.Devices[0].GPU.Links[1])
	}
	if res.Devices[1].GPU.NUMANode != 1 || res.Devices[0].GPU.NUMANode != -1 {
		t.Errorf("numa from sysfs: gpu1 %d gpu0 %d", res.Devices[1].GPU.NUMANode, res.Devices[0].GPU.NUMANode)
	}
}

func TestLostGPUSkipped(t *testing.T) {
	n := nvmltest.DGXA100()
	n.Device(2).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	inner := n.DeviceGetHandleByIndexFunc
	n.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 6 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return inner(i)
	}
	res, err := Discover(n, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 6 || len(res.Skipped) != 2 {
		t.Fatalf("devices %d skipped %v", len(res.Devices), res.Skipped)
	}
	for _, d := range res.Devices {
		if len(d.GPU.Links) != 5 {
			t.Errorf("%s has %d links, want 5", d.GPU.UUID, len(d.GPU.Links))
		}
	}
}

func TestCountFailure(t *testing.T) {
	n := nvmltest.DGXA100()
	n.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }
	if _, err := Discover(n, Options{}); err == nil {
		t.Fatal("want error")
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"0000:07:00.0":      "00000000:07:00.0",
		"00000000:b7:00.0":  "00000000:B7:00.0",
		" 00000000:07:00.0": "00000000:07:00.0",
		"garbage":           "GARBAGE",
	} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
	if KnownSMCount("NVIDIA H100 PCIe") != 114 || KnownSMCount("NVIDIA A10") != 72 || KnownSMCount("NVIDIA A100-SXM4-80GB") != 108 || KnownSMCount("Tesla T4") != 40 || KnownSMCount("Foo") != 0 {
		t.Error("known SM table")
	}
}
