package placement

import (
	"strconv"
	"sync"
)

// Memoizable is implemented by policies (usually the prepared scorer that
// Prepare returns) whose ScoreNode, and GPU ranking if they rank GPUs, is
// a pure function of the request, the node's state (Node.Version) and
// what Generation names: the policy instance and the version of what it
// has learned. Their results may be remembered per node until the node or
// the generation changes (Memo). A policy whose scores depend on anything
// else, such as a pod's arrival number for random tie-breaking, must not
// implement it (a type that embeds Binpack or Spread and scores otherwise
// inherits their Generation and must not).
type Memoizable interface {
	Generation() (owner any, gen uint64)
}

// Generation: binpack's scores depend on the request and the node only.
func (Binpack) Generation() (any, uint64) { return Binpack{}, 0 }

// Generation: spread's scores depend on the request and the node only.
func (Spread) Generation() (any, uint64) { return Spread{}, 0 }

// memoShapes is how many request shapes a Memo remembers; the least
// recently used is forgotten first. Replicas of a workload share a shape,
// so a cluster's steady stream of pods has few.
const memoShapes = 32

// Memo remembers, per request shape (the request without the pod's name)
// and policy generation, each node's fit verdict and score, keyed by the
// node's state. Between two pods of a shape only the nodes that changed
// (usually the one the previous pod went to) are fit and scored again, so
// a search over every node costs a lookup per node. Results are exactly
// what Fit and ScoreNode return: a search with a Memo chooses what it
// chooses without one.
//
// A Memo may be shared by goroutines: each search holds its shape's table
// for the search (Begin … End); a search that finds its table busy runs
// without the memo rather than wait.
type Memo struct {
	mu     sync.Mutex
	tables map[string]*memoTable
	epoch  uint64 // last epoch handed out; entries of older epochs are stale
	tick   uint64
}

// NewMemo returns an empty memo.
func NewMemo() *Memo { return &Memo{tables: map[string]*memoTable{}} }

type memoTable struct {
	busy  sync.Mutex
	key   string
	owner any
	gen   uint64
	epoch uint64
	used  uint64 // Memo.tick at the last Begin, for eviction
	e     []memoEntry
}

// memoEntry is a node's verdict and score under its table's epoch.
type memoEntry struct {
	node    *Node
	version uint64
	epoch   uint64
	score   float64
	reason  Reason
}

// MemoScan is one search's use of a Memo: the request's table, held until
// End. A nil *MemoScan computes everything afresh.
type MemoScan struct {
	t     *memoTable
	epoch uint64
	cr    *Compiled
	pol   Policy
	rank  GPURanker
}

// Begin starts a search for cr under pol (prepared for cr) with ranker
// over a cluster of up to nodes nodes. The MemoScan evaluates nodes
// (Eval) from any goroutine, provided no two goroutines evaluate the same
// node at once, until End. It never returns nil, so Eval always works;
// without memoisation (m nil, a policy that is not Memoizable, or the
// table in use by another search) it computes every node afresh.
func (m *Memo) Begin(cr *Compiled, pol Policy, ranker GPURanker, nodes int) *MemoScan {
	sc := &MemoScan{cr: cr, pol: pol, rank: ranker}
	mz, ok := pol.(Memoizable)
	if m == nil || !ok {
		return sc
	}
	owner, gen := mz.Generation()
	key := pol.Name() + "\x00" + cr.shapeKey()
	m.mu.Lock()
	m.tick++
	t := m.tables[key]
	if t == nil {
		t = m.newTable(key)
	}
	if !t.busy.TryLock() {
		m.mu.Unlock()
		return sc
	}
	t.used = m.tick
	if t.owner != owner || t.gen != gen {
		t.owner, t.gen = owner, gen
		m.epoch++
		t.epoch = m.epoch
	}
	m.mu.Unlock()
	if len(t.e) < nodes {
		t.e = append(t.e, make([]memoEntry, nodes-len(t.e))...)
	}
	sc.t, sc.epoch = t, t.epoch
	return sc
}

// newTable makes key's table, reusing the least recently used one's
// memory when the memo is full; the caller holds m.mu.
func (m *Memo) newTable(key string) *memoTable {
	var t *memoTable
	if len(m.tables) >= memoShapes {
		// Only Begin, under m.mu, makes a table busy: one found idle
		// here stays idle until m.mu is released.
		var old *memoTable
		for _, c := range m.tables {
			if old == nil || c.used < old.used {
				if c.busy.TryLock() {
					c.busy.Unlock()
					old = c
				}
			}
		}
		if old != nil {
			delete(m.tables, old.key)
			t = &memoTable{e: old.e}
		}
	}
	if t == nil {
		t = &memoTable{}
	}
	m.epoch++
	t.key, t.epoch = key, m.epoch
	m.tables[key] = t
	return t
}

// Eval returns whether cr fits n (Fit's reason) and, when it does, the
// policy's score, reusing the node's remembered result when n has not
// changed since it was computed. When it computes afresh it leaves the
// placement in p (scratch s); when it remembers, p is untouched, so a
// caller that needs the placement runs Fit for the node it chose.
func (sc *MemoScan) Eval(n *Node, s *Scratch, p *Placement) (Reason, float64) {
	var e *memoEntry
	if sc.t != nil && n.index < len(sc.t.e) {
		e = &sc.t.e[n.index]
		if e.node == n && e.version == n.Version && e.epoch == sc.epoch {
			return e.reason, e.score
		}
	}
	r := sc.cr.Fit(n, sc.rank, s, p)
	var score float64
	if r.OK() {
		score = sc.pol.ScoreNode(sc.cr, p)
	}
	if e != nil {
		*e = memoEntry{node: n, version: n.Version, epoch: sc.epoch, score: score, reason: r}
	}
	return r, score
}

// End releases the table for other searches.
func (sc *MemoScan) End() {
	if sc.t != nil {
		sc.t.busy.Unlock()
		sc.t = nil
	}
}

// shapeKey is everything in the compiled request that Fit and a policy
// may read, except the pod's name: requests with equal keys fit and score
// alike on every node.
func (cr *Compiled) shapeKey() string { return cr.key }

// memoKey computes shapeKey once, in Compile.
func memoKey(cr *Compiled) string {
	r := cr.Req
	b := make([]byte, 0, 96)
	num := func(v int64) { b = strconv.AppendInt(b, v, 10); b = append(b, ',') }
	str := func(v string) { b = strconv.AppendQuote(b, v); b = append(b, ',') }
	strs := func(vs []string) {
		num(int64(len(vs)))
		for _, v := range vs {
			str(v)
		}
	}
	num(r.CPUMilli)
	num(r.MemoryMiB)
	for _, cs := range [][]Container{r.InitContainers, r.Containers} {
		num(int64(len(cs)))
		for _, c := range cs {
			str(c.Name)
			num(int64(c.GPUs))
			num(c.MemoryMiB)
			num(int64(c.MemoryPercent))
			num(int64(c.Cores))
			num(c.CeilingMiB)
			str(c.MIGProfile)
		}
	}
	strs(r.IncludeModels)
	strs(r.ExcludeModels)
	strs(r.IncludeUUIDs)
	strs(r.ExcludeUUIDs)
	if r.NUMABind {
		b = append(b, 'N')
	}
	str(string(r.NodePolicy))
	str(string(r.GPUPolicy))
	str(string(cr.gpuPol))
	return string(b)
}
