package scheduler

// Narrowing: the policy chooses among all nodes, not kube-scheduler's
// sample of them.

import (
	"context"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/helper"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Candidates is how many nodes PreFilter hands kube-scheduler: the
// policy's best and its runners-up in the policy's order, so that a node
// another plugin's Filter rejects (taints, affinity, CPU and memory the
// plugin has not seen yet, ports) does not make the pod unschedulable.
const Candidates = 16

// NarrowedRetry is the PostFilter status of a pod whose candidates all
// failed a Filter: it is tried again at once over every node.
const NarrowedRetry = "Tessera: every candidate node failed a filter; retrying over all nodes"

// candidate is a node that fits, with the policy's score; among equal
// scores the node whose name sorts first comes first, as NormalizeScore
// breaks ties.
type candidate struct {
	name  string
	score float64
}

func (a candidate) before(b candidate) bool {
	return a.score > b.score || a.score == b.score && a.name < b.name
}

// nodeRules are the pod's own rules for the nodes it may run on, as
// kube-scheduler's NodeAffinity, TaintToleration and NodeUnschedulable
// filters apply them: its nodeSelector and required node affinity, and
// its tolerations of the nodes' NoSchedule and NoExecute taints and of a
// cordoned node. candidates() checks them, with
// kube-scheduler's own helpers, on each node about to enter the
// candidates only, so a pod pinned to nodes outside the policy's first
// choices gets candidates it may run on, at the cost of a few checks per
// pod rather than one per node.
type nodeRules struct {
	logger      klog.Logger
	affinity    nodeaffinity.RequiredNodeAffinity
	tolerations []corev1.Toleration
	compare     bool // TaintTolerationComparisonOperators
	// selects: the pod has a nodeSelector or a required node affinity.
	selects bool
	// node is the cycle's snapshot of a node (nil: not in the snapshot).
	node func(name string) *corev1.Node
}

// rulesFor returns the pod's node rules over the cycle's snapshot of
// nodes: kube-scheduler's (the handle's), or nodes where there is no
// handle (unit tests and benchmarks); nil, checking nothing, when there
// is neither.
func (p *Plugin) rulesFor(ctx context.Context, pod *corev1.Pod, nodes []fwk.NodeInfo) *nodeRules {
	r := &nodeRules{
		logger:      klog.FromContext(ctx),
		affinity:    nodeaffinity.GetRequiredNodeAffinity(pod),
		tolerations: pod.Spec.Tolerations,
		compare:     utilfeature.DefaultFeatureGate.Enabled(features.TaintTolerationComparisonOperators),
		selects: len(pod.Spec.NodeSelector) > 0 || pod.Spec.Affinity != nil && pod.Spec.Affinity.NodeAffinity != nil &&
			pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil,
	}
	switch {
	case p.handle != nil && p.handle.SnapshotSharedLister() != nil:
		infos := p.handle.SnapshotSharedLister().NodeInfos()
		r.node = func(name string) *corev1.Node {
			if ni, err := infos.Get(name); err == nil {
				return ni.Node()
			}
			return nil
		}
	case len(nodes) > 0:
		byName := make(map[string]*corev1.Node, len(nodes))
		for _, ni := range nodes {
			if n := ni.Node(); n != nil {
				byName[n.Name] = n
			}
		}
		r.node = func(name string) *corev1.Node { return byName[name] }
	default:
		return nil
	}
	return r
}

// allow reports whether the pod may run on the node by its rules; a node
// missing from the cycle's snapshot is never filtered, so it is no
// candidate either.
func (r *nodeRules) allow(name string) bool {
	if r == nil {
		return true
	}
	n := r.node(name)
	if n == nil {
		return false
	}
	if ok, _ := r.affinity.Match(n); !ok {
		return false
	}
	if n.Spec.Unschedulable && !v1helper.TolerationsTolerateTaint(r.logger, r.tolerations, &cordoned, r.compare) {
		return false // cordoned (NodeUnschedulable)
	}
	_, untolerated := v1helper.FindMatchingUntoleratedTaint(r.logger, n.Spec.Taints, r.tolerations, helper.DoNotScheduleTaintsFilterFunc(), r.compare)
	return !untolerated
}

// cordoned is the taint whose toleration NodeUnschedulable takes for a
// toleration of a cordoned node.
var cordoned = corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}

