package kubeobj

import (
	"fmt"
	"math"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

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
	// b + 1 MiB - 1 would overflow for b near math.MaxInt64.
	m := b >> 20
	if b&(1<<20-1) != 0 {
		m++
	}
	return m, nil
}

// MaxChargeMiB is the largest GPU memory charge, in MiB, whose byte count
// fits an int64 (a Quantity's value): charges saturate there instead of
// wrapping around to a small or negative number.
const MaxChargeMiB = math.MaxInt64 >> 20

// AddMiB adds two non-negative charges in MiB, saturating at MaxChargeMiB.
func AddMiB(a, b int64) int64 {
	a, b = min(max(a, 0), MaxChargeMiB), min(max(b, 0), MaxChargeMiB)
	if a > MaxChargeMiB-b {
		return MaxChargeMiB
	}
	return a + b
}

// MulMiB multiplies a non-negative count by a non-negative charge in MiB,
// saturating at MaxChargeMiB.
func MulMiB(n, mib int64) int64 {
	if n <= 0 || mib <= 0 {
		return 0
	}
	if mib > MaxChargeMiB/n {
		return MaxChargeMiB
	}
	return n * mib
}

// ClaimRequest is what one request of a claim spec asks of Tessera's
// DRA driver (a request of another driver's class is not one). A
// prioritized list (firstAvailable) gives one ClaimRequest per
// subrequest, with the same Request and Sub naming each.
type ClaimRequest struct {
	Request string `json:"request"`
	// Sub is the subrequest's name in a prioritized list ("" otherwise).
	Sub   string `json:"subrequest,omitempty"`
	Class string `json:"deviceClass"`
	// Count is the number of GPUs (allocationMode ExactCount); All is
	// allocationMode All.
	Count int64 `json:"count,omitempty"`
	All   bool  `json:"all,omitempty"`
	// MemoryMiB and Cores are the capacity asked per GPU (memory rounded
	// up to a MiB); 0 memory: the GPU whole (docs/dra.md, "Capacities
	// and defaults").
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	Cores     int64 `json:"cores,omitempty"`
	// Selectors is the number of CEL selectors (evaluated by the
	// scheduler's DynamicResources plugin).
	Selectors int `json:"selectors,omitempty"`
	// Field is the request's path in the claim spec
	// ("devices.requests[0].firstAvailable[1]").
	Field string `json:"-"`
}

// Whole reports whether the request takes its GPUs whole.
func (r ClaimRequest) Whole() bool { return r.MemoryMiB == 0 }

// Devices is the most GPUs the request may get: its count, or for
// allocationMode All the most results an allocation may hold (the worst
// case Kubernetes' own claim quota charges too). The API server bounds
// no count, but no allocation holds more than AllocationResultsMaxSize
// results, so a larger count is read as that many.
func (r ClaimRequest) Devices() int64 {
	if r.All {
		return resourceapi.AllocationResultsMaxSize
	}
	return min(r.Count, resourceapi.AllocationResultsMaxSize)
}

// TesseraClass reports whether a DeviceClass is served by Tessera's
// driver.
func TesseraClass(class string) bool {
	for _, c := range api.DeviceClasses() {
		if c == class {
			return true
		}
	}
	return false
}

// ClaimRequests reads the requests of a claim spec that Tessera's
// classes serve. A capacity request that is not a byte count is read as
// no memory: the GPU whole.
func ClaimRequests(spec resourceapi.ResourceClaimSpec) []ClaimRequest {
	out, _ := claimRequests(spec, nil)
	return out
}

// claimRequests is ClaimRequests, with each request's Field under
// specPath (nil: paths within the spec), and the first memory request
// larger than any GPU (api.MaxGPUMemoryMiB) as an error naming its
// field, the value and the limit.
func claimRequests(spec resourceapi.ResourceClaimSpec, specPath *field.Path) ([]ClaimRequest, error) {
	var out []ClaimRequest
	var first error
	one := func(path *field.Path, name, sub, class string, mode resourceapi.DeviceAllocationMode, count int64, capacity *resourceapi.CapacityRequirements, selectors int) {
		if !TesseraClass(class) {
			return
		}
		cr := ClaimRequest{Request: name, Sub: sub, Class: class, Selectors: selectors, Field: path.String()}
		if mode == resourceapi.DeviceAllocationModeAll {
			cr.All = true
		} else {
			cr.Count = max(count, 1)
		}
		if capacity != nil {
			if q, ok := claimCapacity(capacity.Requests, api.CapacityMemory); ok {
				if q.Cmp(*resource.NewQuantity(api.MaxGPUMemoryMiB<<20, resource.BinarySI)) > 0 {
					cr.MemoryMiB = MaxChargeMiB
					if m, err := WholeMiB(q); err == nil {
						cr.MemoryMiB = m
					}
					if first == nil {
						key := api.CapacityMemory
						if _, plain := capacity.Requests[resourceapi.QualifiedName(key)]; !plain {
							key = api.DRADriverName + "/" + key
						}
						first = field.Invalid(path.Child("capacity", "requests").Key(key), q.String(),
							fmt.Sprintf("more GPU memory than any GPU has: at most %d MiB (%s) per GPU", api.MaxGPUMemoryMiB, resource.NewQuantity(api.MaxGPUMemoryMiB<<20, resource.BinarySI)))
					}
				} else if m, err := WholeMiB(q); err == nil {
					cr.MemoryMiB = m
				}
			}
			if q, ok := claimCapacity(capacity.Requests, api.CapacityCores); ok {
				cr.Cores = q.Value()
			}
		}
		out = append(out, cr)
	}
	requests := specPath.Child("devices", "requests")
	for i, r := range spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			one(requests.Index(i).Child("exactly"), r.Name, "", e.DeviceClassName, e.AllocationMode, e.Count, e.Capacity, len(e.Selectors))
		}
		for j, s := range r.FirstAvailable {
			one(requests.Index(i).Child("firstAvailable").Index(j), r.Name, s.Name, s.DeviceClassName, s.AllocationMode, s.Count, s.Capacity, len(s.Selectors))
		}
	}
	return out, first
}

