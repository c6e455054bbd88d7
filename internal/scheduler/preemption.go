package scheduler

// Preemption that sees GPUs: kube-scheduler's DefaultPreemption (its
// Evaluator and Executor: candidates, PodDisruptionBudgets,
// preemptionPolicy, graceful deletion, nomination, asynchronous
// preemption) with the victims on each node chosen by the placement core
// (placement.Compiled.Victims), so that a pod gets room on one GPU (or the
// GPUs it needs) from the fewest, lowest-priority pods instead of a little
// freed on every GPU of the node.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/events"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// PreemptionName is the preemption plugin's name in
// KubeSchedulerConfiguration; the profile enables it in place of
// DefaultPreemption.
const PreemptionName = "TesseraPreemption"

// Preemption is kube-scheduler's DefaultPreemption whose victims on a node
// the placement core chooses (SelectVictimsOnNode). Everything else is
// DefaultPreemption's own: which pods may preempt (preemptionPolicy,
// victims still terminating on the nominated node), how many nodes are
// dry-run, the choice among candidate nodes, PodDisruptionBudgets, the
// deletion of the victims and the nomination.
type Preemption struct {
	*defaultpreemption.DefaultPreemption
	fh fwk.Handle
	// tessera is the profile's Tessera plugin, as the cycle states name
	// it (its cluster state, nominations and plans).
	tessera atomic.Pointer[Plugin]
}

var (
	_ fwk.PostFilterPlugin = (*Preemption)(nil)
	_ fwk.PreEnqueuePlugin = (*Preemption)(nil)
	_ preemption.Interface = (*Preemption)(nil)
)

// NewPreemption is the plugin factory. Its arguments are
// DefaultPreemptionArgs (kubescheduler.config.k8s.io/v1), defaulted and
// validated as kube-scheduler does for DefaultPreemption.
func NewPreemption(ctx context.Context, obj runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
	var v1args configv1.DefaultPreemptionArgs
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &v1args); err != nil {
			return nil, fmt.Errorf("%s plugin arguments: %w", PreemptionName, err)
		}
	}
	scheme.Scheme.Default(&v1args)
	var args schedconfig.DefaultPreemptionArgs
	if err := scheme.Scheme.Convert(&v1args, &args, nil); err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", PreemptionName, err)
	}
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	dp, err := defaultpreemption.New(ctx, &args, fh, fts)
	if err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", PreemptionName, err)
	}
	pl := &Preemption{DefaultPreemption: dp, fh: fh}
	// DefaultPreemption's own Executor and Evaluator, built for this
	// plugin: its victims (SelectVictimsOnNode below), its name, and
	// Preempted events that name the GPU (gpuEvents).
	dp.Executor = preemption.NewExecutor(gpuEvents{Handle: fh, pl: pl}, fts)
	dp.Evaluator = preemption.NewEvaluator(PreemptionName, fh, pl, dp.Executor)
	return pl, nil
}

func (pl *Preemption) Name() string { return PreemptionName }

// PostFilter runs DefaultPreemption's; when it nominates a node for a GPU
// pod, the status says what the victims free there, and the room is kept
// for the pod (its plan, nominated.go).
func (pl *Preemption) PostFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, m fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s := readState(cs)
	p := pluginOf(cs)
	if p != nil {
		pl.tessera.Store(p)
	}
	res, st := pl.DefaultPreemption.PostFilter(ctx, cs, pod, m)
	if p == nil {
		return res, st
	}
	node := ""
	if st.IsSuccess() && res != nil && res.NominatingInfo != nil {
		node = res.NominatedNodeName
	}
	plan := p.settle(pod.UID, node)
	if node == "" {
		return res, st
	}
	p.nominate(pod.UID, node)
	msg := "Tessera: preemption nominated node " + node
	if plan != nil {
		msg += ": " + plan.String()
		klog.FromContext(ctx).V(2).Info("Preempting pods for a GPU pod", "pod", klog.KObj(pod), "node", node, "gpus", plan.gpus, "victims", plan.victimKeys())
	}
	if s == nil {
		// A pod with claims: DynamicResources' histogram says why no
		// node fit; the note says what the victims free.
		return res, fwk.NewStatus(fwk.Success, statusText(msg))
	}
	s.mu.Lock()
	reasons := append([]placement.Reason(nil), s.reasons...)
	s.mu.Unlock()
	if len(reasons) > 0 {
		msg = "Tessera: " + s.summary(reasons) + ". " + strings.TrimPrefix(msg, "Tessera: ")
	}
	return res, fwk.NewStatus(fwk.Success, statusText(msg))
}

