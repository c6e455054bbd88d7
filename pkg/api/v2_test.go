package api

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
)

const (
	inventoryV2Golden  = "testdata/inventory-v2.golden.json"
	allocationV2Golden = "testdata/allocation-v2.golden.json"
)

// goldenInventoryV2 is a node using what tessera.io/v2 added: a static MIG
// layout on GPU 0, dynamic MIG on GPU 1 (one instance held), MPS on GPU 2.
func goldenInventoryV2() *NodeInventory {
	inv := &NodeInventory{
		APIVersion: InventoryAPIVersionV2, Kind: InventoryKind, MemoryOvercommit: 1,
		Mode: ModeDevicePlugin, MIGStrategy: MIGStrategyMixed,
	}
	for i := range 3 {
		inv.GPUs = append(inv.GPUs, GPU{
			UUID: testUUID(i), Index: i, Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, SMCount: 108,
			ComputeCapability: "8.0", NUMANode: 0, MIG: MIG{Capable: true}, Health: Healthy, MaxShares: 1,
		})
	}
	g := &inv.GPUs[0]
	g.Sharing, g.MIG.Enabled = SharingMIG, true
	g.MIG.Devices = []MIGDevice{
		{UUID: "MIG-5eed0000-0000-4000-8000-000000000003", Profile: "3g.20gb", Start: 4, MemoryMiB: 19968, SMCount: 42, Health: Healthy},
		{UUID: "MIG-5eed0000-0000-4000-8000-000000000000", Profile: "2g.10gb", Start: 0, MemoryMiB: 9856, SMCount: 28, Health: Unhealthy, HealthReason: "XID 79 on the parent GPU"},
	}
	g = &inv.GPUs[1]
	g.Sharing, g.MIG.Enabled = SharingMIGDynamic, true
	g.MIG.Devices = []MIGDevice{{UUID: "MIG-5eed0001-0000-4000-8000-000000000006", Profile: "1g.5gb", Start: 6, MemoryMiB: 4864, SMCount: 14, Health: Healthy}}
	g.MIG.ProfileMemoryMiB = map[string]int64{"1g.5gb": 4864, "2g.10gb": 9856, "3g.20gb": 19968, "7g.40gb": 40192}
	g = &inv.GPUs[2]
	g.Sharing, g.MaxShares = SharingMPS, 10
	return inv
}

// goldenAllocationV2 is a signed record with a share, a static MIG device
// and a dynamic MIG instance.
func goldenAllocationV2() *PodAllocation {
	return &PodAllocation{
		APIVersion: AllocationAPIVersionV2, Kind: AllocationKind, Node: "gpu-node-01",
		PodUID: "6f1d0c2e-3b7a-4c55-9a0e-2f8b1d7c9e01",
		Containers: []ContainerAllocation{
			{Name: "server", Devices: []DeviceGrant{
				{UUID: testUUID(2), MemoryMiB: 4096, Cores: 20},
				{UUID: testUUID(0), MemoryMiB: 19968, Cores: 38, MIG: &MIGGrant{Profile: "3g.20gb", Start: 4, Device: "MIG-5eed0000-0000-4000-8000-000000000003"}},
			}},
			{Name: "batch", Devices: []DeviceGrant{
				{UUID: testUUID(1), MemoryMiB: 4864, Cores: 12, MIG: &MIGGrant{Profile: "1g.5gb", Start: 6}},
			}},
		},
		Signature: "ed25519:k1:bm90LWEtcmVhbC1zaWduYXR1cmU=",
	}
}

func TestGoldenV2(t *testing.T) {
	checkGoldenVersion(t, "v2", goldenInventoryV2(), inventoryV2Golden, goldenAllocationV2(), allocationV2Golden)
}

