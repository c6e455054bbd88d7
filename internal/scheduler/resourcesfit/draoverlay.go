package resourcesfit

// Claims freed and charged within a cycle: PreFilterExtensions for
// DynamicResources. kube-scheduler's DynamicResources (v1.36) has none:
// its allocator is built in PreFilter from the claims allocated then, so
// in a preemption dry run the claims of the pods taken off a node still
// hold their devices, no node ever fits, and kube-scheduler never
// preempts for a claim; nor does a pod nominated to a node hold the room
// its preemption freed. Here AddPod and RemovePod keep, in the copy of
// the cycle's state kube-scheduler makes, the pods taken off each node
// and the pods put on it, and Filter runs the structured allocator, as
// DynamicResources builds it, on the devices those pods' claims free or
// take (docs/scheduler.md, "Preemption of claims").

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/utils/ptr"
)

const overlayKey fwk.StateKey = DRAName + "/overlay"

// draOverlay is one copy of a cycle's state: the nodes kube-scheduler
// took pods off or put pods on.
type draOverlay struct {
	// base is the claim tracker's allocated state and the slices, read
	// once per cycle on first use; shared by every copy.
	base  *draBase
	nodes map[string]*nodeOverlay
}

// nodeOverlay is what changed on one node.
type nodeOverlay struct {
	// removed are the pods taken off, by UID.
	removed map[types.UID]*corev1.Pod
	// added are pods put on that the node does not hold: pods
	// nominated to it, not bound yet.
	added []*corev1.Pod
	// last is the pod's allocation at the last Filter that fitted.
	last []resourceapi.AllocationResult
}

// Clone copies the nodes: each copy of a state changes apart.
func (o *draOverlay) Clone() fwk.StateData {
	c := &draOverlay{base: o.base, nodes: make(map[string]*nodeOverlay, len(o.nodes))}
	for k, n := range o.nodes {
		cn := &nodeOverlay{removed: make(map[types.UID]*corev1.Pod, len(n.removed)), added: append([]*corev1.Pod(nil), n.added...), last: n.last}
		for uid, p := range n.removed {
			cn.removed[uid] = p
		}
		c.nodes[k] = cn
	}
	return c
}

func readOverlay(cs fwk.CycleState) *draOverlay {
	d, err := cs.Read(overlayKey)
	if err != nil {
		return nil
	}
	o, _ := d.(*draOverlay)
	return o
}

// OverlayAllocation is the allocation of the pod's claims on the node at
// the last Filter of this copy of the cycle's state that ran the
// allocator with pods taken off or put on the node (nil if none).
func OverlayAllocation(cs fwk.CycleState, node string) []resourceapi.AllocationResult {
	if o := readOverlay(cs); o != nil && o.nodes[node] != nil {
		return o.nodes[node].last
	}
	return nil
}

// draBase is what the allocator starts from in one cycle.
type draBase struct {
	once   sync.Once
	err    error
	state  *structured.AllocatedState
	slices []*resourceapi.ResourceSlice
	mu     sync.Mutex
	byNode map[string]*nodeBase
}

// nodeBase is the part of the base one node's allocation reads: the
// slices that may serve the node and the allocated devices of their
// pools.
type nodeBase struct {
	slices []*resourceapi.ResourceSlice
	state  structured.AllocatedState
}

func (b *draBase) load(m fwk.SharedDRAManager) error {
	b.once.Do(func() {
		for range 5 {
			if b.state, b.err = m.ResourceClaims().GatherAllocatedState(); b.err == nil {
				break
			}
		}
		if b.err == nil && b.state == nil {
			b.err = errors.New("no allocated state")
		}
		if b.err == nil {
			b.slices, b.err = m.ResourceSlices().ListWithDeviceTaintRules()
		}
		b.byNode = map[string]*nodeBase{}
	})
	return b.err
}

