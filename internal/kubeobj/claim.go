package kubeobj

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// ClaimDevice is one device of Tessera's DRA driver (gpu.tessera.io) in a
// ResourceClaim's allocation, with the capacity the claim consumed: what
// the node agent's DRA driver enforces and what `kubectl tessera` shows.
type ClaimDevice struct {
	// Index is the result's index in status.allocation.devices.results.
	Index int
	// Request is the result's request ("gpu", or "gpu/subrequest").
	Request string
	Pool    string
	Device  string
	// ShareID is the scheduler's share of a device that allows multiple
	// allocations; empty for a device allocated whole.
	ShareID string
	// Whole: the device was allocated whole (an exclusive device, or a
	// scheduler that tracks no consumable capacity and then gives it to
	// one claim only): all its memory and cores. MemoryMiB and Cores are
	// then 0; the caller knows the GPU's memory.
	Whole bool
	// MemoryMiB (rounded up to a whole MiB) and Cores (percent of the
	// SMs; 0 when the claim asked none) are the capacity consumed by a
	// share.
	MemoryMiB int64
	Cores     int64
	// Admin is admin access (monitoring): the GPU is visible, nothing is
	// consumed or limited.
	Admin bool
}

// ClaimDevices reads the allocation results of Tessera's driver from an
// allocated claim (none when it is not allocated). A consumed capacity
// that is not a byte count or a whole percent is an error naming the
// result.
func ClaimDevices(claim *resourceapi.ResourceClaim) ([]ClaimDevice, error) {
	if claim.Status.Allocation == nil {
		return nil, nil
	}
	var out []ClaimDevice
	for i, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != api.DRADriverName {
			continue
		}
		d := ClaimDevice{Index: i, Request: r.Request, Pool: r.Pool, Device: r.Device, Admin: r.AdminAccess != nil && *r.AdminAccess}
		if r.ShareID != nil {
			d.ShareID = string(*r.ShareID)
		}
		mem, hasMem := r.ConsumedCapacity[api.CapacityMemory]
		cores, hasCores := r.ConsumedCapacity[api.CapacityCores]
		switch {
		case d.Admin:
		case r.ShareID == nil || !hasMem:
			d.Whole = true
		default:
			m, err := WholeMiB(mem)
			if err != nil {
				return nil, fmt.Errorf("status.allocation.devices.results[%d].consumedCapacity[%s]: %w", i, api.CapacityMemory, err)
			}
			d.MemoryMiB = m
			if hasCores {
				c, ok := cores.AsInt64()
				if !ok || c < 0 || c > api.MaxCores {
					return nil, fmt.Errorf("status.allocation.devices.results[%d].consumedCapacity[%s] %s: want a whole percent in [0, %d]", i, api.CapacityCores, cores.String(), api.MaxCores)
				}
				d.Cores = c
			}
			if d.MemoryMiB <= 0 {
				return nil, fmt.Errorf("status.allocation.devices.results[%d].consumedCapacity[%s] %s: a share must hold some memory", i, api.CapacityMemory, mem.String())
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// WholeMiB converts a byte quantity to MiB, rounding up (the scheduler
// rounds requests up to the policy's 1 MiB step; a scheduler without the
// policy may not).
func WholeMiB(q resource.Quantity) (int64, error) {
	b, ok := q.AsInt64()
	if !ok || b < 0 {
		return 0, fmt.Errorf("%s is not a byte count", q.String())
	}
	return (b + (1 << 20) - 1) >> 20, nil
}