// candidates runs the placement core's fit check and the policy's score
// on every node the plugin holds, as the simulator's Search does (through
// the plugin's Memo, as Search does), records the scores in s (Filter and
// Score reuse them) and returns the names of the best Candidates nodes
// the pod's own rules allow (s.rules), plus every node in mode dra when
// the pod may take GPUs there (dra.go). It returns nil when no node it
// may run on fits: then kube-scheduler filters every node and the pod's
// event says why each failed.
func (p *Plugin) candidates(ctx context.Context, s *cycleState) sets.Set[string] {
	p.st.mu.RLock()
	defer p.st.mu.RUnlock()
	top := p.search(ctx, s, p.st.cluster.Nodes(), p.memo, func(name string, score float64) {
		if i, ok := p.st.slot[name]; ok && i < len(s.scores) {
			s.scores[i] = score // each node has its own slot
		}
	})
	if len(top) == 0 {
		return nil
	}
	names := sets.New[string]()
	for _, c := range top {
		names.Insert(c.name)
	}
	if s.draWhy == "" {
		for n, m := range p.st.mode {
			if m == api.ModeDRA {
				names.Insert(n)
			}
		}
	}
	return names
}

// search runs s's fit check and policy score on every node of nodes
// (through memo) and returns the best Candidates among those the pod's
// own rules allow, best first; record (if not nil) is told the score of
// every node that fits, from several goroutines at once. The caller holds
// the lock that guards nodes.
func (p *Plugin) search(ctx context.Context, s *cycleState, nodes []*placement.Node, memo *placement.Memo, record func(name string, score float64)) []candidate {
	const chunk = 256
	parts := (len(nodes) + chunk - 1) / chunk
	tops := make([][]candidate, parts)
	// Nodes unchanged since the last pod of this shape keep their verdict
	// and score (placement.Memo): a lookup instead of a fit check.
	scan := memo.Begin(s.cr, s.pol, s.ranker, len(nodes))
	defer scan.End()
	// For a pod without a nodeSelector or required affinity, rules is
	// nil in the first pass: the policy's best nodes are usually all ones
	// the pod may run on (nodes without taints, or with taints it
	// tolerates), and checking 16 nodes costs less than checking each
	// node as it enters a chunk's best. Only if one of them is not does a
	// second pass (each node's verdict a lookup in the memo by then) keep
	// the nodes the pod may not run on out as it goes. A pod that selects
	// nodes is checked in one pass.
	var rules *nodeRules
	if s.rules != nil && s.rules.selects {
		rules = s.rules
	}
	search := func(k int) {
		sc := p.scratchs.Get().(*scratch)
		defer p.scratchs.Put(sc)
		var top []candidate
		for _, n := range nodes[k*chunk : min(len(nodes), (k+1)*chunk)] {
			eval := scan.Eval
			if v := s.nominated[n.Name]; v != nil {
				// With the pods nominated there put on: not the node's
				// own verdict, so not the memo's either.
				n, eval = v.Node, func(n *placement.Node, ps *placement.Scratch, pp *placement.Placement) (placement.Reason, float64) {
					r := s.cr.Fit(n, s.ranker, ps, pp)
					if !r.OK() {
						return r, 0
					}
					return r, s.pol.ScoreNode(s.cr, pp)
				}
			}
			if r, score := eval(n, &sc.s, &sc.p); r.OK() {
				c := candidate{name: n.Name, score: score}
				if record != nil {
					record(n.Name, score)
				}
				if kept(top, c) && rules.allow(n.Name) {
					top = keep(top, c)
				}
			}
		}
		tops[k] = top
	}
	best := func() []candidate {
		if p.handle != nil && parts > 1 {
			p.handle.Parallelizer().Until(ctx, parts, search, Name)
		} else {
			for k := range parts {
				search(k)
			}
		}
		var top []candidate
		for _, t := range tops {
			for _, c := range t {
				top = keep(top, c)
			}
		}
		return top
	}
	top := best()
	if rules == nil && s.rules != nil && slices.ContainsFunc(top, func(c candidate) bool { return !s.rules.allow(c.name) }) {
		rules = s.rules
		top = best()
	}
	return top
}

// kept reports whether keep would insert c into top.
func kept(top []candidate, c candidate) bool {
	return len(top) < Candidates || c.before(top[len(top)-1])
}

// keep inserts c into top (sorted best first) if it is among the best
// Candidates.
func keep(top []candidate, c candidate) []candidate {
	if !kept(top, c) {
		return top
	}
	i := sort.Search(len(top), func(i int) bool { return c.before(top[i]) })
	if len(top) < Candidates {
		top = append(top, candidate{})
	}
	copy(top[i+1:], top[i:len(top)-1])
	top[i] = c
	return top
}

// wide reports whether the pod's candidates failed at an earlier attempt.
func (p *Plugin) wide(uid types.UID) bool {
	p.obsMu.Lock()
	defer p.obsMu.Unlock()
	_, ok := p.widened[uid]
	return ok
}

// widen makes the pod's next attempts look at every node.
func (p *Plugin) widen(uid types.UID) {
	p.obsMu.Lock()
	p.widened[uid] = struct{}{}
	p.obsMu.Unlock()
}
