package dra

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// Grant is one GPU a claim was allocated on this node, with the capacity
// it consumed: what the limiter enforces and what Prepare checks against
// the GPU.
type Grant struct {
	// Request is the allocation result's request ("gpu", or
	// "gpu/subrequest" for a prioritized list).
	Request string `json:"request"`
	Device  string `json:"device"`
	UUID    string `json:"uuid"`
	// ShareID is the scheduler's share of a device that allows multiple
	// allocations; empty for a device allocated whole.
	ShareID string `json:"shareID,omitempty"`
	// MemoryMiB and Cores are the capacity consumed. Whole means the
	// device was allocated whole (no share): all of it, no limits.
	MemoryMiB int64 `json:"memoryMiB"`
	Cores     int64 `json:"cores"`
	Whole     bool  `json:"whole,omitempty"`
	// Admin is admin access (monitoring): the GPU is visible, nothing is
	// consumed or limited.
	Admin bool `json:"admin,omitempty"`
}

// Limited reports whether the limiter applies to the grant: a share that
// holds less than the GPU's memory, or a compute share below 100 %.
func (g Grant) Limited(gpuMiB int64) bool {
	if g.Whole || g.Admin {
		return false
	}
	return g.MemoryMiB < gpuMiB || (g.Cores > 0 && g.Cores < api.MaxCores)
}

// grants reads the allocation results of this driver and pool from the
// claim, one per GPU, with the capacity each consumed. gpus maps the
// published device names to their GPUs.
func grants(claim *resourceapi.ResourceClaim, pool string, gpus map[string]GPU) ([]Grant, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim is not allocated")
	}
	var out []Grant
	for i, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != api.DRADriverName {
			continue
		}
		if r.Pool != pool {
			return nil, fmt.Errorf("status.allocation.devices.results[%d]: device %s of pool %q, but this node's pool is %q", i, r.Device, r.Pool, pool)
		}
		g, ok := gpus[r.Device]
		if !ok {
			return nil, fmt.Errorf("status.allocation.devices.results[%d]: device %q is not a GPU this node publishes", i, r.Device)
		}
		gr := Grant{Request: r.Request, Device: r.Device, UUID: g.UUID, Admin: r.AdminAccess != nil && *r.AdminAccess}
		if r.ShareID != nil {
			gr.ShareID = string(*r.ShareID)
		}
		mem, hasMem := r.ConsumedCapacity[api.CapacityMemory]
		cores, hasCores := r.ConsumedCapacity[api.CapacityCores]
		switch {
		case gr.Admin:
		case r.ShareID == nil || !hasMem:
			// Allocated whole: an exclusive device, or a scheduler that
			// does not track consumable capacity (it then gives the
			// device to one claim only).
			gr.Whole, gr.MemoryMiB, gr.Cores = true, g.MemoryMiB, api.MaxCores
		default:
			m, err := wholeMiB(mem)
			if err != nil {
				return nil, fmt.Errorf("status.allocation.devices.results[%d].consumedCapacity[%s]: %w", i, api.CapacityMemory, err)
			}
			gr.MemoryMiB = m
			if hasCores {
				c, ok := cores.AsInt64()
				if !ok || c < 0 || c > api.MaxCores {
					return nil, fmt.Errorf("status.allocation.devices.results[%d].consumedCapacity[%s] %s: want a whole percent in [0, %d]", i, api.CapacityCores, cores.String(), api.MaxCores)
				}
				gr.Cores = c
			}
			if gr.MemoryMiB <= 0 {
				return nil, fmt.Errorf("status.allocation.devices.results[%d].consumedCapacity[%s] %s: a share must hold some memory", i, api.CapacityMemory, mem.String())
			}
		}
		out = append(out, gr)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the allocation has no device of driver %s", api.DRADriverName)
	}
	return out, nil
}

// wholeMiB converts consumed memory to MiB, rounding up (the scheduler
// rounds requests up to the policy's 1 MiB step; a scheduler without the
// policy may not).
func wholeMiB(q resource.Quantity) (int64, error) {
	b, ok := q.AsInt64()
	if !ok || b < 0 {
		return 0, fmt.Errorf("%s is not a byte count", q.String())
	}
	return (b + (1 << 20) - 1) >> 20, nil
}

// requestConfig is the configuration that applies to one request: the
// class's opaque configuration first, then the claim's, later entries
// overriding earlier ones.
type requestConfig struct {
	Elastic           bool
	ContextReserveMiB *uint64
}

// configs resolves the opaque configuration of every request the driver
// serves. A GPUConfig that does not decode, or a configuration for
// NVIDIA's driver on a request Tessera serves, is an error naming it.
// Configuration for other drivers is theirs.
func configs(claim *resourceapi.ResourceClaim, requests []string) (map[string]requestConfig, error) {
	out := make(map[string]requestConfig, len(requests))
	for _, req := range requests {
		out[req] = requestConfig{}
	}
	all := claim.Status.Allocation.Devices.Config
	// Class configuration first (it may be overridden by the claim's).
	order := make([]int, 0, len(all))
	for _, src := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for i, c := range all {
			if c.Source == src {
				order = append(order, i)
			}
		}
	}
	for _, i := range order {
		c := all[i]
		if c.Opaque == nil {
			continue
		}
		// Name the entry as the user wrote it: the claim's entries are
		// copied in order after the classes'.
		field := "the DeviceClass's spec.config"
		if c.Source == resourceapi.AllocationConfigSourceClaim {
			k := 0
			for _, o := range all[:i] {
				if o.Source == resourceapi.AllocationConfigSourceClaim {
					k++
				}
			}
			field = fmt.Sprintf("spec.devices.config[%d]", k)
		}
		var applies []string
		for _, req := range requests {
			if len(c.Requests) == 0 || slices.Contains(c.Requests, req) || slices.Contains(c.Requests, resourceclaim.BaseRequestRef(req)) {
				applies = append(applies, req)
			}
		}
		if len(applies) == 0 {
			continue
		}
		switch c.Opaque.Driver {
		case api.DRADriverName:
		case api.NVIDIADomain:
			return nil, fmt.Errorf("%s: opaque configuration for driver %s (NVIDIA's DRA driver) applies to request %q, which %s serves; it is not implemented here (remove it; %s's own is %s %s)",
				field, c.Opaque.Driver, applies[0], api.DRADriverName, api.DRADriverName, api.GPUConfigAPIVersion, api.GPUConfigKind)
		default:
			continue
		}
		gc, err := api.DecodeGPUConfig(c.Opaque.Parameters.Raw)
		if err != nil {
			return nil, fmt.Errorf("%s.opaque.%w", field, err)
		}
		for _, req := range applies {
			rc := out[req]
			if gc.Elastic != nil {
				rc.Elastic = *gc.Elastic
			}
			if gc.ContextReserveMiB != nil {
				v := uint64(*gc.ContextReserveMiB)
				rc.ContextReserveMiB = &v
			}
			out[req] = rc
		}
	}
	return out, nil
}
