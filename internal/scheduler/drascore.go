package scheduler

// Scoring of DRA nodes for pods that hold GPUs through ResourceClaims
// (docs/dra.md, "Packing claims"). DynamicResources finds the nodes whose
// devices fit the pod's claims and, within a node, the structured
// allocator takes the first device that fits, so a GPU fills before the
// next; across nodes nothing ranks them, and the pods spread over as many
// nodes (and GPUs) as the scheduler happens to pick. Here the node policy
// ranks them by how much of their Tessera GPUs' memory claims already
// hold: binpack prefers the fullest node that fits, spread the emptiest.

import (
	"context"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/api"
)

const draStateKey fwk.StateKey = Name + "/dra"

// draCycle is PreScore's view of the DRA nodes for one pod: the score of
// each node in mode dra, already in [0, MaxScore].
type draCycle struct {
	scores map[string]int64
}

// Clone shares the scores: they are not changed after PreScore.
func (d *draCycle) Clone() fwk.StateData { return d }

func readDRACycle(cs fwk.CycleState) *draCycle {
	if cs == nil {
		return nil
	}
	d, err := cs.Read(draStateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*draCycle)
	return s
}

// draSpread reports whether the pod's node policy (its annotation, else
// the profile's) is spread.
func (p *Plugin) draSpread(pod *corev1.Pod) bool {
	if sel, err := api.ParsePodSelectors(pod.Annotations); err == nil && sel.NodePolicy != "" {
		return sel.NodePolicy == api.NodeSpread
	}
	return p.policy != nil && p.policy.Name() == string(api.NodeSpread)
}

// draPreScore scores the feasible nodes in mode dra for a pod with
// ResourceClaims that Tessera does not place itself (PreFilter skipped
// it): the fraction of the memory of the node's gpu.tessera.io devices
// that allocated claims (and claims being allocated) consume; a device
// allocated exclusively counts whole. Skip when there is nothing to rank.
func (p *Plugin) draPreScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	if len(pod.Spec.ResourceClaims) == 0 || p.handle == nil || p.handle.SharedDRAManager() == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	want := make(map[string]bool, len(nodes))
	p.st.mu.RLock()
	for _, ni := range nodes {
		if name := ni.Node().Name; p.st.isDRA(name) {
			want[name] = true
		}
	}
	p.st.mu.RUnlock()
	if len(want) < 2 {
		return fwk.NewStatus(fwk.Skip)
	}
	m := p.handle.SharedDRAManager()
	slices, err := m.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return fwk.NewStatus(fwk.Skip)
	}
	// The claim tracker refuses a state that changed while it was read;
	// scoring is a preference, so a few tries, then no ranking.
	var alloc *structured.AllocatedState
	for range 3 {
		if alloc, err = m.ResourceClaims().GatherAllocatedState(); err == nil {
			break
		}
	}
	if err != nil {
		return fwk.NewStatus(fwk.Skip)
	}
	used := make(map[string]float64, len(want))
	total := make(map[string]float64, len(want))
	for _, s := range slices {
		if s.Spec.Driver != api.DRADriverName || s.Spec.NodeName == nil || !want[*s.Spec.NodeName] {
			continue
		}
		node := *s.Spec.NodeName
		for _, d := range s.Spec.Devices {
			c, ok := d.Capacity[api.CapacityMemory]
			if !ok || c.Value.Sign() <= 0 {
				continue
			}
			capacity := c.Value.AsApproximateFloat64()
			total[node] += capacity
			id := structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)
			if alloc.AllocatedDevices.Has(id) {
				used[node] += capacity
			} else if q := alloc.AggregatedCapacity[id][api.CapacityMemory]; q != nil {
				used[node] += math.Min(q.AsApproximateFloat64(), capacity)
			}
		}
	}
	spread := p.draSpread(pod)
	scores := make(map[string]int64, len(want))
	for node := range want {
		f := 0.0
		if total[node] > 0 {
			f = used[node] / total[node]
		}
		if spread {
			f = 1 - f
		}
		scores[node] = int64(math.Round(f * float64(fwk.MaxScore)))
	}
	cs.Write(draStateKey, &draCycle{scores: scores})
	return nil
}
