package scheduler

// The extension points, in the order kube-scheduler calls them.

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// cycleState is what PreFilter prepares for the rest of the cycle.
type cycleState struct {
	cr     *placement.Compiled
	pol    placement.Policy
	ranker placement.GPURanker
	total  int

	mu      sync.Mutex
	reasons []placement.Reason
	rec     *api.PodAllocation
	// scores[slot] is the policy's score of a node that passed Filter
	// (NaN: not filtered), so Score need not run the fit check again.
	// Nodes added after PreFilter have no slot and are scored afresh.
	scores []float64
	// draWhy says why nodes in mode dra cannot serve the pod ("": they
	// can, through the extended-resource mapping; dra.go) and draNodes
	// counts those that refused it.
	draWhy   string
	draNodes int
	// narrowed: PreFilter searched every node and handed kube-scheduler
	// only the policy's candidates (candidates.go); their scores are in
	// scores already.
	narrowed bool
	// cpuOnly: a pod that asks no GPU, placed by the policy among
	// PreFilter's candidates by its CPU and memory (cpuonly.go); it gets
	// no record and DefaultBinder binds it.
	cpuOnly bool
	// rules: the pod's nodeSelector, required node affinity and
	// tolerations, which the candidates respect (candidates.go).
	rules *nodeRules
	// nominated are views of the nodes with pods nominated to them that
	// the pod must leave room for (nominated.go): the candidates are
	// fit on them.
	nominated map[string]*placement.NodeView
	// plugin is the plugin that made the state (for TesseraPreemption,
	// preemption.go).
	plugin *Plugin
}

// Clone shares the state: the parts read concurrently never change after
// PreFilter, and the rest is guarded by mu.
func (s *cycleState) Clone() fwk.StateData { return s }

func readState(cs fwk.CycleState) *cycleState {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*cycleState)
	return s
}

// PreFilter parses and compiles the pod's GPU request once per cycle.
// Pods that ask for no GPU skip the plugin entirely.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	defer since("PreFilter", time.Now())
	if !kubeobj.RequestsGPU(pod, p.names) {
		return p.preFilterCPUOnly(ctx, cs, pod, nodes)
	}
	if err := p.waitSynced(ctx); err != nil {
		return nil, fwk.AsStatus(err)
	}
	req, err := podrequest.FromPod(pod, p.names)
	if err != nil {
		failuresTotal.WithLabelValues("InvalidRequest").Inc()
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, statusText(err.Error()))
	}
	p.st.mu.RLock()
	cr, err := p.st.cluster.Compile(req)
	p.st.mu.RUnlock()
	if err != nil {
		failuresTotal.WithLabelValues("InvalidRequest").Inc()
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, statusText(err.Error()))
	}
	if !cr.NeedsGPU() {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	pol := placement.PolicyFor(cr, p.policy)
	// A pod is observed at its first attempt only (firstAttempt).
	if obs, ok := pol.(placement.Observer); ok && p.firstAttempt(pod.UID) {
		p.st.mu.Lock()
		obs.Observe(cr)
		p.st.mu.Unlock()
	}
	// The pod's own scorer (placement.Prepare): its shape and the policy's
	// current snapshot, fixed for the cycle, lock-free in Filter and Score.
	pol = placement.Prepare(cr, pol)
	p.st.mu.RLock()
	scores := make([]float64, len(p.st.slot))
	p.st.mu.RUnlock()
	for i := range scores {
		scores[i] = math.NaN()
	}
	s := &cycleState{cr: cr, pol: pol, ranker: placement.RankerFor(cr, pol), total: len(nodes), scores: scores,
		draWhy: draUnfit(req, p.names.GPU), plugin: p}
	cs.Write(stateKey, s)
	if p.wide(pod.UID) {
		// The candidates of an earlier attempt all failed another
		// plugin's Filter: this attempt looks at every node.
		return nil, nil
	}
	s.rules = p.rulesFor(ctx, pod, nodes)
	p.st.mu.RLock()
	s.nominated = p.nominatedViews(pod)
	p.st.mu.RUnlock()
	if names := p.candidates(ctx, s); names != nil {
		s.narrowed = true
		return &fwk.PreFilterResult{NodeNames: names}, nil
	}
	return nil, nil
}

// fit runs the core's fit check for the node; the caller holds st.mu.
func (p *Plugin) fit(s *cycleState, node string, sc *scratch) placement.Reason {
	n := p.st.cluster.Node(node)
	if n == nil {
		return placement.Reason{Kind: placement.ReasonNoGPUs}
	}
	return s.cr.Fit(n, s.ranker, &sc.s, &sc.p)
}

