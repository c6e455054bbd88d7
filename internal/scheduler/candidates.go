package scheduler

// Narrowing: the policy chooses among all nodes, not kube-scheduler's
// sample of them.

import (
	"context"
	"sort"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

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

// candidates runs the placement core's fit check and the policy's score
// on every node the plugin holds, as the simulator's Search does (through
// the plugin's Memo, as Search does), records
// the scores in s (Filter and Score reuse them) and returns the names of
// the best Candidates nodes, plus every node in mode dra when the pod may
// take GPUs there (dra.go). It returns nil when no node fits: then
// kube-scheduler filters every node and the pod's event says why each
// failed.
func (p *Plugin) candidates(ctx context.Context, s *cycleState) sets.Set[string] {
	p.st.mu.RLock()
	defer p.st.mu.RUnlock()
	nodes := p.st.cluster.Nodes()
	const chunk = 256
	parts := (len(nodes) + chunk - 1) / chunk
	tops := make([][]candidate, parts)
	// Nodes unchanged since the last pod of this shape keep their verdict
	// and score (placement.Memo): a lookup instead of a fit check.
	scan := p.memo.Begin(s.cr, s.pol, s.ranker, len(nodes))
	defer scan.End()
	search := func(k int) {
		sc := p.scratchs.Get().(*scratch)
		defer p.scratchs.Put(sc)
		var top []candidate
		for _, n := range nodes[k*chunk : min(len(nodes), (k+1)*chunk)] {
			if r, score := scan.Eval(n, &sc.s, &sc.p); r.OK() {
				c := candidate{name: n.Name, score: score}
				if i, ok := p.st.slot[n.Name]; ok && i < len(s.scores) {
					s.scores[i] = c.score // each node has its own slot
				}
				top = keep(top, c)
			}
		}
		tops[k] = top
	}
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

// keep inserts c into top (sorted best first) if it is among the best
// Candidates.
func keep(top []candidate, c candidate) []candidate {
	if len(top) == Candidates && !c.before(top[len(top)-1]) {
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