// claimCapacity is a capacity request by its name in Tessera's domain,
// written unqualified or qualified.
func claimCapacity(reqs map[resourceapi.QualifiedName]resource.Quantity, name string) (resource.Quantity, bool) {
	if q, ok := reqs[resourceapi.QualifiedName(name)]; ok {
		return q, true
	}
	q, ok := reqs[resourceapi.QualifiedName(api.DRADriverName+"/"+name)]
	return q, ok
}

// ClaimChargeMiB is the GPU memory a claim spec may hold through
// Tessera's driver, in MiB: per request its GPUs times the memory asked,
// or times largestMiB (the largest GPU in the cluster) when it asks none
// and so takes GPUs whole; for a prioritized list the costliest
// alternative. The arithmetic saturates at MaxChargeMiB. A memory request
// larger than any GPU (api.MaxGPUMemoryMiB) is an error naming its field
// under specPath (the spec's path in its object: "spec" in a claim,
// "spec.spec" in a template), the value and the limit.
func ClaimChargeMiB(spec resourceapi.ResourceClaimSpec, specPath *field.Path, largestMiB int64) (int64, error) {
	reqs, err := claimRequests(spec, specPath)
	if err != nil {
		return 0, err
	}
	if err := claimConfigErrors(spec, specPath, reqs, largestMiB); err != nil {
		return 0, err
	}
	per := map[string]int64{}
	for _, r := range reqs {
		mem := r.MemoryMiB
		if r.Whole() {
			mem = largestMiB
		}
		per[r.Request] = max(per[r.Request], MulMiB(r.Devices(), mem))
	}
	var sum int64
	for _, v := range per {
		sum = AddMiB(sum, v)
	}
	return sum, nil
}

// ClaimNamesClass reports whether a claim's spec asks for a device of one
// of the classes (a request's exactly or one of its firstAvailable
// subrequests).
func ClaimNamesClass(spec resourceapi.ResourceClaimSpec, classes []string) bool {
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil && slices.Contains(classes, r.Exactly.DeviceClassName) {
			return true
		}
		for _, s := range r.FirstAvailable {
			if slices.Contains(classes, s.DeviceClassName) {
				return true
			}
		}
	}
	return false
}

// claimConfigErrors checks the opaque configurations of Tessera's driver
// in a claim spec: each decodes (api.DecodeGPUConfig), and a memory
// ceiling (memoryCeilingMiB) is at least the memory every request it
// applies to asks per GPU (its guarantee), which must ask some (a GPU
// taken whole has nothing to borrow), and at most largestMiB (the largest
// GPU in the cluster; 0: unknown). The first error names the field, the
// value and the limit.
func claimConfigErrors(spec resourceapi.ResourceClaimSpec, specPath *field.Path, reqs []ClaimRequest, largestMiB int64) error {
	for i, c := range spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != api.DRADriverName {
			continue
		}
		path := specPath.Child("devices", "config").Index(i).Child("opaque", "parameters")
		gc, err := api.DecodeGPUConfig(c.Opaque.Parameters.Raw)
		if err != nil {
			return field.Invalid(path, string(c.Opaque.Parameters.Raw), err.Error())
		}
		if gc.MemoryCeilingMiB == nil {
			continue
		}
		ceiling := *gc.MemoryCeilingMiB
		path = path.Child("memoryCeilingMiB")
		if largestMiB > 0 && ceiling > largestMiB {
			return field.Invalid(path, ceiling, fmt.Sprintf("exceeds the largest GPU in the cluster (%d MiB): a ceiling is at most one GPU's memory", largestMiB))
		}
		for _, r := range reqs {
			if len(c.Requests) > 0 && !slices.Contains(c.Requests, r.Request) && (r.Sub == "" || !slices.Contains(c.Requests, r.Request+"/"+r.Sub)) {
				continue
			}
			switch {
			case r.Whole():
				return field.Invalid(path, ceiling, fmt.Sprintf("request %q (%s) asks no memory capacity, so it takes its GPUs whole and has nothing to borrow: ask capacity.requests.memory (the guarantee) at most the ceiling, or drop the ceiling", r.Request, r.Field))
			case r.MemoryMiB > ceiling:
				return field.Invalid(path, ceiling, fmt.Sprintf("below the memory request %q asks (%s: %d MiB per GPU, its guarantee): a ceiling is at least the guarantee", r.Request, r.Field, r.MemoryMiB))
			}
		}
	}
	return nil
}