// Filter asks the placement core whether the pod fits the node and, if it
// does, scores that placement right away under the same read lock.
func (p *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	s := readState(cs)
	if s == nil {
		return nil
	}
	name := ni.Node().Name
	p.st.mu.RLock()
	if p.st.isDRA(name) && !s.cpuOnly {
		p.st.mu.RUnlock()
		return s.filterDRA()
	}
	if vs := readViews(cs); vs != nil && vs.m[name] != nil {
		// A copy of the node with pods added or removed (a preemption
		// dry run, nominated pods): a what-if, neither a reason nor a
		// score of the cycle.
		sc := p.scratchs.Get().(*scratch)
		r := s.cr.Fit(vs.m[name].Node, s.ranker, &sc.s, &sc.p)
		p.st.mu.RUnlock()
		p.scratchs.Put(sc)
		return s.status(r)
	}
	if s.narrowed {
		// PreFilter fit and scored every candidate.
		if i, ok := p.st.slot[name]; ok && i < len(s.scores) && !math.IsNaN(s.scores[i]) {
			p.st.mu.RUnlock()
			return nil
		}
	}
	sc := p.scratchs.Get().(*scratch)
	r := p.fit(s, name, sc)
	if r.OK() {
		// Each node has its own slot: no lock needed on s.scores.
		if i, ok := p.st.slot[name]; ok && i < len(s.scores) {
			s.scores[i] = s.pol.ScoreNode(s.cr, &sc.p)
		}
	}
	p.st.mu.RUnlock()
	p.scratchs.Put(sc)
	if r.OK() {
		return nil
	}
	s.mu.Lock()
	s.reasons = append(s.reasons, r)
	s.mu.Unlock()
	return s.status(r)
}

// status is Filter's verdict for a node that does not fit: a short,
// node-independent text so kube-scheduler's per-reason histogram groups
// nodes (PostFilter adds the detailed summary); unresolvable when removing
// pods cannot help (preemption skips the node).
func (s *cycleState) status(r placement.Reason) *fwk.Status {
	if r.OK() {
		return nil
	}
	// The placement core's table of reason texts says both.
	text := r.Kind.Text()
	code := fwk.Unschedulable
	if text.Unresolvable {
		code = fwk.UnschedulableAndUnresolvable
	}
	return fwk.NewStatus(code, statusText(text.Short))
}

// PostFilter explains, per group of nodes, why the pod fit none; the text
// ends up in the pod's FailedScheduling event. It never makes the pod
// schedulable, so it is informational and must run before preemption;
// after a narrowed attempt it stops the chain (see below).
func (p *Plugin) PostFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	defer since("PostFilter", time.Now())
	s := readState(cs)
	if s == nil {
		if d := readDRACycle(cs); d != nil && d.narrowed {
			// Every candidate for the pod's claims failed a Filter
			// (the structured allocator's or another plugin's).
			return p.retryWide(ctx, pod)
		}
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	s.mu.Lock()
	reasons := append([]placement.Reason(nil), s.reasons...)
	s.mu.Unlock()
	kinds := map[placement.ReasonKind]bool{}
	for _, r := range reasons {
		if !kinds[r.Kind] {
			kinds[r.Kind] = true
			failuresTotal.WithLabelValues(r.Kind.String()).Inc()
		}
	}
	if s.narrowed {
		// Every candidate failed a Filter (another plugin's: CPU,
		// ports, inter-pod affinity, spread; or a node changed since
		// PreFilter). The pod is tried again at once over every node.
		// UnschedulableAndUnresolvable ends the PostFilter chain here:
		// DefaultPreemption, after this plugin in the profile, would
		// look at the candidates alone (every other node is
		// "unresolvable" to it) and evict pods there although the pod
		// may fit another node as it is. The retry's PostFilter runs
		// the whole chain (the DRA claim clean-up, preemption over
		// every node) if it fails too.
		return p.retryWide(ctx, pod)
	}
	p.waitMu.Lock()
	p.waiting[kubeobj.Key(pod)] = pod
	p.waitMu.Unlock()
	if len(reasons) == 0 && s.draNodes == 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	return nil, fwk.NewStatus(fwk.Unschedulable, statusText("Tessera: "+s.summary(reasons)))
}

// retryWide ends PostFilter's chain for a pod whose narrowed attempt
// failed and tries it again at once over every node.
func (p *Plugin) retryWide(ctx context.Context, pod *corev1.Pod) (*fwk.PostFilterResult, *fwk.Status) {
	p.widen(pod.UID)
	if p.activate != nil {
		p.activate(klog.FromContext(ctx), map[string]*corev1.Pod{kubeobj.Key(pod): pod})
	}
	return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, statusText(NarrowedRetry))
}

// PreScore skips scoring for pods the plugin does not place, but for
// pods whose claims DynamicResources allocates on DRA nodes (dramodel.go).
func (p *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	if readState(cs) == nil {
		// Not a pod Tessera places: one whose claims DynamicResources
		// allocates on DRA nodes is ranked by the node policy there.
		return p.draPreScore(ctx, cs, pod, nodes)
	}
	return nil
}

