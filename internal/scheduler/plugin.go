// Package scheduler is Tessera's kube-scheduler framework plugin: a thin
// adapter from Pods and Nodes to the placement core. PreFilter turns the
// pod into a compiled placement request, Filter asks the core per node,
// Score applies the node policy, Reserve/Unreserve charge and release the
// core's state, and Bind binds the pod with its allocation record in the
// Binding (or PreBind writes the record first, where another plugin binds).
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/placement/policies"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Name is the plugin's name in KubeSchedulerConfiguration.
const Name = "Tessera"

// SchedulerName is the profile GPU pods are sent to.
const SchedulerName = "tessera-scheduler"

const stateKey fwk.StateKey = Name

// Plugin implements the framework extension points.
type Plugin struct {
	names  api.ResourceNames
	policy placement.Policy
	st     *state
	client kubernetes.Interface
	handle fwk.Handle
	// activate requeues pods this plugin found unschedulable once shares
	// are released (nil in unit tests).
	activate func(logger klog.Logger, pods map[string]*corev1.Pod)

	synced   atomic.Bool
	syncFns  []cache.InformerSynced
	waitMu   sync.Mutex
	waiting  map[string]*corev1.Pod
	scratchs sync.Pool

	bindOnce  sync.Once
	bindsSelf bool // set once by recordInBinding
}

var (
	_ fwk.PreFilterPlugin  = (*Plugin)(nil)
	_ fwk.FilterPlugin     = (*Plugin)(nil)
	_ fwk.PostFilterPlugin = (*Plugin)(nil)
	_ fwk.PreScorePlugin   = (*Plugin)(nil)
	_ fwk.ScorePlugin      = (*Plugin)(nil)
	_ fwk.ReservePlugin    = (*Plugin)(nil)
	_ fwk.PreBindPlugin    = (*Plugin)(nil)
	_ fwk.BindPlugin       = (*Plugin)(nil)
)

// New is the plugin factory for app.WithPlugin. Its arguments are an
// api.ClusterConfig (resourcePrefix, nodePolicy, gpuPolicy,
// placementPolicy), all optional.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	var cfg api.ClusterConfig
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &cfg); err != nil {
			return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
		}
	}
	p, err := newPlugin(cfg)
	if err != nil {
		return nil, err
	}
	registerMetrics()
	p.client = h.ClientSet()
	p.handle = h
	p.activate = h.Activate
	logger := klog.FromContext(ctx).WithName(Name)
	nodeReg, err := h.SharedInformerFactory().Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onNode(logger, obj) },
		UpdateFunc: func(_, obj any) { p.onNode(logger, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				p.st.removeNode(n.Name)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching nodes: %w", err)
	}
	podReg, err := h.SharedInformerFactory().Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onPod(logger, obj) },
		UpdateFunc: func(_, obj any) { p.onPod(logger, obj) },
		DeleteFunc: func(obj any) {
			if p.st.deletePod(obj) {
				p.requeue(logger)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching pods: %w", err)
	}
	p.syncFns = []cache.InformerSynced{nodeReg.HasSynced, podReg.HasSynced}
	logger.Info("Tessera plugin ready", "resourcePrefix", cfg.ResourcePrefix, "policy", p.policy.Name(), "gpuPolicy", cfg.GPUPolicy)
	return p, nil
}

// newPlugin builds a plugin without informers (unit tests feed it directly).
func newPlugin(cfg api.ClusterConfig) (*Plugin, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
	}
	names, err := api.NewResourceNames(cfg.ResourcePrefix)
	if err != nil {
		return nil, err
	}
	st := newState()
	st.cluster.DefaultGPUPolicy = cfg.GPUPolicy
	pol, err := policies.New(cfg.PlacementPolicy, st.cluster, 1)
	if err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
	}
	p := &Plugin{names: names, policy: pol, st: st, waiting: map[string]*corev1.Pod{}}
	p.scratchs.New = func() any { return new(scratch) }
	return p, nil
}

type scratch struct {
	s placement.Scratch
	p placement.Placement
}

func (p *Plugin) Name() string { return Name }

func (p *Plugin) onNode(logger klog.Logger, obj any) {
	if n, ok := obj.(*corev1.Node); ok && p.st.upsertNode(logger, n) {
		p.requeue(logger)
	}
}

func (p *Plugin) onPod(logger klog.Logger, obj any) {
	if pod, ok := obj.(*corev1.Pod); ok && p.st.observePod(logger, pod) {
		p.requeue(logger)
	}
}

// requeue moves the GPU pods this plugin last found unschedulable back to
// the active queue: kube-scheduler requeues them on cluster events itself,
// but may do so before this plugin's handler has released the shares.
func (p *Plugin) requeue(logger klog.Logger) {
	p.waitMu.Lock()
	pods := p.waiting
	p.waiting = map[string]*corev1.Pod{}
	p.waitMu.Unlock()
	if len(pods) > 0 && p.activate != nil {
		p.activate(logger, pods)
	}
}

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

func since(point string, start time.Time) {
	pluginDuration.WithLabelValues(point).Observe(time.Since(start).Seconds())
}

