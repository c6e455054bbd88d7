package api

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const (
	inventoryGolden  = "testdata/inventory-v1.golden.json"
	allocationGolden = "testdata/allocation-v1.golden.json"
)

// checkGolden compares got with the golden file, or rewrites it with -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("encoding differs from %s (run go test -update if the change is intended)\ngot:  %s\nwant: %s", path, got, want)
	}
}

func TestInventoryGolden(t *testing.T) {
	want := goldenInventory()
	data, err := EncodeInventory(want)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, inventoryGolden, data)

	golden, err := os.ReadFile(inventoryGolden)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeInventory(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded golden inventory:\n got %+v\nwant %+v", got, want)
	}
}

func TestAllocationGolden(t *testing.T) {
	want := goldenAllocation()
	data, err := EncodeAllocation(want)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, allocationGolden, data)

	golden, err := os.ReadFile(allocationGolden)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeAllocation(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded golden allocation:\n got %+v\nwant %+v", got, want)
	}
}

func TestEncodeInventoryFillsDefaults(t *testing.T) {
	inv := &NodeInventory{}
	data, err := EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"apiVersion":"tessera.io/v1","kind":"NodeGPUInventory","memoryOvercommit":1,"gpus":[]}`
	if string(data) != want {
		t.Errorf("got %s, want %s", data, want)
	}
	if !reflect.DeepEqual(*inv, NodeInventory{}) {
		t.Errorf("EncodeInventory modified its argument: %+v", inv)
	}
	got, err := DecodeInventory(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.GPUs != nil {
		t.Errorf("empty GPU list decoded as %#v, want nil", got.GPUs)
	}
}

func TestEncodeAllocationFillsHeader(t *testing.T) {
	a := goldenAllocation()
	a.APIVersion, a.Kind = "", ""
	data, err := EncodeAllocation(a)
	if err != nil {
		t.Fatal(err)
	}
	if a.APIVersion != "" {
		t.Error("EncodeAllocation modified its argument")
	}
	if !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v1","kind":"PodGPUAllocation",`)) {
		t.Errorf("header not filled: %s", data)
	}
}