// forNode is the node's part of the base, made on first use.
func (b *draBase) forNode(node *corev1.Node, fts structured.Features) (*nodeBase, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if nb := b.byNode[node.Name]; nb != nil {
		return nb, nil
	}
	nb := &nodeBase{state: structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}}
	type poolID struct{ driver, pool string }
	pools := map[poolID]bool{}
	for _, s := range b.slices {
		ok, err := structured.NodeMatches(fts, node, ptr.Deref(s.Spec.NodeName, ""), ptr.Deref(s.Spec.AllNodes, false), s.Spec.NodeSelector)
		if err != nil {
			return nil, err
		}
		if ok || ptr.Deref(s.Spec.PerDeviceNodeSelection, false) {
			nb.slices = append(nb.slices, s)
			pools[poolID{s.Spec.Driver, s.Spec.Pool.Name}] = true
		}
	}
	in := func(id structured.DeviceID) bool { return pools[poolID{id.Driver.String(), id.Pool.String()}] }
	for id := range b.state.AllocatedDevices {
		if in(id) {
			nb.state.AllocatedDevices.Insert(id)
		}
	}
	for id := range b.state.AllocatedSharedDeviceIDs {
		if in(id.GetDeviceID()) {
			nb.state.AllocatedSharedDeviceIDs.Insert(id)
		}
	}
	for id, c := range b.state.AggregatedCapacity {
		if in(id) {
			nb.state.AggregatedCapacity[id] = c.Clone()
		}
	}
	b.byNode[node.Name] = nb
	return nb, nil
}

// overlayFor is the state's overlay of the node, made on first use.
func overlayFor(cs fwk.CycleState, node string) *nodeOverlay {
	o := readOverlay(cs)
	if o == nil {
		o = &draOverlay{base: &draBase{}, nodes: map[string]*nodeOverlay{}}
		cs.Write(overlayKey, o)
	}
	n := o.nodes[node]
	if n == nil {
		n = &nodeOverlay{removed: map[types.UID]*corev1.Pod{}}
		o.nodes[node] = n
	}
	return n
}

// PreFilterExtensions: AddPod and RemovePod keep the state's overlay.
func (d *dynamicResources) PreFilterExtensions() fwk.PreFilterExtensions { return d }

// AddPod puts a pod on the node: one a dry run took off, or a pod
// nominated to the node whose claims are not allocated yet (Filter
// allocates them first, so the pod being filtered leaves their room).
func (d *dynamicResources) AddPod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, added fwk.PodInfo, ni fwk.NodeInfo) *fwk.Status {
	pod := added.GetPod()
	if len(pod.Spec.ResourceClaims) == 0 {
		return nil
	}
	n := overlayFor(cs, ni.Node().Name)
	if _, ok := n.removed[pod.UID]; ok {
		delete(n.removed, pod.UID)
		return nil
	}
	if pod.Spec.NodeName != "" {
		return nil // bound: its claims are allocated already
	}
	for _, p := range n.added {
		if p.UID == pod.UID {
			return nil
		}
	}
	n.added = append(n.added, pod)
	return nil
}

// RemovePod takes a pod off the node: its claims free their devices
// when no other pod they are reserved for remains.
func (d *dynamicResources) RemovePod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, removed fwk.PodInfo, ni fwk.NodeInfo) *fwk.Status {
	pod := removed.GetPod()
	if len(pod.Spec.ResourceClaims) == 0 {
		return nil
	}
	n := overlayFor(cs, ni.Node().Name)
	for i, p := range n.added {
		if p.UID == pod.UID {
			n.added = append(n.added[:i:i], n.added[i+1:]...)
			return nil
		}
	}
	n.removed[pod.UID] = pod
	return nil
}

// Filter is DynamicResources' own, except on a node this copy of the
// state took pods off or put pods on: there the allocator runs on the
// devices as they would be.
func (d *dynamicResources) Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	if o := readOverlay(cs); o != nil && d.fh != nil {
		if n := o.nodes[ni.Node().Name]; n != nil && (len(n.removed) > 0 || len(n.added) > 0) {
			if st, done := d.filterOverlay(ctx, o, n, pod, ni); done {
				return st
			}
		}
	}
	st := d.DynamicResources.Filter(ctx, cs, pod, ni)
	if st.Code() == fwk.UnschedulableAndUnresolvable && d.preemptionMightHelp(ctx, cs, pod, ni) {
		// DynamicResources calls every allocation failure unresolvable,
		// which keeps the node from preemption's candidates.
		return fwk.NewStatus(fwk.Unschedulable, st.Reasons()...)
	}
	return st
}