// waitSynced blocks until the informers have delivered every existing
// Node and Pod to the plugin, so that a restarted scheduler has rebuilt
// its state from the allocation records before it places anything.
func (p *Plugin) waitSynced(ctx context.Context) error {
	if p.synced.Load() || len(p.syncFns) == 0 {
		return nil
	}
	if !cache.WaitForCacheSync(ctx.Done(), p.syncFns...) {
		return errors.New("GPU state not yet rebuilt from node inventories and pod records")
	}
	p.synced.Store(true)
	return nil
}

// PreFilter parses and compiles the pod's GPU request once per cycle.
// Pods that ask for no GPU skip the plugin entirely.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	defer since("PreFilter", time.Now())
	if !podrequest.RequestsGPU(pod, p.names) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if err := p.waitSynced(ctx); err != nil {
		return nil, fwk.AsStatus(err)
	}
	req, err := podrequest.FromPod(pod, p.names)
	if err != nil {
		failuresTotal.WithLabelValues("InvalidRequest").Inc()
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	p.st.mu.RLock()
	cr, err := p.st.cluster.Compile(req)
	p.st.mu.RUnlock()
	if err != nil {
		failuresTotal.WithLabelValues("InvalidRequest").Inc()
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if !cr.NeedsGPU() {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	pol := placement.PolicyFor(cr, p.policy)
	if obs, ok := pol.(placement.Observer); ok {
		p.st.mu.Lock()
		obs.Observe(cr)
		p.st.mu.Unlock()
	}
	p.st.mu.RLock()
	scores := make([]float64, len(p.st.slot))
	p.st.mu.RUnlock()
	for i := range scores {
		scores[i] = math.NaN()
	}
	cs.Write(stateKey, &cycleState{cr: cr, pol: pol, ranker: placement.RankerFor(cr, pol), total: len(nodes), scores: scores})
	return nil, nil
}

func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

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
	sc := p.scratchs.Get().(*scratch)
	p.st.mu.RLock()
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
	code := fwk.Unschedulable
	if unresolvable(r.Kind) {
		code = fwk.UnschedulableAndUnresolvable
	}
	// A short, node-independent text so kube-scheduler's per-reason
	// histogram groups nodes; PostFilter adds the detailed summary.
	return fwk.NewStatus(code, shortReason(r.Kind))
}

// unresolvable reasons cannot be cured by removing pods from the node.
func unresolvable(k placement.ReasonKind) bool {
	switch k {
	case placement.ReasonNoGPUs, placement.ReasonUnhealthy, placement.ReasonModelExcluded,
		placement.ReasonModelNotIncluded, placement.ReasonUUID, placement.ReasonGPUMemoryPhysical:
		return true
	}
	return false
}

func shortReason(k placement.ReasonKind) string {
	switch k {
	case placement.ReasonNoGPUs:
		return "node has no Tessera GPUs"
	case placement.ReasonGPUMemory, placement.ReasonGPUMemoryPhysical:
		return "not enough free GPU memory"
	case placement.ReasonGPUCores:
		return "not enough free GPU cores"
	case placement.ReasonShares:
		return "GPU share slots exhausted"
	case placement.ReasonWholeGPUs, placement.ReasonGPUCount:
		return "not enough free GPUs"
	case placement.ReasonModelExcluded, placement.ReasonModelNotIncluded, placement.ReasonUUID:
		return "GPUs not selected by the pod's GPU selectors"
	case placement.ReasonSharingMode:
		return "GPUs offered only whole (exclusive mode)"
	case placement.ReasonHeldWhole:
		return "GPUs held whole by other pods"
	case placement.ReasonUnhealthy:
		return "GPUs unhealthy"
	case placement.ReasonNUMA:
		return "no NUMA node with enough suitable GPUs"
	case placement.ReasonCPU, placement.ReasonMemory:
		return "not enough CPU or memory"
	}
	return "GPU request does not fit: " + k.String()
}

// PostFilter explains, per group of nodes, why the pod fit none; the text
// ends up in the pod's FailedScheduling event. It never makes the pod
// schedulable, so it is informational and must run before preemption.
func (p *Plugin) PostFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	defer since("PostFilter", time.Now())
	s := readState(cs)
	if s == nil {
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
	p.waitMu.Lock()
	p.waiting[podrequest.Key(pod)] = pod
	p.waitMu.Unlock()
	if len(reasons) == 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	return nil, fwk.NewStatus(fwk.Unschedulable, "Tessera: "+placement.Summarize(max(s.total, len(reasons)), reasons))
}

// PreScore skips scoring for pods the plugin does not place.
func (p *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if readState(cs) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// scoreScale keeps policy scores (usually fractions) distinct as integers;
// NormalizeScore maps them onto kube-scheduler's range.
const scoreScale = 1e6

// Score returns the node policy's score of the placement Filter found on
// the node (the pod's own policy if it names one).
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s := readState(cs)
	if s == nil {
		return 0, nil
	}
	name := ni.Node().Name
	p.st.mu.RLock()
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

// NormalizeScore maps the raw scores linearly onto [0, MaxNodeScore].
func (p *Plugin) NormalizeScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if len(scores) == 0 {
		return nil
	}
	lo, hi := scores[0].Score, scores[0].Score
	for _, s := range scores {
		lo, hi = min(lo, s.Score), max(hi, s.Score)
	}
	for i := range scores {
		if hi == lo {
			scores[i].Score = fwk.MaxScore
			continue
		}
		scores[i].Score = int64(float64(scores[i].Score-lo) / float64(hi-lo) * float64(fwk.MaxScore))
	}
	return nil
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
	key := podrequest.Key(pod)
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	if r := p.fit(s, nodeName, sc); !r.OK() {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("node %s changed since filtering: %s", nodeName, r))
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
	if p.st.release(podrequest.Key(pod), pod.UID) {
		p.requeue(klog.FromContext(ctx))
	}
}

// recordInBinding reports whether the profile binds through this plugin
// (Tessera first among its bind plugins): then the record travels in the
// Binding and PreBind has nothing to do. Otherwise another binder binds
// GPU pods, and PreBind must write the record before it does.
func (p *Plugin) recordInBinding(logger klog.Logger) bool {
	p.bindOnce.Do(func() {
		lister, ok := p.handle.(interface{ ListPlugins() *schedconfig.Plugins })
		if !ok {
			return
		}
		if pl := lister.ListPlugins(); pl != nil && len(pl.Bind.Enabled) > 0 && pl.Bind.Enabled[0].Name == Name {
			p.bindsSelf = true
		}
		where := "PreBind"
		if p.bindsSelf {
			where = "Binding"
		}
		logger.Info("Where GPU allocation records are written", "writtenIn", where)
	})
	return p.bindsSelf
}

// PreBindPreFlight tells the framework whether PreBind has work to do. It
// has none when Bind carries the record: kube-scheduler then neither runs
// PreBind nor patches the pod's nominatedNodeName before binding.
func (p *Plugin) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if readState(cs) == nil || p.recordInBinding(klog.FromContext(ctx)) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: true}, nil
}