// PodEligibleToPreemptOthers is DefaultPreemption's rule (not with
// preemptionPolicy Never, nor while pods on the nominated node terminate
// by preemption) and one more: not while pods this plugin preempted for
// the pod on its nominated node still hold their GPUs in the plugin's
// state, being deleted or deleted a moment ago (the plugin's informer
// releases them a little after kube-scheduler's snapshot drops them), nor
// while the node's inventory still lists a dynamic MIG instance of theirs
// (the node agent destroys it after the pod). A dry run then would count
// their room twice and evict more pods.
func (pl *Preemption) PodEligibleToPreemptOthers(ctx context.Context, pod *corev1.Pod, nominatedNodeStatus *fwk.Status) (bool, string) {
	if ok, msg := pl.DefaultPreemption.PodEligibleToPreemptOthers(ctx, pod, nominatedNodeStatus); !ok {
		return ok, msg
	}
	p := pl.tessera.Load()
	if p == nil || nominatedNodeStatus.Code() == fwk.UnschedulableAndUnresolvable {
		return true, ""
	}
	// (The pod's status may not show the nomination yet.)
	p.planMu.Lock()
	plan := p.plans[pod.UID]
	p.planMu.Unlock()
	if plan == nil || pod.Status.NominatedNodeName != "" && pod.Status.NominatedNodeName != plan.node {
		return true, ""
	}
	lister := pl.fh.SharedInformerFactory().Core().V1().Pods().Lister()
	var held []string
	p.st.mu.RLock()
	for _, v := range plan.victims {
		key := kubeobj.Key(v)
		if p.st.holders[key] != v.UID {
			if p.instanceListed(plan.node, v) {
				held = append(held, key+" (its MIG instance)")
			}
			continue // released
		}
		if cur, err := lister.Pods(v.Namespace).Get(v.Name); err == nil && cur.UID == v.UID && !leaving(cur) {
			continue // not being deleted: its eviction failed
		}
		held = append(held, key)
	}
	p.st.mu.RUnlock()
	held = append(held, p.claimsHeldStill(plan)...)
	if len(held) > 0 {
		return false, fmt.Sprintf("not eligible: pods it preempted on node %s still hold their GPUs (%s).", plan.node, strings.Join(held, ", "))
	}
	return true, ""
}

// instanceListed reports whether the node's inventory still lists a
// dynamic MIG instance the victim's record held: the node agent destroys
// it once the pod is gone and then publishes the inventory without it.
// The caller holds st.mu.
func (p *Plugin) instanceListed(node string, victim *corev1.Pod) bool {
	n := p.st.cluster.Node(node)
	rec, err := kubeobj.Record(victim)
	if n == nil || err != nil {
		return false
	}
	for _, ca := range rec.Containers {
		for _, d := range ca.Devices {
			i := n.GPUByUUID(d.UUID)
			if d.MIG == nil || d.MIG.Device != "" || i < 0 || n.GPUs[i].MIG == nil {
				continue
			}
			for _, dev := range n.GPUs[i].MIG.Devices {
				if dev.Profile == d.MIG.Profile && dev.Start == d.MIG.Start {
					return true
				}
			}
		}
	}
	return false
}