func TestDecodeNormalisesEmptyLists(t *testing.T) {
	inv, err := DecodeInventory([]byte(`{"apiVersion":"tessera.io/v1","kind":"NodeGPUInventory","memoryOvercommit":1,"gpus":[` +
		`{"uuid":"GPU-a","index":0,"model":"NVIDIA A10","memoryMiB":24576,"numaNode":-1,"mig":{"capable":false,"enabled":false},"health":"Healthy","sharing":"shared","maxShares":4,"links":[]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if inv.GPUs[0].Links != nil {
		t.Errorf("empty links decoded as %#v, want nil", inv.GPUs[0].Links)
	}
}

func TestDecodeErrors(t *testing.T) {
	header := `"apiVersion":"tessera.io/v1","kind":"NodeGPUInventory"`
	tests := []struct {
		name, input, want string
	}{
		{"empty", ``, `decoding GPU inventory: empty input`},
		{"not json", `hello`, `decoding GPU inventory: invalid character 'h' looking for beginning of value`},
		{"no version", `{}`, `GPU inventory version "" is not supported (this build reads tessera.io/v1, tessera.io/v2 and tessera.io/v3)`},
		{"unknown version", `{"apiVersion":"tessera.io/v9","kind":"NodeGPUInventory","future":1}`,
			`GPU inventory version "tessera.io/v9" is not supported (this build reads tessera.io/v1, tessera.io/v2 and tessera.io/v3)`},
		{"wrong kind", `{"apiVersion":"tessera.io/v1","kind":"PodGPUAllocation"}`,
			`GPU inventory kind "PodGPUAllocation" is not "NodeGPUInventory"`},
		{"unknown field", `{` + header + `,"memoryOvercommit":1,"gpus":[],"extra":true}`,
			`decoding GPU inventory: json: unknown field "extra"`},
		{"trailing data", `{` + header + `,"memoryOvercommit":1,"gpus":[]} {}`,
			`decoding GPU inventory: trailing data after the JSON value (offset 87)`},
		{"trailing garbage", `{` + header + `,"memoryOvercommit":1,"gpus":[]}x`,
			`decoding GPU inventory: trailing data after the JSON value (offset 87)`},
		{"wrong type", `{` + header + `,"memoryOvercommit":"1"}`,
			`decoding GPU inventory: json: cannot unmarshal string into Go struct field NodeInventory.memoryOvercommit of type float64`},
		{"zero overcommit", `{` + header + `,"gpus":[]}`,
			`invalid GPU inventory: memoryOvercommit 0 outside [1, 4]`},
		{"too large", `{` + header + `,"memoryOvercommit":1,"gpus":[]}` + strings.Repeat(" ", MaxAnnotationBytes),
			`GPU inventory is 262231 bytes, more than the limit of 262144`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv, err := DecodeInventory([]byte(tt.input))
			if err == nil {
				t.Fatalf("decoded %+v, want error %q", inv, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %q\nwant %q", err, tt.want)
			}
		})
	}
}

func TestDecodeAllocationErrors(t *testing.T) {
	tests := []struct {
		name, input, want string
	}{
		{"unknown version", `{"apiVersion":"tessera.io/v4","kind":"PodGPUAllocation"}`,
			`GPU allocation version "tessera.io/v4" is not supported (this build reads tessera.io/v1, tessera.io/v2 and tessera.io/v3)`},
		{"wrong kind", `{"apiVersion":"tessera.io/v1","kind":"NodeGPUInventory"}`,
			`GPU allocation kind "NodeGPUInventory" is not "PodGPUAllocation"`},
		{"unknown field", `{"apiVersion":"tessera.io/v1","kind":"PodGPUAllocation","node":"n","containers":[{"name":"c","devices":[{"uuid":"GPU-a","memoryMiB":1,"cores":0,"vgpu":true}]}]}`,
			`decoding GPU allocation: json: unknown field "vgpu"`},
		{"trailing data", `{"apiVersion":"tessera.io/v1","kind":"PodGPUAllocation"}]`,
			`decoding GPU allocation: trailing data after the JSON value (offset 56)`},
		{"no containers", `{"apiVersion":"tessera.io/v1","kind":"PodGPUAllocation","node":"n","containers":[]}`,
			`invalid GPU allocation: no containers (a pod without GPU containers has no allocation)`},
		{"too large", strings.Repeat(" ", MaxAnnotationBytes+1),
			`GPU allocation is 262145 bytes, more than the limit of 262144`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := DecodeAllocation([]byte(tt.input))
			if err == nil {
				t.Fatalf("decoded %+v, want error %q", a, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %q\nwant %q", err, tt.want)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	inv := goldenInventory()
	inv.GPUs[0].MaxShares = 0
	_, err := EncodeInventory(inv)
	const want = "invalid GPU inventory: gpus[0] (GPU-5eed0000-7c1d-4e2a-9b3f-a10000000000): maxShares 0 outside [1, 128]"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	inv = goldenInventory()
	inv.APIVersion = "tessera.io/v0"
	if _, err := EncodeInventory(inv); err == nil || err.Error() != `encoding GPU inventory version "tessera.io/v0" is not supported (this build reads tessera.io/v1, tessera.io/v2 and tessera.io/v3)` {
		t.Errorf("got %v", err)
	}
	if _, err := EncodeInventory(nil); err == nil {
		t.Error("EncodeInventory(nil) succeeded")
	}
	if _, err := EncodeAllocation(nil); err == nil {
		t.Error("EncodeAllocation(nil) succeeded")
	}
	a := goldenAllocation()
	a.Kind = "Pod"
	if _, err := EncodeAllocation(a); err == nil || err.Error() != `encoding GPU allocation kind "Pod" is not "PodGPUAllocation"` {
		t.Errorf("got %v", err)
	}
}

// TestEncodeTooLarge: a node at every limit does not fit in an annotation;
// Encode must refuse rather than write something no decoder accepts.
func TestEncodeTooLarge(t *testing.T) {
	inv := &NodeInventory{MemoryOvercommit: 1}
	for i := range MaxGPUsPerNode {
		g := GPU{UUID: testUUID(i), Index: i, Model: strings.Repeat("M", MaxModelLength), MemoryMiB: 1, NUMANode: -1,
			Health: Healthy, Sharing: SharingShared, MaxShares: 1}
		for j := range MaxGPUsPerNode {
			if j != i {
				g.Links = append(g.Links, Link{PeerUUID: testUUID(j), Type: LinkNVLink, NVLinks: 1})
			}
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	_, err := EncodeInventory(inv)
	if err == nil || !strings.HasPrefix(err.Error(), "encoded GPU inventory is ") || !strings.HasSuffix(err.Error(), "more than the limit of 262144") {
		t.Errorf("got %v", err)
	}
}

func TestValidateInventoryErrors(t *testing.T) {
	const g0 = "gpus[0] (GPU-5eed0000-7c1d-4e2a-9b3f-a10000000000)"
	const g1 = "gpus[1] (GPU-5eed0001-7c1d-4e2a-9b3f-a10000000001)"
	tests := []struct {
		name   string
		mutate func(inv *NodeInventory)
		want   string
	}{
		{"overcommit low", func(inv *NodeInventory) { inv.MemoryOvercommit = 0.5 }, "memoryOvercommit 0.5 outside [1, 4]"},
		{"overcommit high", func(inv *NodeInventory) { inv.MemoryOvercommit = 4.5 }, "memoryOvercommit 4.5 outside [1, 4]"},
		{"overcommit NaN", func(inv *NodeInventory) { inv.MemoryOvercommit = math.NaN() }, "memoryOvercommit NaN outside [1, 4]"},
		{"overcommit Inf", func(inv *NodeInventory) { inv.MemoryOvercommit = math.Inf(1) }, "memoryOvercommit +Inf outside [1, 4]"},
		{"too many GPUs", func(inv *NodeInventory) { inv.GPUs = make([]GPU, MaxGPUsPerNode+1) }, "65 GPUs exceed the limit of 64 per node"},
		{"empty uuid", func(inv *NodeInventory) { inv.GPUs[2].UUID = "" }, "gpus[2]: uuid is empty"},
		{"long uuid", func(inv *NodeInventory) { inv.GPUs[0].UUID = strings.Repeat("u", 129) }, "gpus[0] (" + `"` + strings.Repeat("u", 129) + `"` + "): uuid is 129 bytes, more than 128"},
		{"unprintable uuid", func(inv *NodeInventory) { inv.GPUs[0].UUID = "GPU-\x01" }, `gpus[0] ("GPU-\x01"): uuid "GPU-\x01" contains '\x01' (only printable ASCII other than space and ',' is allowed)`},
		{"comma in uuid", func(inv *NodeInventory) { inv.GPUs[0].UUID = "GPU-a,b" }, `gpus[0] ("GPU-a,b"): uuid "GPU-a,b" contains ',' (only printable ASCII other than space and ',' is allowed)`},
		{"duplicate uuid", func(inv *NodeInventory) { inv.GPUs[1].UUID = inv.GPUs[0].UUID }, "gpus[1] (GPU-5eed0000-7c1d-4e2a-9b3f-a10000000000): uuid duplicates gpus[0]"},
		{"negative index", func(inv *NodeInventory) { inv.GPUs[0].Index = -1 }, g0 + ": index -1 outside [0, 63]"},
		{"index too large", func(inv *NodeInventory) { inv.GPUs[0].Index = 64 }, g0 + ": index 64 outside [0, 63]"},
		{"duplicate index", func(inv *NodeInventory) { inv.GPUs[1].Index = 0 }, g1 + ": index 0 duplicates gpus[0]"},
		{"empty model", func(inv *NodeInventory) { inv.GPUs[0].Model = "" }, g0 + ": model is empty"},
		{"long model", func(inv *NodeInventory) { inv.GPUs[0].Model = strings.Repeat("A", 257) }, g0 + ": model is 257 bytes, more than 256"},
		{"zero memory", func(inv *NodeInventory) { inv.GPUs[0].MemoryMiB = 0 }, g0 + ": memoryMiB 0 outside [1, 16777216]"},
		{"huge memory", func(inv *NodeInventory) { inv.GPUs[0].MemoryMiB = 40 << 30 }, g0 + ": memoryMiB 42949672960 outside [1, 16777216]"},
		{"negative SMs", func(inv *NodeInventory) { inv.GPUs[0].SMCount = -1 }, g0 + ": smCount -1 is negative"},
		{"bad compute capability", func(inv *NodeInventory) { inv.GPUs[0].ComputeCapability = "sm_80" }, g0 + `: computeCapability "sm_80" is not "major.minor" (e.g. "8.0")`},
		{"compute capability no minor", func(inv *NodeInventory) { inv.GPUs[0].ComputeCapability = "8." }, g0 + `: computeCapability "8." is not "major.minor" (e.g. "8.0")`},
		{"numa below -1", func(inv *NodeInventory) { inv.GPUs[0].NUMANode = -2 }, g0 + ": numaNode -2 below -1 (-1 means unknown)"},
		{"unknown health", func(inv *NodeInventory) { inv.GPUs[0].Health = "ok" }, g0 + `: health "ok" is not "Healthy" or "Unhealthy"`},
		{"reason when healthy", func(inv *NodeInventory) { inv.GPUs[0].HealthReason = "XID 48" }, g0 + `: healthReason "XID 48" set on a Healthy GPU`},
		{"unknown sharing", func(inv *NodeInventory) { inv.GPUs[0].Sharing = "vgpu" }, g0 + `: sharing "vgpu" is not one of "shared", "exclusive", "time-slicing", "mps", "mig" or "mig-dynamic"`},
		{"zero shares", func(inv *NodeInventory) { inv.GPUs[0].MaxShares = 0 }, g0 + ": maxShares 0 outside [1, 128]"},
		{"too many shares", func(inv *NodeInventory) { inv.GPUs[0].MaxShares = 129 }, g0 + ": maxShares 129 outside [1, 128]"},
		{"shared exclusive", func(inv *NodeInventory) { inv.GPUs[0].Sharing = SharingExclusive }, g0 + ": maxShares 10 on an exclusive GPU (must be 1)"},
		{"MIG enabled not capable", func(inv *NodeInventory) { inv.GPUs[0].MIG = MIG{Enabled: true} }, g0 + ": mig.enabled set but mig.capable is not"},
		{"link to self", func(inv *NodeInventory) { inv.GPUs[0].Links[0].PeerUUID = inv.GPUs[0].UUID }, g0 + ": links[0]: peerUUID is the GPU itself"},
		{"link to stranger", func(inv *NodeInventory) { inv.GPUs[0].Links[0].PeerUUID = "GPU-x" }, g0 + `: links[0]: peerUUID "GPU-x" is not a GPU of this node`},
		{"duplicate peer", func(inv *NodeInventory) { inv.GPUs[0].Links[1].PeerUUID = inv.GPUs[0].Links[0].PeerUUID }, g0 + ": links[1]: second link to peer GPU-5eed0001-7c1d-4e2a-9b3f-a10000000001"},
		{"unknown link type", func(inv *NodeInventory) { inv.GPUs[0].Links[0].Type = "infiniband" }, g0 + `: links[0]: type "infiniband" is not one of "nvlink", "pcie-single", "pcie-multiple", "pcie-hostbridge", "pcie-numa" or "system"`},
		{"nvlink without links", func(inv *NodeInventory) { inv.GPUs[0].Links[0].NVLinks = 0 }, g0 + ": links[0]: nvlinks 0 outside [1, 64]"},
		{"nvlink too many", func(inv *NodeInventory) { inv.GPUs[0].Links[0].NVLinks = 65 }, g0 + ": links[0]: nvlinks 65 outside [1, 64]"},
		{"nvlinks on pcie", func(inv *NodeInventory) { inv.GPUs[0].Links[0].Type = LinkPCIeSingle }, g0 + ": links[0]: nvlinks 12 set on a pcie-single link (only nvlink links count links)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := goldenInventory()
			tt.mutate(inv)
			err := ValidateInventory(inv)
			if err == nil {
				t.Fatalf("valid, want error %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %q\nwant %q", err, tt.want)
			}
			// The decoder applies the same rules (NaN and Inf have no JSON form).
			if math.IsNaN(inv.MemoryOvercommit) || math.IsInf(inv.MemoryOvercommit, 0) {
				return
			}
			data := mustMarshal(t, inv)
			if _, err := DecodeInventory(data); err == nil || err.Error() != "invalid GPU inventory: "+tt.want {
				t.Errorf("DecodeInventory error\n got %v\nwant %q", err, "invalid GPU inventory: "+tt.want)
			}
		})
	}
	if err := ValidateInventory(nil); err == nil {
		t.Error("ValidateInventory(nil) succeeded")
	}
}

func TestValidateInventoryAccepts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(inv *NodeInventory)
	}{
		{"no GPUs", func(inv *NodeInventory) { inv.GPUs = nil }},
		{"max overcommit", func(inv *NodeInventory) { inv.MemoryOvercommit = MaxMemoryOvercommit }},
		{"exclusive", func(inv *NodeInventory) { inv.GPUs[0].Sharing, inv.GPUs[0].MaxShares = SharingExclusive, 1 }},
		{"unknown NUMA and capability", func(inv *NodeInventory) { inv.GPUs[0].NUMANode, inv.GPUs[0].ComputeCapability = -1, "" }},
		{"unhealthy without reason", func(inv *NodeInventory) { inv.GPUs[0].Health = Unhealthy }},
		{"MIG enabled", func(inv *NodeInventory) { inv.GPUs[0].MIG.Enabled = true }},
		{"pcie link", func(inv *NodeInventory) { inv.GPUs[0].Links[0] = Link{PeerUUID: inv.GPUs[1].UUID, Type: LinkSystem} }},
		{"three-digit capability", func(inv *NodeInventory) { inv.GPUs[0].ComputeCapability = "10.100" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := goldenInventory()
			tt.mutate(inv)
			if err := ValidateInventory(inv); err != nil {
				t.Fatal(err)
			}
			assertInventoryRoundTrip(t, inv)
		})
	}
}

func TestValidateAllocationErrors(t *testing.T) {
	const trainer = "containers[1] (trainer)"
	const dev0 = trainer + ": devices[0] (GPU-5eed0002-7c1d-4e2a-9b3f-a10000000002)"
	tests := []struct {
		name   string
		mutate func(a *PodAllocation)
		want   string
	}{
		{"no node", func(a *PodAllocation) { a.Node = "" }, "node is empty"},
		{"no containers", func(a *PodAllocation) { a.Containers = nil }, "no containers (a pod without GPU containers has no allocation)"},
		{"too many containers", func(a *PodAllocation) { a.Containers = make([]ContainerAllocation, MaxContainersPerPod+1) }, "257 containers exceed the limit of 256 per pod"},
		{"unnamed container", func(a *PodAllocation) { a.Containers[1].Name = "" }, "containers[1]: name is empty"},
		{"duplicate container", func(a *PodAllocation) { a.Containers[2].Name = "trainer" }, "containers[2] (trainer): name duplicates containers[1]"},
		{"no devices", func(a *PodAllocation) { a.Containers[1].Devices = nil }, trainer + ": no devices"},
		{"too many devices", func(a *PodAllocation) { a.Containers[1].Devices = make([]DeviceGrant, MaxGPUsPerNode+1) }, trainer + ": 65 devices exceed the limit of 64"},
		{"empty uuid", func(a *PodAllocation) { a.Containers[1].Devices[1].UUID = "" }, trainer + ": devices[1]: uuid is empty"},
		{"duplicate device", func(a *PodAllocation) { a.Containers[1].Devices[1].UUID = a.Containers[1].Devices[0].UUID },
			trainer + ": devices[1] (GPU-5eed0002-7c1d-4e2a-9b3f-a10000000002): uuid duplicates devices[0]"},
		{"zero memory", func(a *PodAllocation) { a.Containers[1].Devices[0].MemoryMiB = 0 }, dev0 + ": memoryMiB 0 outside [1, 16777216]"},
		{"huge memory", func(a *PodAllocation) { a.Containers[1].Devices[0].MemoryMiB = 1 << 40 }, dev0 + ": memoryMiB 1099511627776 outside [1, 16777216]"},
		{"negative cores", func(a *PodAllocation) { a.Containers[1].Devices[0].Cores = -1 }, dev0 + ": cores -1 outside [0, 100]"},
		{"too many cores", func(a *PodAllocation) { a.Containers[1].Devices[0].Cores = 101 }, dev0 + ": cores 101 outside [0, 100]"},
		{"exclusive partial", func(a *PodAllocation) { a.Containers[1].Devices[0].Cores = 50 }, dev0 + ": exclusive grant with cores 50 (must be 100)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := goldenAllocation()
			tt.mutate(a)
			err := ValidateAllocation(a)
			if err == nil {
				t.Fatalf("valid, want error %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %q\nwant %q", err, tt.want)
			}
			data := mustMarshal(t, a)
			if _, err := DecodeAllocation(data); err == nil || err.Error() != "invalid GPU allocation: "+tt.want {
				t.Errorf("DecodeAllocation error\n got %v\nwant %q", err, "invalid GPU allocation: "+tt.want)
			}
		})
	}
	if err := ValidateAllocation(nil); err == nil {
		t.Error("ValidateAllocation(nil) succeeded")
	}
}

func TestValidateAllocationAccepts(t *testing.T) {
	a := goldenAllocation()
	// An init container and an app container may share a name.
	a.Containers[0].Name = "trainer"
	a.Containers[2].Devices[0].Cores = 0
	if err := ValidateAllocation(a); err != nil {
		t.Fatal(err)
	}
	assertAllocationRoundTrip(t, a)
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := jsonMarshalForTest(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// assertInventoryRoundTrip checks Decode(Encode(inv)) == inv and that
// encoding is stable.
func assertInventoryRoundTrip(t testing.TB, inv *NodeInventory) {
	t.Helper()
	data, err := EncodeInventory(inv)
	if err != nil {
		t.Fatalf("encoding %+v: %v", inv, err)
	}
	got, err := DecodeInventory(data)
	if err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
	// The encoder writes the lowest version that expresses the value, so
	// only the version may differ, and only towards that one.
	want := *inv
	want.APIVersion, _ = inventoryNeeds(inv)
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("round trip changed the inventory\n got %#v\nwant %#v", got, &want)
	}
	again, err := EncodeInventory(got)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("re-encoding differs (%v)\n got %s\nwant %s", err, again, data)
	}
}

func assertAllocationRoundTrip(t testing.TB, a *PodAllocation) {
	t.Helper()
	data, err := EncodeAllocation(a)
	if err != nil {
		t.Fatalf("encoding %+v: %v", a, err)
	}
	got, err := DecodeAllocation(data)
	if err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
	want := *a
	want.APIVersion, _ = allocationNeeds(a)
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("round trip changed the allocation\n got %#v\nwant %#v", got, &want)
	}
	again, err := EncodeAllocation(got)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("re-encoding differs (%v)\n got %s\nwant %s", err, again, data)
	}
}

func TestGoldenFilesExist(t *testing.T) {
	for _, p := range []string{inventoryGolden, allocationGolden, inventoryV2Golden, allocationV2Golden, inventoryV3Golden, allocationV3Golden} {
		if _, err := os.Stat(filepath.FromSlash(p)); err != nil && !*update {
			t.Error(err)
		}
	}
}