// reserved is the record Reserve made for the pod.
func reserved(s *cycleState, pod *corev1.Pod) (*api.PodAllocation, *fwk.Status) {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if rec == nil {
		return nil, fwk.AsStatus(fmt.Errorf("no GPUs reserved for pod %s", podrequest.Key(pod)))
	}
	return rec, nil
}

// PreBind writes the allocation record on the pod before another plugin
// binds it: the node agent serves the pod's GPUs from it and a restarted
// scheduler rebuilds its state from it.
func (p *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	defer since("PreBind", time.Now())
	s := readState(cs)
	if s == nil {
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
	if s == nil || !p.recordInBinding(klog.FromContext(ctx)) {
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

func (p *Plugin) apiCacher() fwk.APICacher {
	if p.handle == nil {
		return nil
	}
	return p.handle.APICacher()
}

func bindingWithRecord(pod *corev1.Pod, nodeName string, rec *api.PodAllocation) (*corev1.Binding, error) {
	data, err := api.EncodeAllocation(rec)
	if err != nil {
		return nil, err
	}
	return &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{api.AnnotationAllocation: string(data)},
		},
		Target: corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}, nil
}

// transient errors are worth the same request again.
func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err)
}

// createBinding creates the binding, retrying transient errors. An
// attempt that timed out may still have bound the pod, so an error is
// checked against the pod itself: bound to the target with this record
// and UID is success.
func createBinding(ctx context.Context, client kubernetes.Interface, b *corev1.Binding) error {
	pods := client.CoreV1().Pods(b.Namespace)
	err := retry.OnError(retry.DefaultBackoff, transient, func() error {
		return pods.Bind(ctx, b, metav1.CreateOptions{})
	})
	if err == nil {
		return nil
	}
	if cur, gerr := pods.Get(ctx, b.Name, metav1.GetOptions{}); gerr == nil && cur.UID == b.UID &&
		cur.Spec.NodeName == b.Target.Name && cur.Annotations[api.AnnotationAllocation] == b.Annotations[api.AnnotationAllocation] {
		return nil
	}
	return fmt.Errorf("binding pod %s/%s to %s with its GPU allocation record: %w", b.Namespace, b.Name, b.Target.Name, err)
}

// WriteRecord sets the allocation annotation on the pod with the given UID,
// retrying on conflicts and transient server errors.
func WriteRecord(ctx context.Context, client kubernetes.Interface, namespace, name string, uid types.UID, rec *api.PodAllocation) error {
	data, err := api.EncodeAllocation(rec)
	if err != nil {
		return err
	}
	patch, err := jsonMergePatch(uid, string(data))
	if err != nil {
		return err
	}
	retriable := func(err error) bool { return apierrors.IsConflict(err) || transient(err) }
	err = retry.OnError(retry.DefaultBackoff, retriable, func() error {
		_, err := client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("writing the GPU allocation record on pod %s/%s: %w", namespace, name, err)
	}
	return nil
}
