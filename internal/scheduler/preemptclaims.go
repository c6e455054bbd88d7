package scheduler

// Preemption for pods with ResourceClaims (docs/scheduler.md, "Preemption
// of claims"). TesseraDynamicResources' PreFilterExtensions
// (resourcesfit/draoverlay.go) let every Filter of a dry run see the
// devices that the claims of the pods taken off a node free; here the
// victims on a node are chosen for the GPUs of Tessera's driver: for each
// GPU whose claims a lower-priority pod holds, the pods are given back
// with every Filter checked, the pods not on that GPU first, and the
// cheapest of those choices (and of DefaultPreemption's own order) wins.
// So a claim asking 40 Gi evicts two 20 Gi claims of one GPU rather than
// whatever pods are least important across the node.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/scheduler/resourcesfit"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// refKey names the Tessera plugin in the cycle state of a pod with
// ResourceClaims (which has no cycleState): the preemption plugin keeps
// its plans there.
const refKey fwk.StateKey = Name + "/plugin"

type pluginRef struct{ p *Plugin }

func (r pluginRef) Clone() fwk.StateData { return r }

// pluginOf is the Tessera plugin of the cycle, or nil.
func pluginOf(cs fwk.CycleState) *Plugin {
	if s := readState(cs); s != nil && s.plugin != nil {
		return s.plugin
	}
	if d, err := cs.Read(refKey); err == nil {
		if r, ok := d.(pluginRef); ok {
			return r.p
		}
	}
	return nil
}

// claimVictimChoice is one way of giving the candidates back.
type claimVictimChoice struct {
	victims   []int // indices into the candidates, most important first
	violating int
	target    string // the GPU cleared ("": DefaultPreemption's order)
}

// cheaper orders choices as kube-scheduler orders candidate nodes:
// fewest budget violations, lowest highest priority, fewest pods, lowest
// sum of priorities.
func (c *claimVictimChoice) cheaper(o *claimVictimChoice, cands []fwk.PodInfo) bool {
	if c.violating != o.violating {
		return c.violating < o.violating
	}
	hi := func(v []int) int32 {
		if len(v) == 0 {
			return -1 << 31
		}
		return corev1helpers.PodPriority(cands[v[0]].GetPod()) // most important first
	}
	if a, b := hi(c.victims), hi(o.victims); a != b {
		return a < b
	}
	if len(c.victims) != len(o.victims) {
		return len(c.victims) < len(o.victims)
	}
	sum := func(v []int) int64 {
		var s int64
		for _, i := range v {
			s += int64(corev1helpers.PodPriority(cands[i].GetPod()))
		}
		return s
	}
	return sum(c.victims) < sum(o.victims)
}

