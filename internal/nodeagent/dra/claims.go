package dra

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
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
	// CeilingMiB, above MemoryMiB (the guarantee), is the most the
	// claim's containers may hold on the GPU (the GPUConfig's
	// memoryCeilingMiB); 0: none.
	CeilingMiB int64 `json:"ceilingMiB,omitempty"`
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
	devs, err := kubeobj.ClaimDevices(claim)
	if err != nil {
		return nil, err
	}
	var out []Grant
	for _, d := range devs {
		if d.Pool != pool {
			return nil, fmt.Errorf("status.allocation.devices.results[%d]: device %s of pool %q, but this node's pool is %q", d.Index, d.Device, d.Pool, pool)
		}
		g, ok := gpus[d.Device]
		if !ok {
			return nil, fmt.Errorf("status.allocation.devices.results[%d]: device %q is not a GPU this node publishes", d.Index, d.Device)
		}
		gr := Grant{Request: d.Request, Device: d.Device, UUID: g.UUID, ShareID: d.ShareID, Admin: d.Admin,
			MemoryMiB: d.MemoryMiB, Cores: d.Cores, Whole: d.Whole}
		if d.Whole {
			gr.MemoryMiB, gr.Cores = g.MemoryMiB, api.MaxCores
		}
		out = append(out, gr)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the allocation has no device of driver %s", api.DRADriverName)
	}
	return out, nil
}

// requestConfig is the configuration that applies to one request: the
// class's opaque configuration first, then the claim's, later entries
// overriding earlier ones.
type requestConfig struct {
	Elastic           bool
	ContextReserveMiB *uint64
	// CeilingMiB is the memory ceiling per GPU (0: none), and
	// CeilingField where it was set, for errors.
	CeilingMiB   int64
	CeilingField string
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
			if gc.MemoryCeilingMiB != nil {
				rc.CeilingMiB, rc.CeilingField = *gc.MemoryCeilingMiB, field+".opaque.parameters.memoryCeilingMiB"
			}
			out[req] = rc
		}
	}
	return out, nil
}

// ceilings sets each grant's memory ceiling from its request's
// configuration, checked against what the claim was allocated: the
// guarantee (the memory consumed) at most the ceiling, the ceiling at
// most the GPU's memory, and a share, not a GPU allocated whole (an
// exclusive GPU, or a request that asked no memory) or admin access,
// which have nothing to borrow. A ceiling equal to the guarantee is none.
// Errors name the field, the value and the limit.
func ceilings(gs []Grant, cfgs map[string]requestConfig, gpus map[string]GPU) error {
	for i := range gs {
		g := &gs[i]
		rc := cfgs[g.Request]
		if rc.CeilingMiB == 0 {
			continue
		}
		gpu := gpus[g.Device]
		switch {
		case g.Admin:
			return fmt.Errorf("%s %d: request %q has admin access to GPU %s, which consumes and limits nothing; drop the ceiling", rc.CeilingField, rc.CeilingMiB, g.Request, g.Device)
		case g.Whole || g.MemoryMiB >= gpu.MemoryMiB:
			return fmt.Errorf("%s %d: request %q was allocated GPU %s (%s) whole (an exclusive GPU, or no memory capacity asked: the default is all of it), which has nothing to borrow; ask capacity memory (the guarantee) on a shared GPU, or drop the ceiling", rc.CeilingField, rc.CeilingMiB, g.Request, g.Device, g.UUID)
		case rc.CeilingMiB < g.MemoryMiB:
			return fmt.Errorf("%s %d: below the %d MiB of memory request %q consumes on GPU %s (its guarantee); a ceiling is at least the guarantee", rc.CeilingField, rc.CeilingMiB, g.MemoryMiB, g.Request, g.Device)
		case rc.CeilingMiB > gpu.MemoryMiB:
			return fmt.Errorf("%s %d: more than GPU %s (%s) has (%d MiB); a ceiling is at most the GPU's memory", rc.CeilingField, rc.CeilingMiB, g.Device, g.UUID, gpu.MemoryMiB)
		case rc.CeilingMiB > g.MemoryMiB:
			g.CeilingMiB = rc.CeilingMiB
		}
	}
	return nil
}
