package api

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

const (
	inventoryV3Golden  = "testdata/inventory-v3.golden.json"
	allocationV3Golden = "testdata/allocation-v3.golden.json"
)

// goldenInventoryV3 is the v2 golden node with its MPS GPU's memory
// partitioned by the driver (what tessera.io/v3 added).
func goldenInventoryV3() *NodeInventory {
	inv := goldenInventoryV2()
	inv.APIVersion = InventoryAPIVersion
	inv.GPUs[2].DriverMemoryLimits = true
	return inv
}

// goldenAllocationV3 is the v2 golden record whose share has a memory
// ceiling above its guarantee.
func goldenAllocationV3() *PodAllocation {
	a := goldenAllocationV2()
	a.APIVersion = AllocationAPIVersion
	a.Containers[0].Devices[0].CeilingMiB = 12288
	return a
}

func TestGoldenV3(t *testing.T) {
	checkGoldenVersion(t, "v3", goldenInventoryV3(), inventoryV3Golden, goldenAllocationV3(), allocationV3Golden)
}

// TestEncoderWritesLowestVersionV3: only a v3 field makes a document v3;
// everything else keeps the version the previous releases read.
func TestEncoderWritesLowestVersionV3(t *testing.T) {
	inv := goldenInventoryV3()
	inv.GPUs[2].DriverMemoryLimits = false
	data, err := EncodeInventory(inv)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v2",`)) {
		t.Errorf("v2-expressible inventory written as %.40s (%v)", data, err)
	}
	inv = goldenInventory()
	inv.GPUs[0].DriverMemoryLimits = true
	data, err = EncodeInventory(inv)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v3",`)) {
		t.Errorf("v1 inventory with a driver-limited GPU written as %.40s (%v)", data, err)
	}
	a := goldenAllocationV3()
	a.Containers[0].Devices[0].CeilingMiB = 0
	data, err = EncodeAllocation(a)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v2",`)) {
		t.Errorf("v2-expressible record written as %.40s (%v)", data, err)
	}
	a = goldenAllocation()
	for i := range a.Containers[0].Devices {
		d := &a.Containers[0].Devices[i]
		if !d.Exclusive {
			d.CeilingMiB = d.MemoryMiB + 1
			break
		}
	}
	data, err = EncodeAllocation(a)
	if err != nil || !bytes.HasPrefix(data, []byte(`{"apiVersion":"tessera.io/v3",`)) {
		t.Errorf("v1 record with a ceiling written as %.40s (%v)", data, err)
	}
}

// TestOlderVersionsRefuseV3Fields: a v1 or v2 document that uses a v3
// field was written by no release; it is refused naming the field.
func TestOlderVersionsRefuseV3Fields(t *testing.T) {
	inv, err := os.ReadFile(inventoryV3Golden)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := os.ReadFile(allocationV3Golden)
	if err != nil {
		t.Fatal(err)
	}
	as := func(b []byte, v string) []byte {
		return bytes.Replace(b, []byte(`"tessera.io/v3"`), []byte(`"`+v+`"`), 1)
	}
	if _, err := DecodeInventory(as(inv, "tessera.io/v2")); err == nil || err.Error() != `decoding GPU inventory: gpus[2].driverMemoryLimits is not part of tessera.io/v2 (it needs tessera.io/v3)` {
		t.Errorf("v2 inventory with a v3 field: %v", err)
	}
	if _, err := DecodeAllocation(as(rec, "tessera.io/v2")); err == nil || err.Error() != `decoding GPU allocation: containers[0].devices[0].ceilingMiB is not part of tessera.io/v2 (it needs tessera.io/v3)` {
		t.Errorf("v2 record with a v3 field: %v", err)
	}
	// A v1 document with v2 and v3 fields names the newest version needed.
	if _, err := DecodeAllocation(as(rec, "tessera.io/v1")); err == nil || !strings.Contains(err.Error(), "ceilingMiB is not part of tessera.io/v1 (it needs tessera.io/v3)") {
		t.Errorf("v1 record with v2 and v3 fields: %v", err)
	}
	// The previous release's reader (v1 and v2 only) refuses v3 by version.
	if err := readHeader("GPU allocation", rec, allocationVersions[:2], AllocationKind); err == nil || !strings.Contains(err.Error(), `version "tessera.io/v3" is not supported (this build reads tessera.io/v1 and tessera.io/v2)`) {
		t.Errorf("a v2 reader on a v3 record: %v", err)
	}
}

func TestValidateV3Errors(t *testing.T) {
	inv := goldenInventoryV3()
	inv.GPUs[0].DriverMemoryLimits = true
	if err := ValidateInventory(inv); err == nil || !strings.Contains(err.Error(), "driverMemoryLimits set on a GPU in MIG mode") {
		t.Errorf("driver limits on a MIG GPU: %v", err)
	}
	for name, tc := range map[string]struct {
		mutate func(*DeviceGrant)
		want   string
	}{
		"ceiling equal to the guarantee": {func(d *DeviceGrant) { d.CeilingMiB = d.MemoryMiB }, "ceilingMiB 4096 outside [4097, 16777216] (above memoryMiB, the guarantee)"},
		"ceiling below the guarantee":    {func(d *DeviceGrant) { d.CeilingMiB = 1 }, "ceilingMiB 1 outside [4097,"},
		"ceiling negative":               {func(d *DeviceGrant) { d.CeilingMiB = -1 }, "ceilingMiB -1 outside"},
		"ceiling too large":              {func(d *DeviceGrant) { d.CeilingMiB = MaxGPUMemoryMiB + 1 }, "ceilingMiB 16777217 outside"},
		"ceiling on a whole GPU":         {func(d *DeviceGrant) { d.Exclusive, d.Cores = true, 100 }, "on an exclusive grant (a whole GPU has nothing to borrow)"},
		"ceiling on a MIG grant":         {func(d *DeviceGrant) { d.MIG = &MIGGrant{Profile: "1g.5gb"} }, "on a MIG grant"},
	} {
		a := goldenAllocationV3()
		tc.mutate(&a.Containers[0].Devices[0])
		err := ValidateAllocation(a)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", name, err, tc.want)
		}
	}
}