// SelectVictimsOnNode chooses the victims on one node for a pod the
// Tessera plugin places: as DefaultPreemption, it takes every pod of lower
// priority off the node and checks that the pod then passes every Filter;
// then the placement core chooses the cheapest victims for the GPUs
// (placement.Compiled.Victims, over the node with the pods nominated to it
// that the pod must leave room for), and the pods are given back with
// every Filter checked, the others first, then the chosen ones, as
// DefaultPreemption gives back its candidates: a pod another plugin needs
// gone (CPU, memory, ports) stays a victim. For other pods and nodes in
// mode dra it is DefaultPreemption's own.
func (pl *Preemption) SelectVictimsOnNode(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo, pdbs []*policyv1.PodDisruptionBudget) ([]*corev1.Pod, int, *fwk.Status) {
	s := readState(cs)
	node := ni.Node().Name
	if p := pluginOf(cs); servesClaims(p, s, pod) {
		return pl.selectClaimVictims(ctx, cs, p, pod, ni, pdbs)
	}
	if s == nil || s.cpuOnly || s.plugin == nil || s.plugin.onDRA(node) {
		return pl.DefaultPreemption.SelectVictimsOnNode(ctx, cs, pod, ni, pdbs)
	}
	p := s.plugin
	logger := klog.FromContext(ctx)
	cands, protected, st := pl.candidates(ni, pod, pdbs)
	if st != nil {
		return nil, 0, st
	}
	p.syncView(cs, ni)
	remove := func(pi fwk.PodInfo) error {
		if err := ni.RemovePod(logger, pi.GetPod()); err != nil {
			return err
		}
		return pl.fh.RunPreFilterExtensionRemovePod(ctx, cs, pod, pi, ni).AsError()
	}
	add := func(pi fwk.PodInfo) error {
		ni.AddPodInfo(pi)
		return pl.fh.RunPreFilterExtensionAddPod(ctx, cs, pod, pi, ni).AsError()
	}
	for _, pi := range cands {
		if err := remove(pi); err != nil {
			return nil, 0, fwk.AsStatus(err)
		}
	}
	if st := pl.fh.RunFilterPluginsWithNominatedPods(ctx, cs, pod, ni); !st.IsSuccess() {
		return nil, 0, st
	}
	chosen, plan := p.chooseVictims(cs, s, pod, node, cands, protected)
	// Give back the pods the core keeps (all at once when every Filter
	// agrees), then each chosen one, protected pods first in each group,
	// most important first. Pods on their way out stay victims.
	var keep, evict, victims []int
	for _, protectedFirst := range []bool{true, false} {
		for i := range cands {
			switch {
			case protected[i] != protectedFirst:
			case chosen != nil && leaving(cands[i].GetPod()):
				victims = append(victims, i)
			case chosen[i]:
				evict = append(evict, i)
			default:
				keep = append(keep, i)
			}
		}
	}
	reprieve := func(i int) error {
		if err := add(cands[i]); err != nil {
			return err
		}
		if pl.fh.RunFilterPluginsWithNominatedPods(ctx, cs, pod, ni).IsSuccess() {
			return nil
		}
		victims = append(victims, i)
		return remove(cands[i])
	}
	bulk := false
	if chosen != nil && len(keep) > 0 {
		for _, i := range keep {
			if err := add(cands[i]); err != nil {
				return nil, 0, fwk.AsStatus(err)
			}
		}
		if bulk = pl.fh.RunFilterPluginsWithNominatedPods(ctx, cs, pod, ni).IsSuccess(); !bulk {
			for _, i := range keep {
				if err := remove(cands[i]); err != nil {
					return nil, 0, fwk.AsStatus(err)
				}
			}
		}
	}
	order := evict
	if !bulk {
		order = append(append([]int(nil), keep...), evict...)
		if chosen == nil {
			order = keep // the core could not tell: kube-scheduler's order
		}
	}
	for _, i := range order {
		if err := reprieve(i); err != nil {
			return nil, 0, fwk.AsStatus(err)
		}
	}
	if len(victims) == 0 {
		// The pod fits with every pod given back: the node's GPUs were
		// freed since its Filter ran (the pod is requeued when the
		// plugin's state frees them; PostFilter). Not a candidate,
		// rather than DefaultPreemption's error for a candidate
		// without victims.
		return nil, 0, fwk.NewStatus(fwk.Unschedulable, "the pod fits the node without preempting: its GPUs were freed while the pod was being scheduled")
	}
	sort.Ints(victims) // cands' order: most important first
	out := make([]*corev1.Pod, 0, len(victims))
	violating := 0
	for _, i := range victims {
		out = append(out, cands[i].GetPod())
		if protected[i] {
			violating++
		}
	}
	if plan != nil && len(out) > 0 {
		plan.victims = out
		p.try(pod.UID, plan)
	}
	return out, violating, fwk.NewStatus(fwk.Success)
}