// scoreScale keeps policy scores (usually fractions) distinct as integers;
// NormalizeScore maps them onto kube-scheduler's range (and picks the best
// node by the exact score, which the integers may tie).
const scoreScale = 1e6

// Score returns the node policy's score of the placement Filter found on
// the node (the pod's own policy if it names one).
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s := readState(cs)
	if s == nil {
		if d := readDRACycle(cs); d != nil {
			return d.scores[ni.Node().Name], nil
		}
		return 0, nil
	}
	name := ni.Node().Name
	p.st.mu.RLock()
	if p.st.isDRA(name) && !s.cpuOnly {
		// DynamicResources places the pod's GPUs there: ranked below
		// every node Tessera places on (NormalizeScore).
		p.st.mu.RUnlock()
		return draScore, nil
	}
	i, ok := p.st.slot[name]
	var score float64
	if ok && i < len(s.scores) && !math.IsNaN(s.scores[i]) {
		score = s.scores[i]
	} else {
		// A node without a score from Filter: fit and score it now.
		sc := p.scratchs.Get().(*scratch)
		r := p.fit(s, name, sc)
		if r.OK() {
			score = s.pol.ScoreNode(s.cr, &sc.p)
		}
		p.scratchs.Put(sc)
		if !r.OK() {
			p.st.mu.RUnlock()
			return math.MinInt64 / 2, nil // filled up since Filter: rank it last
		}
	}
	p.st.mu.RUnlock()
	v := score * scoreScale
	switch {
	case math.IsNaN(v):
		return 0, nil
	case v > math.MaxInt64/4:
		return math.MaxInt64 / 4, nil
	case v < math.MinInt64/4:
		return math.MinInt64 / 4, nil
	}
	return int64(v), nil
}

func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps the raw scores linearly onto [0, MaxNodeScore]
// without changing the policy's choice: exactly one node, the policy's
// best, gets MaxNodeScore, every other node at most MaxNodeScore-1. The
// linear map alone would give every node within 1 % of the best range the
// same 100, and kube-scheduler would pick one of them at random. The best
// is the node with the best exact policy score from PreFilter (Score's
// integers, the score times scoreScale, can tie nodes that differ in the
// last digits, which `tessera-sim` tells apart). Among nodes with
// exactly the best score, the one whose name sorts first
// wins (candidates orders them so too): a choice that does not depend on
// the order the scheduler's informers happened to deliver the nodes in,
// and the one the placement core's Search and so `tessera-sim` make
// on a trace whose node list is in name order (first node in the
// cluster's order among equals). Nodes that serve their GPUs
// through DRA (draScore) get 0, below every node Tessera places on.
func (p *Plugin) NormalizeScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if len(scores) == 0 || readDRACycle(cs) != nil {
		// The DRA scores (dramodel.go) are already in range.
		return nil
	}
	lo, hi, seen, dra := int64(0), int64(0), false, false
	for _, s := range scores {
		switch {
		case s.Score == draScore:
			dra = true
		case !seen:
			lo, hi, seen = s.Score, s.Score, true
		default:
			lo, hi = min(lo, s.Score), max(hi, s.Score)
		}
	}
	// With DRA nodes among them, Tessera's nodes get [1, MaxScore] and
	// the DRA nodes 0.
	floor := int64(0)
	if dra {
		floor = 1
	}
	var exact []float64 // the policy's scores by slot, from PreFilter
	if cs != nil {
		if s := readState(cs); s != nil {
			exact = s.scores
		}
	}
	best := -1
	var bestKey tieKey
	p.st.mu.RLock()
	for i, s := range scores {
		if !seen || s.Score == draScore || s.Score != hi {
			continue
		}
		k := tieKey{name: s.Name, score: math.Inf(-1)}
		if slot, ok := p.st.slot[s.Name]; ok {
			k.known = true // unknown to the plugin: after the known ones
			if slot < len(exact) && !math.IsNaN(exact[slot]) {
				k.score = exact[slot]
			}
		}
		if best < 0 || k.before(bestKey) {
			best, bestKey = i, k
		}
	}
	p.st.mu.RUnlock()
	for i := range scores {
		switch {
		case scores[i].Score == draScore:
			scores[i].Score = 0
		case i == best:
			scores[i].Score = fwk.MaxScore
		case hi == lo:
			scores[i].Score = fwk.MaxScore - 1
		default:
			v := floor + int64(float64(scores[i].Score-lo)/float64(hi-lo)*float64(fwk.MaxScore-floor))
			scores[i].Score = min(v, fwk.MaxScore-1)
		}
	}
	return nil
}

