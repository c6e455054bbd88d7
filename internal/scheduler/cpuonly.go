package scheduler

// Pods that ask no GPU, in the plugin's profile: placed by the policy, as
// `tessera-sim` places a trace's CPU-only tasks.

import (
	"context"
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// preFilterCPUOnly narrows a pod that asks no GPU to the policy's best
// candidates by its CPU and memory (a policy that weighs them, such as
// bestfit, packs such pods and keeps CPU free elsewhere). Pods with
// ResourceClaims are narrowed by their claims (draclaims.go). Where there is
// nothing to narrow (an invalid request, no node fits in the plugin's
// view, or a retry over every node) the plugin skips the pod, and the
// profile's other plugins place it as before.
func (p *Plugin) preFilterCPUOnly(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	skip := fwk.NewStatus(fwk.Skip)
	// A pod with ResourceClaims may need a node in mode dra for them,
	// which its CPU alone does not tell: its claims place it
	// (draclaims.go).
	if len(pod.Spec.ResourceClaims) > 0 {
		cs.Write(refKey, pluginRef{p}) // for preemption (preemptclaims.go)
		return p.preFilterClaims(ctx, cs, pod, nodes)
	}
	if p.wide(pod.UID) {
		return nil, skip
	}
	if err := p.waitSynced(ctx); err != nil {
		return nil, skip
	}
	req, err := podrequest.FromPod(pod, p.names)
	if err != nil {
		return nil, skip
	}
	p.st.mu.RLock()
	cr, err := p.st.cluster.Compile(req)
	n := len(p.st.slot)
	p.st.mu.RUnlock()
	if err != nil || cr.NeedsGPU() {
		return nil, skip
	}
	pol := placement.PolicyFor(cr, p.policy)
	if obs, ok := pol.(placement.Observer); ok && p.firstAttempt(pod.UID) {
		p.st.mu.Lock()
		obs.Observe(cr)
		p.st.mu.Unlock()
	}
	pol = placement.Prepare(cr, pol)
	scores := make([]float64, n)
	for i := range scores {
		scores[i] = math.NaN()
	}
	s := &cycleState{cr: cr, pol: pol, ranker: placement.RankerFor(cr, pol), scores: scores, cpuOnly: true, draWhy: "no GPU asked",
		rules: p.rulesFor(ctx, pod, nodes)}
	names := p.candidates(ctx, s)
	if names == nil {
		return nil, skip
	}
	s.narrowed = true
	cs.Write(stateKey, s)
	return &fwk.PreFilterResult{NodeNames: names}, nil
}

// reserveCPUOnly charges the pod's CPU and memory on the node (a record
// without GPUs, never written to the pod), so the next pod sees them
// before the binding does; the caller holds st.mu.
func (p *Plugin) reserveCPUOnly(s *cycleState, pod *corev1.Pod, nodeName string, sc *scratch) *fwk.Status {
	if r := p.fit(s, nodeName, sc); !r.OK() {
		return fwk.NewStatus(fwk.Unschedulable, statusText(fmt.Sprintf("node %s changed since filtering: %s", nodeName, r)))
	}
	key := kubeobj.Key(pod)
	if p.st.cluster.Allocation(key) != nil {
		p.st.releaseLocked(key)
	}
	if err := p.st.cluster.AssignRecord(key, s.cr.Req.CPUMilli, s.cr.Req.MemoryMiB, &api.PodAllocation{Node: nodeName}); err != nil {
		return fwk.AsStatus(fmt.Errorf("reserving CPU and memory on %s: %w", nodeName, err))
	}
	p.st.holders[key] = pod.UID
	p.st.publishLocked(nodeName)
	return nil
}