// candidates are the pods of lower priority than pod on the node that
// DefaultPreemption may evict, most important first, and which of them a
// PodDisruptionBudget protects; a status when there are none.
func (pl *Preemption) candidates(ni fwk.NodeInfo, pod *corev1.Pod, pdbs []*policyv1.PodDisruptionBudget) ([]fwk.PodInfo, []bool, *fwk.Status) {
	prio := corev1helpers.PodPriority(pod)
	var cands []fwk.PodInfo
	for _, pi := range ni.GetPods() {
		if corev1helpers.PodPriority(pi.GetPod()) < prio && pl.IsEligiblePod(ni, pi, pod) {
			cands = append(cands, pi)
		}
	}
	if len(cands) == 0 {
		return nil, nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "No preemption victims found for incoming pod")
	}
	sort.SliceStable(cands, func(i, j int) bool { return moreImportant(cands[i].GetPod(), cands[j].GetPod()) })
	return cands, pdbProtected(cands, pdbs), nil
}

// syncView makes the state's view of the node charge no pod that
// kube-scheduler's snapshot of the node no longer has: the plugin's
// informer handler may not have released a pod deleted a moment ago, and
// a dry run that still counted it would evict one pod too many.
func (p *Plugin) syncView(cs fwk.CycleState, ni fwk.NodeInfo) {
	p.st.mu.RLock()
	defer p.st.mu.RUnlock()
	v := p.view(cs, ni.Node().Name)
	if v == nil {
		return
	}
	have := make(map[string]bool, len(ni.GetPods()))
	for _, pi := range ni.GetPods() {
		have[kubeobj.Key(pi.GetPod())] = true
	}
	for _, k := range v.ClusterPods() {
		if !have[k] {
			v.Remove(k)
		}
	}
}

// chooseVictims runs the placement core's victim search on the state's
// view of the node (the candidates taken off) with the pods nominated to
// the node that pod must leave room for put on. It returns which
// candidates to evict and the plan (nil, nil when the core cannot place
// the pod there: DefaultPreemption's order decides).
func (p *Plugin) chooseVictims(cs fwk.CycleState, s *cycleState, pod *corev1.Pod, node string, cands []fwk.PodInfo, protected []bool) (map[int]bool, *preemptionPlan) {
	p.st.mu.RLock()
	defer p.st.mu.RUnlock()
	vs := readViews(cs)
	if vs == nil || vs.m[node] == nil {
		return nil, nil
	}
	v := vs.m[node].Clone()
	if p.handle != nil {
		prio := corev1helpers.PodPriority(pod)
		for _, pi := range p.handle.NominatedPodsForNode(node) {
			np := pi.GetPod()
			if np.UID != pod.UID && corev1helpers.PodPriority(np) >= prio && !v.Holds(kubeobj.Key(np)) {
				p.putNominated(v, np)
			}
		}
	}
	// Pods already on their way out (being deleted, or marked by a
	// preemption whose deletion the snapshot does not show yet) free
	// their room: the core counts it free and they stay victims, which
	// costs nothing more (the Executor deletes no pod twice).
	chosen := map[int]bool{}
	var ev []placement.Evictable
	var at []int
	for i, pi := range cands {
		key := kubeobj.Key(pi.GetPod())
		if leaving(pi.GetPod()) {
			v.Remove(key)
			chosen[i] = true
			continue
		}
		ev = append(ev, placement.Evictable{Pod: key, Priority: corev1helpers.PodPriority(pi.GetPod()), Protected: protected[i]})
		at = append(at, i)
	}
	sc := p.scratchs.Get().(*scratch)
	defer p.scratchs.Put(sc)
	e, ok := s.cr.Victims(v, ev, s.ranker, &sc.s, &sc.p)
	if !ok {
		return nil, nil
	}
	for _, i := range e.Victims {
		chosen[at[i]] = true
	}
	plan := &preemptionPlan{node: node, rec: sc.p.Record(s.cr)}
	for _, ca := range plan.rec.Containers {
		for _, d := range ca.Devices {
			if !contains(plan.gpus, d.UUID) {
				plan.gpus = append(plan.gpus, d.UUID)
			}
		}
	}
	return chosen, plan
}