// preemptionMightHelp reports whether the pod's claims, which do not fit
// the node, would with the claims of every pod of lower priority on it
// freed (the first step of a preemption dry run). Only a pod that may
// preempt, on a node with such pods using claims, is checked.
func (d *dynamicResources) preemptionMightHelp(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) bool {
	o := readOverlay(cs)
	if o == nil || d.fh == nil || ptr.Deref(pod.Spec.PreemptionPolicy, corev1.PreemptLowerPriority) == corev1.PreemptNever {
		return false
	}
	prio := corev1helpers.PodPriority(pod)
	n := &nodeOverlay{removed: map[types.UID]*corev1.Pod{}}
	for _, pi := range ni.GetPods() {
		if p := pi.GetPod(); len(p.Spec.ResourceClaims) > 0 && corev1helpers.PodPriority(p) < prio {
			n.removed[p.UID] = p
		}
	}
	if len(n.removed) == 0 {
		return false
	}
	st, done := d.filterOverlay(ctx, o, n, pod, ni)
	return done && st.IsSuccess()
}

// filterOverlay allocates the pod's claims on the node with the claims
// of the pods taken off freed and those of the pods put on allocated
// first. done is false where DynamicResources' own Filter decides: no
// claim to allocate, a claim being allocated, or a claim for extended
// resources (KEP-5004), which the overlay does not model.
func (d *dynamicResources) filterOverlay(ctx context.Context, o *draOverlay, n *nodeOverlay, pod *corev1.Pod, ni fwk.NodeInfo) (st *fwk.Status, done bool) {
	logger := klog.FromContext(ctx)
	m := d.fh.SharedDRAManager()
	node := ni.Node()
	claims, err := PodClaims(m, pod)
	if err != nil || len(claims) == 0 {
		return nil, false
	}
	var toAllocate []*resourceapi.ResourceClaim
	for _, c := range claims {
		if a := c.Status.Allocation; a != nil {
			if a.NodeSelector != nil {
				sel, err := nodeaffinity.NewNodeSelector(a.NodeSelector)
				if err != nil || !sel.Match(node) {
					return nil, false
				}
			}
			continue
		}
		if m.ResourceClaims().GetPendingAllocation(c.UID) != nil {
			return nil, false
		}
		toAllocate = append(toAllocate, c)
	}
	if len(toAllocate) == 0 {
		return nil, false
	}
	if err := o.base.load(m); err != nil {
		return fwk.AsStatus(fmt.Errorf("%s: allocated devices: %w", DRAName, err)), true
	}
	nb, err := o.base.forNode(node, d.features)
	if err != nil {
		return fwk.AsStatus(err), true
	}
	state := cloneState(&nb.state)
	for _, c := range freedClaims(m, n.removed) {
		charge(state, c.Status.Allocation, false)
	}
	allocate := func(cs []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
		a, err := structured.NewAllocator(ctx, d.features, *state, m.DeviceClasses(), nb.slices, d.celCache)
		if err != nil {
			return nil, err
		}
		return a.Allocate(ctx, node, cs)
	}
	// The pods nominated to the node take their room first; one whose
	// room is not free yet (its victims still hold it) charges nothing.
	for _, p := range n.added {
		pcs, err := PodClaims(m, p)
		if err != nil {
			continue
		}
		var want []*resourceapi.ResourceClaim
		for _, c := range pcs {
			if c.Status.Allocation == nil && m.ResourceClaims().GetPendingAllocation(c.UID) == nil {
				want = append(want, c)
			}
		}
		if len(want) == 0 {
			continue
		}
		res, err := allocate(want)
		if err != nil || len(res) != len(want) {
			continue
		}
		for i := range res {
			charge(state, &res[i], true)
		}
	}
	res, err := allocate(toAllocate)
	switch {
	case errors.Is(err, structured.ErrFailedAllocationOnNode) || err == nil && len(res) != len(toAllocate):
		n.last = nil
		msg := "cannot allocate all claims"
		if err != nil {
			msg = err.Error()
		}
		return fwk.NewStatus(fwk.Unschedulable, msg), true
	case err != nil:
		logger.V(4).Info("Allocation with pods taken off or put on failed", "pod", klog.KObj(pod), "node", node.Name, "err", err)
		return fwk.AsStatus(err), true
	}
	n.last = res
	return nil, true
}