// checkGoldenVersion checks one wire version's golden inventory and
// record: each encodes to its golden file, round-trips, and decodes back
// to what was encoded.
func checkGoldenVersion(t *testing.T, version string, inv *NodeInventory, invPath string, a *PodAllocation, allocPath string) {
	t.Helper()
	data, err := EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, invPath, data)
	assertInventoryRoundTrip(t, inv)
	if got, err := DecodeInventory(data); err != nil || !reflect.DeepEqual(got, inv) {
		t.Errorf("decoded %s golden inventory differs (%v):\n got %+v\nwant %+v", version, err, got, inv)
	}
	data, err = EncodeAllocation(a)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, allocPath, data)
	assertAllocationRoundTrip(t, a)
	if got, err := DecodeAllocation(data); err != nil || !reflect.DeepEqual(got, a) {
		t.Errorf("decoded %s golden allocation differs (%v):\n got %+v\nwant %+v", version, err, got, a)
	}
}

// TestEncoderWritesLowestVersion: what v1 can express is written as v1,
// so components of the previous release keep reading it; a v2 field makes
// the whole document v2. The version a caller set does not matter.
func TestEncoderWritesLowestVersion(t *testing.T) {
	inv := goldenInventory()
	inv.APIVersion = InventoryAPIVersion
	data, err := EncodeInventory(inv)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v1",`)) {
		t.Errorf("v1-expressible inventory written as %.40s (%v)", data, err)
	}
	inv.GPUs[3].Sharing, inv.GPUs[3].MaxShares = SharingMPS, 4
	data, err = EncodeInventory(inv)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v2",`)) {
		t.Errorf("inventory with an MPS GPU written as %.40s (%v)", data, err)
	}
	a := goldenAllocation()
	data, err = EncodeAllocation(a)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v1",`)) {
		t.Errorf("v1-expressible record written as %.40s (%v)", data, err)
	}
	a.APIVersion = AllocationAPIVersionV1
	a.PodUID = "uid-1"
	data, err = EncodeAllocation(a)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v2",`)) {
		t.Errorf("record with a pod UID written as %.40s (%v)", data, err)
	}
}