// moreImportant orders the candidate victims, most important first, as
// DefaultPreemption does (higher priority, then the longer running), and
// among equals by name: a dry run over the same pods chooses the same
// victims whatever order the node's snapshot lists them in. (A pod not
// started yet counts as started now, as DefaultPreemption counts it.)
func moreImportant(a, b *corev1.Pod) bool {
	if pa, pb := corev1helpers.PodPriority(a), corev1helpers.PodPriority(b); pa != pb {
		return pa > pb
	}
	sa, sb := a.Status.StartTime, b.Status.StartTime
	switch {
	case sa != nil && sb != nil && !sa.Equal(sb):
		return sa.Before(sb)
	case sa != nil && sb == nil:
		return true
	case sa == nil && sb != nil:
		return false
	}
	return kubeobj.Key(a) < kubeobj.Key(b)
}

// leaving reports whether the pod is being deleted or a preemption has
// marked it for deletion (DisruptionTarget, PreemptionByScheduler).
func leaving(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil {
		return true
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			return c.Status == corev1.ConditionTrue && c.Reason == corev1.PodReasonPreemptionByScheduler
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// pdbProtected marks the pods (most important first) whose eviction a
// PodDisruptionBudget does not allow, counting the disruptions of the
// pods before them, as DefaultPreemption groups its candidates: a budget
// matches pods of its namespace by its selector (an empty selector
// matches none); a pod the budget already counts as disrupted costs it
// nothing.
func pdbProtected(pods []fwk.PodInfo, pdbs []*policyv1.PodDisruptionBudget) []bool {
	out := make([]bool, len(pods))
	left := make([]int32, len(pdbs))
	sels := make([]labels.Selector, len(pdbs))
	for i, b := range pdbs {
		left[i] = b.Status.DisruptionsAllowed
		if sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector); err == nil && !sel.Empty() {
			sels[i] = sel
		}
	}
	for k, pi := range pods {
		pod := pi.GetPod()
		if len(pod.Labels) == 0 {
			continue
		}
		for i, b := range pdbs {
			if sels[i] == nil || b.Namespace != pod.Namespace || !sels[i].Matches(labels.Set(pod.Labels)) {
				continue
			}
			if _, counted := b.Status.DisruptedPods[pod.Name]; counted {
				continue
			}
			if left[i]--; left[i] < 0 {
				out[k] = true
			}
		}
	}
	return out
}

// preemptionPlan is what preemption chose on a node for a pod: the
// record the pod is to get there (its GPUs) and the victims.
type preemptionPlan struct {
	node    string
	rec     *api.PodAllocation
	gpus    []string
	victims []*corev1.Pod
	// For a pod with claims (preemptclaims.go; rec is nil): what each
	// victim's claims free, and the claims freed, which the pod waits
	// for before it may preempt again.
	freed  map[types.UID]string
	claims []claimRef
}

func (pp *preemptionPlan) victimKeys() []string {
	out := make([]string, len(pp.victims))
	for i, v := range pp.victims {
		out[i] = kubeobj.Key(v)
	}
	return out
}

// String says what the victims free and where, for the pod's event.
func (pp *preemptionPlan) String() string {
	gpu := "GPU"
	if len(pp.gpus) > 1 {
		gpu = "GPUs"
	}
	prios := map[int32]bool{}
	for _, v := range pp.victims {
		prios[corev1helpers.PodPriority(v)] = true
	}
	var ps []string
	for pr := range prios {
		ps = append(ps, fmt.Sprint(pr))
	}
	sort.Strings(ps)
	where := gpu + " " + strings.Join(pp.gpus, ", ")
	if len(pp.gpus) == 0 {
		where = "node " + pp.node
	}
	return fmt.Sprintf("evicting %d pod(s) of priority %s (%s) makes room on %s", len(pp.victims), strings.Join(ps, ", "),
		strings.Join(pp.victimKeys(), ", "), where)
}

// try keeps the plan of one node of a dry run (concurrent: one per node).
func (p *Plugin) try(uid types.UID, plan *preemptionPlan) {
	p.planMu.Lock()
	defer p.planMu.Unlock()
	if p.trials == nil {
		p.trials = map[types.UID]map[string]*preemptionPlan{}
	}
	if p.trials[uid] == nil {
		p.trials[uid] = map[string]*preemptionPlan{}
	}
	p.trials[uid][plan.node] = plan
}

// settle keeps the plan of the nominated node ("" = none) and drops the
// dry run's others; it returns the kept plan.
func (p *Plugin) settle(uid types.UID, node string) *preemptionPlan {
	p.planMu.Lock()
	defer p.planMu.Unlock()
	plan := p.trials[uid][node]
	delete(p.trials, uid)
	if plan == nil {
		if node != "" {
			// DefaultPreemption nominated a node without victims from
			// this dry run (pods still terminating there).
			return p.plans[uid]
		}
		return nil
	}
	if p.plans == nil {
		p.plans = map[types.UID]*preemptionPlan{}
	}
	p.plans[uid] = plan
	return plan
}

// planFor is the plan kept for pod uid on node, or nil.
func (p *Plugin) planFor(uid types.UID, node string) *preemptionPlan {
	p.planMu.Lock()
	defer p.planMu.Unlock()
	if plan := p.plans[uid]; plan != nil && plan.node == node {
		return plan
	}
	return nil
}

// victimOf is the plan (kept, or of the running dry run) in which pod
// preemptor evicts victim.
func (p *Plugin) victimOf(preemptor, victim types.UID) *preemptionPlan {
	p.planMu.Lock()
	defer p.planMu.Unlock()
	has := func(pp *preemptionPlan) bool {
		for _, v := range pp.victims {
			if v.UID == victim {
				return true
			}
		}
		return false
	}
	if pp := p.plans[preemptor]; pp != nil && has(pp) {
		return pp
	}
	for _, pp := range p.trials[preemptor] {
		if has(pp) {
			return pp
		}
	}
	return nil
}

// dropPlans forgets a bound or deleted pod's plans.
func (p *Plugin) dropPlans(uid types.UID) {
	p.planMu.Lock()
	delete(p.plans, uid)
	delete(p.trials, uid)
	p.planMu.Unlock()
}

// gpuEvents is the handle the Executor is built with: its Preempted
// events on the victims say which GPU they free and for whom.
type gpuEvents struct {
	fwk.Handle
	pl *Preemption
}

func (h gpuEvents) EventRecorder() events.EventRecorderLogger {
	return gpuRecorder{EventRecorderLogger: h.Handle.EventRecorder(), pl: h.pl}
}

type gpuRecorder struct {
	events.EventRecorderLogger
	pl *Preemption
}

func (r gpuRecorder) WithLogger(logger klog.Logger) events.EventRecorderLogger {
	return gpuRecorder{EventRecorderLogger: r.EventRecorderLogger.WithLogger(logger), pl: r.pl}
}

func (r gpuRecorder) Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	// The Executor names the preemptor by an object that embeds its pod.
	victim, ok1 := regarding.(*corev1.Pod)
	preemptor, ok2 := related.(metav1.Object)
	if p := r.pl.tessera.Load(); reason == "Preempted" && ok1 && ok2 && p != nil {
		if plan := p.victimOf(preemptor.GetUID(), victim.UID); plan != nil {
			text := note
			if len(args) > 0 {
				text = fmt.Sprintf(note, args...)
			}
			note, args = "%s", []any{fmt.Sprintf("%s; Tessera: frees %s for %s/%s (%s)", text, strings.Join(plan.gpus, ", "),
				preemptor.GetNamespace(), preemptor.GetName(), plan.used(victim))}
		}
	}
	r.EventRecorderLogger.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// used is what the victim's record holds on the plan's GPUs.
func (pp *preemptionPlan) used(victim *corev1.Pod) string {
	if f, ok := pp.freed[victim.UID]; ok {
		return f
	}
	rec, err := kubeobj.Record(victim)
	if err != nil {
		return "no GPU allocation record"
	}
	var parts []string
	for _, ca := range rec.Containers {
		for _, d := range ca.Devices {
			if !contains(pp.gpus, d.UUID) {
				continue
			}
			switch {
			case d.MIG != nil:
				parts = append(parts, fmt.Sprintf("MIG %s@%d on %s", d.MIG.Profile, d.MIG.Start, d.UUID))
			case d.Exclusive:
				parts = append(parts, "all of "+d.UUID)
			default:
				parts = append(parts, fmt.Sprintf("%d MiB and %d%% of the cores of %s", d.MemoryMiB, d.Cores, d.UUID))
			}
		}
	}
	if len(parts) == 0 {
		return "its CPU or memory"
	}
	return "it holds " + strings.Join(parts, ", ")
}