// PodClaims are the pod's claims as the claim tracker has them (entries
// that need no claim left out).
func PodClaims(m fwk.SharedDRAManager, pod *corev1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			return nil, err
		}
		if name == nil {
			continue
		}
		c, err := m.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// freedClaims are the allocated claims of the pods that every consumer
// they are reserved for is among the pods (a claim shared with a pod
// that stays, or reserved for something other than a pod, stays).
func freedClaims(m fwk.SharedDRAManager, pods map[types.UID]*corev1.Pod) []*resourceapi.ResourceClaim {
	seen := sets.New[types.UID]()
	var out []*resourceapi.ResourceClaim
	for _, p := range pods {
		cs, err := PodClaims(m, p)
		if err != nil {
			continue
		}
		for _, c := range cs {
			if c.Status.Allocation == nil || seen.Has(c.UID) {
				continue
			}
			seen.Insert(c.UID)
			if ClaimFreedBy(c, func(uid types.UID) bool { _, ok := pods[uid]; return ok }) {
				out = append(out, c)
			}
		}
	}
	return out
}

// ClaimFreedBy reports whether taking off the pods gone names frees the
// allocated claim: it is reserved for pods only, all of them gone. (A
// claim reserved for nothing is held by no pod: freed.)
func ClaimFreedBy(c *resourceapi.ResourceClaim, gone func(types.UID) bool) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" || !gone(r.UID) {
			return false
		}
	}
	return true
}

// forEachDevice calls f for each device the allocation holds (admin
// access holds none, as the claim tracker counts them).
func forEachDevice(a *resourceapi.AllocationResult, f func(r *resourceapi.DeviceRequestAllocationResult)) {
	if a == nil {
		return
	}
	for i := range a.Devices.Results {
		if r := &a.Devices.Results[i]; !ptr.Deref(r.AdminAccess, false) {
			f(r)
		}
	}
}

// charge adds an allocation's devices to the state (add), or frees them.
func charge(state *structured.AllocatedState, a *resourceapi.AllocationResult, add bool) {
	forEachDevice(a, func(r *resourceapi.DeviceRequestAllocationResult) {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		switch {
		case r.ShareID == nil && add:
			state.AllocatedDevices.Insert(id)
		case r.ShareID == nil:
			state.AllocatedDevices.Delete(id)
		case add:
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
		default:
			state.AllocatedSharedDeviceIDs.Delete(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Remove(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
		}
	})
}

func cloneState(s *structured.AllocatedState) *structured.AllocatedState {
	return &structured.AllocatedState{AllocatedDevices: s.AllocatedDevices.Clone(), AllocatedSharedDeviceIDs: s.AllocatedSharedDeviceIDs.Clone(),
		AggregatedCapacity: s.AggregatedCapacity.Clone()}
}

// newOverlayParts are what the overlay's allocator is built with, as
// DynamicResources builds its own.
func newOverlayParts(fts plfeature.Features) (structured.Features, *cel.Cache) {
	return dynamicresources.AllocatorFeatures(fts), cel.NewCache(10, cel.Features{
		EnableConsumableCapacity: fts.EnableDRAConsumableCapacity,
		EnableListTypeAttributes: fts.EnableDRAListTypeAttributes,
	})
}
