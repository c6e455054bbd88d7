package scheduler

// Narrowing for pods whose ResourceClaims the placement core understands
// (docs/dra.md, "Placing claims"): PreFilter fits the claims on the model
// of Tessera's DRA GPUs (dramodel.go) and hands kube-scheduler the node
// policy's best Candidates nodes, so DynamicResources runs the structured
// allocator on those few rather than on hundreds. If all of them fail a
// Filter (the allocator's, or another plugin's), PostFilter retries the
// pod at once over every node, as for shares.

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// claimGetter reads a claim as the scheduler sees it (kube-scheduler's
// claim tracker: the informer plus allocations in flight).
type claimGetter interface {
	Get(namespace, name string) (*resourceapi.ResourceClaim, error)
}

// draRequest is the pod's claims as a placement request, one container
// per device request, when the core understands every one of them: a
// request of DeviceClass gpu.tessera.io with exactly a count of devices,
// asking at most capacity memory and cores, with no selectors,
// tolerations, admin access or constraints, in claims not yet allocated.
// Otherwise it says why not (nil request; result: the metric's label,
// detail: the claim and request, for the log): DynamicResources then
// filters every node, and PreScore ranks the DRA nodes that fit.
func draRequest(pod *corev1.Pod, claims claimGetter) (req *placement.Request, result, detail string) {
	req = &placement.Request{Pod: pod.Namespace + "/" + pod.Name}
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, _, err := resourceclaim.Name(pod, pc)
		if err != nil {
			return nil, "claimMissing", err.Error()
		}
		if name == nil {
			continue // no claim needed for this entry
		}
		c, err := claims.Get(pod.Namespace, *name)
		if err != nil {
			return nil, "claimMissing", fmt.Sprintf("claim %s: %v", *name, err)
		}
		if c.Status.Allocation != nil {
			return nil, "allocated", fmt.Sprintf("claim %s is already allocated", *name)
		}
		if len(c.Spec.Devices.Constraints) > 0 {
			return nil, "constraints", fmt.Sprintf("claim %s has constraints", *name)
		}
		for _, r := range c.Spec.Devices.Requests {
			ct, result, why := draContainer(&r)
			if result != "" {
				return nil, result, fmt.Sprintf("claim %s, request %s: %s", *name, r.Name, why)
			}
			req.Containers = append(req.Containers, ct)
		}
	}
	if len(req.Containers) == 0 {
		return nil, "noDeviceRequests", "no device requests"
	}
	return req, "", ""
}

// draContainer is one device request as a container of the placement
// request: count GPUs, each with the memory (rounded up to a MiB, as the
// node agent limits it) and cores asked. A request without memory holds
// its GPUs whole (its memory default is the GPU's): exclusive.
func draContainer(r *resourceapi.DeviceRequest) (c placement.Container, result, detail string) {
	e := r.Exactly
	switch {
	case e == nil:
		return c, "firstAvailable", "firstAvailable"
	case e.DeviceClassName != api.DeviceClassGPU:
		return c, "deviceClass", "DeviceClass " + e.DeviceClassName
	case e.AdminAccess != nil && *e.AdminAccess:
		return c, "adminAccess", "adminAccess"
	case len(e.Selectors) > 0:
		return c, "selectors", "selectors"
	case len(e.Tolerations) > 0:
		return c, "tolerations", "tolerations"
	case e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount:
		return c, "allocationMode", "allocationMode " + string(e.AllocationMode)
	case e.Count > api.MaxGPUsPerNode:
		return c, "count", fmt.Sprintf("count %d", e.Count)
	}
	// Named by the request alone: pods of one template have one shape
	// (placement.Memo).
	c = placement.Container{Name: r.Name, GPUs: int(max(e.Count, 1))}
	var memory, cores int64
	if e.Capacity != nil {
		for k, q := range e.Capacity.Requests {
			switch k {
			case api.CapacityMemory:
				memory = mib(&q)
			case api.CapacityCores:
				cores = q.Value()
			default:
				return placement.Container{}, "capacity", "capacity " + string(k)
			}
		}
	}
	if cores < 0 || cores > api.MaxCores || memory < 0 {
		return placement.Container{}, "capacity", "capacity out of range"
	}
	if memory > 0 {
		c.MemoryMiB, c.Cores = memory, int(cores)
	}
	return c, "", ""
}

// preFilterClaims narrows a pod with ResourceClaims and no GPU extended
// resource to the node policy's best DRA nodes for its claims, when the
// model understands them; otherwise (or on a retry over every node) the
// plugin skips the pod's filtering and only ranks (PreScore).
func (p *Plugin) preFilterClaims(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	skip := fwk.NewStatus(fwk.Skip)
	switch {
	case p.wide(pod.UID):
		claimPodsTotal.WithLabelValues("retry").Inc()
		return nil, skip
	case !p.draReady():
		claimPodsTotal.WithLabelValues("notReady").Inc()
		return nil, skip
	}
	if err := p.waitSynced(ctx); err != nil {
		claimPodsTotal.WithLabelValues("notReady").Inc()
		return nil, skip
	}
	logger := klog.FromContext(ctx)
	req, result, why := draRequest(pod, p.handle.SharedDRAManager().ResourceClaims())
	if req == nil {
		claimPodsTotal.WithLabelValues(result).Inc()
		logger.V(5).Info("Claims not narrowed", "pod", klog.KObj(pod), "reason", why)
		return nil, skip
	}
	p.dra.mu.Lock()
	defer p.dra.mu.Unlock()
	cr, err := p.dra.cluster.Compile(req)
	if err != nil || !cr.NeedsGPU() {
		claimPodsTotal.WithLabelValues("invalid").Inc()
		logger.V(5).Info("Claims not narrowed", "pod", klog.KObj(pod), "err", err)
		return nil, skip
	}
	if err := p.refreshDRA(); err != nil {
		claimPodsTotal.WithLabelValues("notReady").Inc()
		logger.V(4).Info("Claims not narrowed: the claims' allocated state could not be read", "pod", klog.KObj(pod), "err", err)
		return nil, skip
	}
	pol := placement.Prepare(cr, p.draNodePolicy(pod))
	s := &cycleState{cr: cr, pol: pol, ranker: placement.RankerFor(cr, pol), rules: p.rulesFor(ctx, pod, nodes)}
	top := p.search(ctx, s, p.dra.cluster.Nodes(), p.dra.memo, nil)
	if len(top) == 0 {
		// No DRA GPU fits in the model: DynamicResources filters every
		// node and says why each failed.
		claimPodsTotal.WithLabelValues("notFitting").Inc()
		return nil, skip
	}
	claimPodsTotal.WithLabelValues("narrowed").Inc()
	names := sets.New[string]()
	scores := make(map[string]int64, len(top))
	for i, c := range top {
		names.Insert(c.name)
		scores[c.name] = fwk.MaxScore - int64(i) // the policy's order
	}
	cs.Write(draStateKey, &draCycle{scores: scores, narrowed: true})
	return &fwk.PreFilterResult{NodeNames: names}, nil
}