// tieKey orders the nodes NormalizeScore found with the top integer score:
// nodes the plugin holds first, then by exact policy score, then by name.
type tieKey struct {
	known bool
	score float64
	name  string
}

func (a tieKey) before(b tieKey) bool {
	if a.known != b.known {
		return a.known
	}
	if a.score != b.score {
		return a.score > b.score
	}
	return a.name < b.name
}

// Reserve charges the placement to the plugin's state so the next pod
// sees the shares taken. The fit is checked again under the write lock:
// informer events may have changed the node since Filter.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	defer since("Reserve", time.Now())
	s := readState(cs)
	if s == nil {
		return nil
	}
	sc := p.scratchs.Get().(*scratch)
	defer p.scratchs.Put(sc)
	key := kubeobj.Key(pod)
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	if s.cpuOnly {
		return p.reserveCPUOnly(s, pod, nodeName, sc)
	}
	if p.st.isDRA(nodeName) {
		// The extended-resource mapping's claim holds the GPUs; the
		// pod gets no record (PreBind, Bind).
		return s.filterDRA()
	}
	if r := p.fit(s, nodeName, sc); !r.OK() {
		return fwk.NewStatus(fwk.Unschedulable, statusText(fmt.Sprintf("node %s changed since filtering: %s", nodeName, r)))
	}
	if p.st.cluster.Allocation(key) != nil {
		// A stale entry under this key (an earlier pod of the same name
		// whose deletion has not been seen yet) must not block this one.
		p.st.releaseLocked(key)
	}
	rec, err := p.st.cluster.Assign(s.cr, &sc.p)
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("reserving GPUs on %s: %w", nodeName, err))
	}
	if err := p.trust.sign(pod, rec); err != nil {
		p.st.releaseLocked(key)
		return fwk.AsStatus(fmt.Errorf("signing the GPU allocation record: %w", err))
	}
	p.st.holders[key] = pod.UID
	p.st.publishLocked(nodeName)
	s.mu.Lock()
	s.rec = rec
	s.mu.Unlock()
	placementsTotal.Inc()
	klog.FromContext(ctx).V(4).Info("Reserved GPUs", "pod", klog.KObj(pod), "node", nodeName)
	return nil
}

// Unreserve releases what Reserve charged; it is idempotent.
func (p *Plugin) Unreserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) {
	defer since("Unreserve", time.Now())
	if readState(cs) == nil {
		return
	}
	if p.st.release(kubeobj.Key(pod), pod.UID) {
		p.requeue(klog.FromContext(ctx))
	}
}

// PreBindPreFlight tells the framework whether PreBind has work to do. It
// has none when Bind carries the record: kube-scheduler then neither runs
// PreBind nor patches the pod's nominatedNodeName before binding.
func (p *Plugin) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if s := readState(cs); s == nil || s.cpuOnly || p.recordInBinding(klog.FromContext(ctx)) || p.onDRA(nodeName) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: true}, nil
}

// PreBind writes the allocation record on the pod before another plugin
// binds it: the node agent serves the pod's GPUs from it and a restarted
// scheduler rebuilds its state from it.
func (p *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	defer since("PreBind", time.Now())
	s := readState(cs)
	if s == nil || s.cpuOnly || p.onDRA(nodeName) {
		return nil
	}
	rec, st := reserved(s, pod)
	if st != nil {
		return st
	}
	if err := WriteRecord(ctx, p.client, pod.Namespace, pod.Name, pod.UID, rec); err != nil {
		return fwk.AsStatus(err)
	}
	return nil
}

// Bind binds a GPU pod with its allocation record among the Binding's
// annotations, which the API server copies onto the pod in the same write
// that sets spec.nodeName: a bound pod never lacks its record, and an
// unbound one never has it. Pods the plugin does not place are left to the
// next bind plugin (DefaultBinder).
func (p *Plugin) Bind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s := readState(cs)
	if s == nil || s.cpuOnly || !p.recordInBinding(klog.FromContext(ctx)) || p.onDRA(nodeName) {
		return fwk.NewStatus(fwk.Skip)
	}
	defer since("Bind", time.Now())
	rec, st := reserved(s, pod)
	if st != nil {
		return st
	}
	b, err := bindingWithRecord(pod, nodeName, rec)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if c := p.apiCacher(); c != nil {
		// kube-scheduler's asynchronous API calls (SchedulerAsyncAPICalls)
		// order this with the pod's other pending calls.
		onFinish, err := c.BindPod(b)
		if err == nil {
			err = c.WaitOnFinish(ctx, onFinish)
		}
		if err != nil {
			return fwk.AsStatus(fmt.Errorf("binding pod %s/%s to %s: %w", pod.Namespace, pod.Name, nodeName, err))
		}
		return nil
	}
	if err := createBinding(ctx, p.client, b); err != nil {
		return fwk.AsStatus(err)
	}
	return nil
}