// TestV1RefusesV2Fields: a document that says v1 but uses a v2 field was
// not written by any release; it is refused with the field's name.
func TestV1RefusesV2Fields(t *testing.T) {
	v2inv, err := os.ReadFile(inventoryV2Golden)
	if err != nil {
		t.Fatal(err)
	}
	v2rec, err := os.ReadFile(allocationV2Golden)
	if err != nil {
		t.Fatal(err)
	}
	asV1 := func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"tessera.io/v2"`), []byte(`"tessera.io/v1"`), 1)
	}
	if _, err := DecodeInventory(asV1(v2inv)); err == nil || err.Error() != `decoding GPU inventory: mode is not part of tessera.io/v1 (it needs tessera.io/v2)` {
		t.Errorf("v1 inventory with v2 fields: %v", err)
	}
	if _, err := DecodeAllocation(asV1(v2rec)); err == nil || err.Error() != `decoding GPU allocation: podUID is not part of tessera.io/v1 (it needs tessera.io/v2)` {
		t.Errorf("v1 record with v2 fields: %v", err)
	}
	mig := `{"apiVersion":"tessera.io/v1","kind":"PodGPUAllocation","node":"n","containers":[{"name":"c","devices":[{"uuid":"GPU-a","memoryMiB":1,"cores":0,"mig":{"profile":"1g.5gb","start":0}}]}]}`
	if _, err := DecodeAllocation([]byte(mig)); err == nil || !strings.Contains(err.Error(), "containers[0].devices[0].mig is not part of tessera.io/v1") {
		t.Errorf("v1 record with a MIG grant: %v", err)
	}
}

func TestSigningBytes(t *testing.T) {
	a := goldenAllocationV2()
	base, err := SigningBytes(a)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(base, []byte("signature")) {
		t.Errorf("signing bytes contain the signature: %s", base)
	}
	if a.Signature == "" {
		t.Error("SigningBytes cleared the caller's signature")
	}
	other := goldenAllocationV2()
	other.Signature = "ed25519:k2:b3RoZXI="
	if b, _ := SigningBytes(other); !bytes.Equal(b, base) {
		t.Error("signing bytes depend on the signature")
	}
	for name, mutate := range map[string]func(*PodAllocation){
		"pod uid":   func(a *PodAllocation) { a.PodUID = "another-pod" },
		"node":      func(a *PodAllocation) { a.Node = "gpu-node-02" },
		"memory":    func(a *PodAllocation) { a.Containers[0].Devices[0].MemoryMiB++ },
		"cores":     func(a *PodAllocation) { a.Containers[0].Devices[0].Cores = 100 },
		"mig start": func(a *PodAllocation) { a.Containers[1].Devices[0].MIG.Start = 5 },
		"container": func(a *PodAllocation) { a.Containers[1].Name = "batch2" },
	} {
		m := goldenAllocationV2()
		mutate(m)
		if b, err := SigningBytes(m); err == nil && bytes.Equal(b, base) {
			t.Errorf("%s changed, signing bytes did not", name)
		}
	}
}

func TestValidateV2Errors(t *testing.T) {
	const g0 = "gpus[0] (GPU-5eed0000-7c1d-4e2a-9b3f-a10000000000)"
	inventoryCases := []struct {
		name   string
		mutate func(*NodeInventory)
		want   string
	}{
		{"mode", func(inv *NodeInventory) { inv.Mode = "cdi" }, `mode "cdi" is not one of "device-plugin" or "dra"`},
		{"strategy", func(inv *NodeInventory) { inv.MIGStrategy = "both" }, `migStrategy "both" is not one of "none", "single" or "mixed"`},
		{"mig sharing without mig", func(inv *NodeInventory) { inv.GPUs[0].MIG.Enabled = false }, g0 + `: sharing "mig" on a GPU whose MIG mode is not enabled`},
		{"devices without mig", func(inv *NodeInventory) {
			inv.GPUs[0].Sharing, inv.GPUs[0].MIG.Enabled = SharingShared, false
		}, g0 + `: mig.devices or mig.profileMemoryMiB set but mig.enabled is not`},
		{"device profile", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].Profile = "1c.3g.20gb" }, "compute instance"},
		{"device start", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].Start = 8 }, "start 8 outside [0, 7]"},
		{"device memory", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].MemoryMiB = 40961 }, "memoryMiB 40961 outside [1, 40960] (the GPU's memory)"},
		{"device sms", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].SMCount = 109 }, "smCount 109 outside [0, 108]"},
		{"device health", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].Health = "" }, `health "" is not "Healthy" or "Unhealthy"`},
		{"device reason", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].HealthReason = "x" }, `healthReason "x" set on a Healthy MIG device`},
		{"device uuid dup", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[1].UUID = inv.GPUs[1].MIG.Devices[0].UUID }, "uuid duplicates"},
		{"device uuid = gpu", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].UUID = testUUID(2) }, "uuid duplicates gpus[2]"},
		{"device uuid empty", func(inv *NodeInventory) { inv.GPUs[0].MIG.Devices[0].UUID = "" }, "mig.devices[0]: uuid is empty"},
		{"too many devices", func(inv *NodeInventory) {
			g := &inv.GPUs[0]
			for len(g.MIG.Devices) <= MaxMIGDevicesPerGPU {
				d := g.MIG.Devices[0]
				d.UUID += "x"
				g.MIG.Devices = append(g.MIG.Devices, d)
			}
		}, "9 MIG devices exceed the limit of 8 per GPU"},
		{"profile memory", func(inv *NodeInventory) { inv.GPUs[1].MIG.ProfileMemoryMiB["2g.10gb"] = 0 }, "mig.profileMemoryMiB[2g.10gb]: 0 outside [1, 40960]"},
		{"profile name", func(inv *NodeInventory) { inv.GPUs[1].MIG.ProfileMemoryMiB["big"] = 1 }, `MIG profile "big" is not of the form`},
		{"mps clients", func(inv *NodeInventory) { inv.GPUs[2].MaxShares = 49 }, "maxShares 49 on an MPS GPU exceeds the 48 clients MPS allows"},
	}
	for _, tc := range inventoryCases {
		inv := goldenInventoryV2()
		tc.mutate(inv)
		err := ValidateInventory(inv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
	recordCases := []struct {
		name   string
		mutate func(*PodAllocation)
		want   string
	}{
		{"signature without uid", func(a *PodAllocation) { a.PodUID = "" }, "signature set on a record without podUID"},
		{"uid", func(a *PodAllocation) { a.PodUID = "a b" }, `podUID: uuid "a b" contains ' '`},
		{"signature space", func(a *PodAllocation) { a.Signature = "ed25519 x" }, "signature contains byte 0x20 at 7"},
		{"signature long", func(a *PodAllocation) { a.Signature = strings.Repeat("s", MaxSignatureLength+1) }, "signature is 513 bytes, more than 512"},
		{"mig exclusive", func(a *PodAllocation) {
			d := &a.Containers[1].Devices[0]
			d.Exclusive, d.Cores = true, 100
		}, "a MIG grant is not exclusive of the whole GPU"},
		{"mig profile", func(a *PodAllocation) { a.Containers[1].Devices[0].MIG.Profile = "1g" }, `mig: MIG profile "1g" is not of the form`},
		{"mig start", func(a *PodAllocation) { a.Containers[1].Devices[0].MIG.Start = -1 }, "mig.start -1 outside [0, 7]"},
		{"mig device", func(a *PodAllocation) { a.Containers[0].Devices[1].MIG.Device = "MIG,1" }, `mig.device: uuid "MIG,1" contains ','`},
	}
	for _, tc := range recordCases {
		a := goldenAllocationV2()
		tc.mutate(a)
		err := ValidateAllocation(a)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestParseMIGProfile(t *testing.T) {
	for name, want := range map[string][3]int{"1g.5gb": {1, 5, 0}, "7g.141gb": {7, 141, 0}, "1g.5gb+me": {1, 5, 1}, "2g.12gb+me": {2, 12, 1}} {
		c, m, media, err := ParseMIGProfile(name)
		if err != nil || c != want[0] || m != want[1] || media != (want[2] == 1) {
			t.Errorf("ParseMIGProfile(%q) = %d, %d, %v, %v", name, c, m, media, err)
		}
	}
	for name, want := range map[string]string{
		"1c.3g.20gb": `names a compute instance inside a GPU instance; Tessera creates one compute instance per GPU instance, so name the GPU-instance profile ("3g.20gb")`,
		"3g20gb":     "not of the form",
		"0g.5gb":     "not of the form",
		"9g.5gb":     "not of the form",
		"1g.05gb":    "not of the form",
		"1g.5gb+me+": "not of the form",
		"":           "not of the form",
		"+me":        "not of the form",
		"1g.5GB":     "not of the form",
		"-1g.5gb":    "not of the form",
	} {
		_, _, _, err := ParseMIGProfile(name)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseMIGProfile(%q) = %v, want an error with %q", name, err, want)
		}
	}
}

func TestMIGResourceNames(t *testing.T) {
	n := DefaultResourceNames
	if got := n.MIG("1g.5gb"); got != "nvidia.com/mig-1g.5gb" {
		t.Errorf("MIG resource %q", got)
	}
	for name, want := range map[string]string{
		"nvidia.com/mig-1g.5gb":    "1g.5gb",
		"nvidia.com/mig-3g.20gb":   "3g.20gb",
		"nvidia.com/mig-1g.5gb.me": "1g.5gb+me",
		"nvidia.com/mig-1g.5gb+me": "", // "+" is not allowed in a resource name
		"nvidia.com/mig-big":       "",
		"tessera.io/mig-1g.5gb":    "",
		"nvidia.com/gpu":           "",
		"nvidia.com/mig-":          "",
	} {
		got, ok := n.MIGProfileOf(name)
		if got != want || ok != (want != "") {
			t.Errorf("MIGProfileOf(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}