// selectClaimVictims chooses the victims on one node for a pod with
// ResourceClaims: every pod of lower priority off (every Filter must then
// pass, else the node is no candidate), then, for DefaultPreemption's own
// order and for each of Tessera's GPUs a candidate's claims hold, the
// pods given back one at a time with every Filter checked (protected
// pods first, then pods not on the GPU, most important first); the
// cheapest result is kept. A claim shared by several pods frees its
// devices only when all of them are off (TesseraDynamicResources), so
// such a pod alone is given back: it frees nothing.
func (pl *Preemption) selectClaimVictims(ctx context.Context, cs fwk.CycleState, p *Plugin, pod *corev1.Pod, ni fwk.NodeInfo, pdbs []*policyv1.PodDisruptionBudget) ([]*corev1.Pod, int, *fwk.Status) {
	logger := klog.FromContext(ctx)
	node := ni.Node().Name
	cands, protected, st := pl.candidates(ni, pod, pdbs)
	if st != nil {
		return nil, 0, st
	}
	remove := func(i int) error {
		if err := ni.RemovePod(logger, cands[i].GetPod()); err != nil {
			return err
		}
		return pl.fh.RunPreFilterExtensionRemovePod(ctx, cs, pod, cands[i], ni).AsError()
	}
	add := func(i int) error {
		ni.AddPodInfo(cands[i])
		return pl.fh.RunPreFilterExtensionAddPod(ctx, cs, pod, cands[i], ni).AsError()
	}
	fits := func() bool { return pl.fh.RunFilterPluginsWithNominatedPods(ctx, cs, pod, ni).IsSuccess() }
	for i := range cands {
		if err := remove(i); err != nil {
			return nil, 0, fwk.AsStatus(err)
		}
	}
	if st := pl.fh.RunFilterPluginsWithNominatedPods(ctx, cs, pod, ni); !st.IsSuccess() {
		return nil, 0, st
	}
	held := p.claimsHeld(cands)
	// try gives the candidates back in the order, each kept where every
	// Filter still passes, and takes them all off again.
	try := func(order []int, target string) (*claimVictimChoice, error) {
		c := &claimVictimChoice{target: target}
		var back []int
		for _, i := range order {
			if err := add(i); err != nil {
				return nil, err
			}
			if fits() {
				back = append(back, i)
				continue
			}
			if err := remove(i); err != nil {
				return nil, err
			}
			c.victims = append(c.victims, i)
			if protected[i] {
				c.violating++
			}
		}
		for _, i := range back {
			if err := remove(i); err != nil {
				return nil, err
			}
		}
		sort.Ints(c.victims)
		return c, nil
	}
	orderFor := func(target string) []int {
		var out []int
		for _, prot := range []bool{true, false} {
			for _, onTarget := range []bool{false, true} {
				for i := range cands {
					if protected[i] == prot && (target == "" && !onTarget || target != "" && held[i].holds(target) == onTarget) {
						out = append(out, i)
					}
				}
			}
		}
		return out
	}
	best, err := try(orderFor(""), "")
	if err != nil {
		return nil, 0, fwk.AsStatus(err)
	}
	for _, t := range targets(held) {
		c, err := try(orderFor(t), t)
		if err != nil {
			return nil, 0, fwk.AsStatus(err)
		}
		if c.cheaper(best, cands) {
			best = c
		}
	}
	victim := make([]bool, len(cands))
	for _, i := range best.victims {
		victim[i] = true
	}
	for i := range cands {
		if !victim[i] {
			if err := add(i); err != nil {
				return nil, 0, fwk.AsStatus(err)
			}
		}
	}
	if st := pl.fh.RunFilterPluginsWithNominatedPods(ctx, cs, pod, ni); !st.IsSuccess() {
		// Each choice passed given back one at a time; all at once
		// must pass too. A plugin that disagrees wins.
		return nil, 0, st
	}
	out := make([]*corev1.Pod, 0, len(best.victims))
	for _, i := range best.victims {
		out = append(out, cands[i].GetPod())
	}
	if len(out) > 0 {
		p.try(pod.UID, p.claimPlan(node, resourcesfit.OverlayAllocation(cs, node), best.victims, cands, held))
	}
	return out, best.violating, fwk.NewStatus(fwk.Success)
}

// heldClaims are the allocated claims of one candidate and the GPUs of
// Tessera's driver they hold ("pool/device").
type heldClaims struct {
	claims []*resourceapi.ResourceClaim
	gpus   []string
}

func (h heldClaims) holds(gpu string) bool { return slices.Contains(h.gpus, gpu) }

// claimsHeld reads the candidates' claims from the claim tracker.
func (p *Plugin) claimsHeld(cands []fwk.PodInfo) []heldClaims {
	out := make([]heldClaims, len(cands))
	if p.handle == nil || p.handle.SharedDRAManager() == nil {
		return out
	}
	m := p.handle.SharedDRAManager()
	for i, pi := range cands {
		cs, err := resourcesfit.PodClaims(m, pi.GetPod())
		if err != nil {
			continue
		}
		for _, c := range cs {
			if c.Status.Allocation == nil {
				continue
			}
			out[i].claims = append(out[i].claims, c)
			for _, r := range c.Status.Allocation.Devices.Results {
				if g := r.Pool + "/" + r.Device; r.Driver == api.DRADriverName && !slices.Contains(out[i].gpus, g) {
					out[i].gpus = append(out[i].gpus, g)
				}
			}
		}
	}
	return out
}

