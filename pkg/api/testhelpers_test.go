package api

import (
	"encoding/json"
	"fmt"
)

// goldenInventory is a DGX-A100-like node: 8 A100-SXM4-40GB all connected
// through NVSwitch (12 NVLinks per pair), GPU 5 fallen off the bus.
func goldenInventory() *NodeInventory {
	buses := []string{"07", "0F", "47", "4E", "87", "90", "B7", "BD"}
	inv := &NodeInventory{
		APIVersion:       InventoryAPIVersionV1,
		Kind:             InventoryKind,
		MemoryOvercommit: 1,
	}
	for i := range 8 {
		g := GPU{
			UUID:              testUUID(i),
			Index:             i,
			Model:             "NVIDIA A100-SXM4-40GB",
			MemoryMiB:         40960,
			SMCount:           108,
			ComputeCapability: "8.0",
			NUMANode:          i / 4,
			PCIBusID:          "00000000:" + buses[i] + ":00.0",
			MIG:               MIG{Capable: true},
			Health:            Healthy,
			Sharing:           SharingShared,
			MaxShares:         10,
		}
		if i == 5 {
			g.Health, g.HealthReason = Unhealthy, "XID 79"
		}
		for j := range 8 {
			if j != i {
				g.Links = append(g.Links, Link{PeerUUID: testUUID(j), Type: LinkNVLink, NVLinks: 12})
			}
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	return inv
}

func testUUID(i int) string {
	return fmt.Sprintf("GPU-%08x-7c1d-4e2a-9b3f-a100%08d", 0x5eed0000+i, i)
}

// goldenAllocation is a pod with an init container and two app containers,
// one of them holding two whole GPUs.
func goldenAllocation() *PodAllocation {
	return &PodAllocation{
		APIVersion: AllocationAPIVersionV1,
		Kind:       AllocationKind,
		Node:       "gpu-node-01",
		Containers: []ContainerAllocation{
			{Name: "fetch-weights", Init: true, Devices: []DeviceGrant{
				{UUID: testUUID(0), MemoryMiB: 2048, Cores: 10},
			}},
			{Name: "trainer", Devices: []DeviceGrant{
				{UUID: testUUID(2), MemoryMiB: 40960, Cores: 100, Exclusive: true},
				{UUID: testUUID(3), MemoryMiB: 40960, Cores: 100, Exclusive: true},
			}},
			{Name: "metrics", Devices: []DeviceGrant{
				{UUID: testUUID(0), MemoryMiB: 4096, Cores: 20},
			}},
		},
	}
}

// jsonMarshalForTest encodes v without validation, to feed invalid records
// to the decoders.
func jsonMarshalForTest(v any) ([]byte, error) { return json.Marshal(v) }