// targets are the GPUs the candidates hold, sorted.
func targets(held []heldClaims) []string {
	var out []string
	for _, h := range held {
		for _, g := range h.gpus {
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
	}
	sort.Strings(out)
	return out
}

// claimPlan is the plan of a claim pod's preemption on the node: the
// GPUs its claims get in the dry run (alloc), the victims, what each
// victim's claims free there, and the claims to wait for.
func (p *Plugin) claimPlan(node string, alloc []resourceapi.AllocationResult, victims []int, cands []fwk.PodInfo, held []heldClaims) *preemptionPlan {
	plan := &preemptionPlan{node: node, freed: map[types.UID]string{}}
	var got []string // pool/device
	for _, a := range alloc {
		for _, r := range a.Devices.Results {
			if g := r.Pool + "/" + r.Device; r.Driver == api.DRADriverName && !slices.Contains(got, g) {
				got = append(got, g)
			}
		}
	}
	for _, g := range got {
		plan.gpus = append(plan.gpus, p.dra.gpuName(g))
	}
	gone := map[types.UID]bool{}
	for _, i := range victims {
		gone[cands[i].GetPod().UID] = true
	}
	for _, i := range victims {
		v := cands[i].GetPod()
		plan.victims = append(plan.victims, v)
		var parts []string
		for _, c := range held[i].claims {
			if !resourcesfit.ClaimFreedBy(c, func(uid types.UID) bool { return gone[uid] }) {
				continue
			}
			plan.claims = append(plan.claims, claimRef{namespace: c.Namespace, name: c.Name, uid: c.UID})
			parts = append(parts, fmt.Sprintf("claim %s holds %s", c.Name, p.dra.describe(c.Status.Allocation, got)))
		}
		if len(parts) == 0 {
			parts = append(parts, "its claims free no GPU of "+api.DRADriverName+" (its CPU, memory or other resources)")
		}
		plan.freed[v.UID] = strings.Join(parts, "; ")
	}
	return plan
}

// claimRef names a claim a preemption waits to see freed.
type claimRef struct {
	namespace, name string
	uid             types.UID
}

// claimsHeldStill are the plan's claims the claim tracker still has
// allocated (the victims' pods may be gone a while before the claims are
// deallocated or deleted).
func (p *Plugin) claimsHeldStill(plan *preemptionPlan) []string {
	if p.handle == nil || p.handle.SharedDRAManager() == nil {
		return nil
	}
	var out []string
	for _, c := range plan.claims {
		cur, err := p.handle.SharedDRAManager().ResourceClaims().Get(c.namespace, c.name)
		if err == nil && cur.UID == c.uid && cur.Status.Allocation != nil {
			out = append(out, "claim "+c.namespace+"/"+c.name)
		}
	}
	return out
}

// gpuName names a device of Tessera's driver ("pool/device") by its
// GPU's UUID where the model knows it.
func (m *draModel) gpuName(g string) string {
	pool, dev, _ := strings.Cut(g, "/")
	m.mu.Lock()
	defer m.mu.Unlock()
	if pp, ok := m.pools[pool]; ok {
		if i, ok := pp.devices[dev]; ok {
			if n := m.cluster.Node(pp.node); n != nil && i < len(n.GPUs) {
				return fmt.Sprintf("%s (%s %s)", n.GPUs[i].UUID, api.DRADriverName, g)
			}
		}
	}
	return api.DRADriverName + " " + g
}

// describe says what an allocation holds on the devices of Tessera's
// driver (on the GPUs named in on first, when any): a share's memory
// and cores, or the whole device.
func (m *draModel) describe(a *resourceapi.AllocationResult, on []string) string {
	var parts, others []string
	for _, r := range a.Devices.Results {
		if r.Driver != api.DRADriverName {
			continue
		}
		g := r.Pool + "/" + r.Device
		what := "all of " + m.gpuName(g)
		if r.ShareID != nil {
			var qs []string
			for _, k := range []resourceapi.QualifiedName{api.CapacityMemory, api.CapacityCores} {
				if q, ok := r.ConsumedCapacity[k]; ok && !q.IsZero() {
					qs = append(qs, q.String()+" "+string(k))
				}
			}
			what = strings.Join(qs, " and ") + " of " + m.gpuName(g)
		}
		if len(on) == 0 || slices.Contains(on, g) {
			parts = append(parts, what)
		} else {
			others = append(others, what)
		}
	}
	parts = append(parts, others...)
	if len(parts) == 0 {
		return "no device of " + api.DRADriverName
	}
	return strings.Join(parts, ", ")
}

// servesClaims reports whether Tessera's preemption of claims serves the
// pod: it has ResourceClaims and asks no GPU through Tessera's extended
// resources, and kube-scheduler reads claims.
func servesClaims(p *Plugin, s *cycleState, pod *corev1.Pod) bool {
	return p != nil && (s == nil || s.cpuOnly) && len(pod.Spec.ResourceClaims) > 0 && p.handle != nil && p.handle.SharedDRAManager() != nil
}
