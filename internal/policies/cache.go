package policies

import (
	"sync"
	"sync/atomic"

	"github.com/tessera-gpu/tessera/internal/placement"
)

// NodeTable keeps one value per node, computed for the node's state
// (placement.Node.Version) under one generation of the policy's model,
// until either changes. Lookups take no lock: the values are kept by the
// node's dense index in its cluster (placement.Node.Index), one atomic
// pointer to an immutable record per index, so finding a node's value is
// one array read and a check that the record is for this node, its
// version and the generation. A record for another node (one replaced by
// UpsertNode or moved by RemoveNode) is simply replaced. Two goroutines
// that compute the same missing value store equal values, so a race costs
// work, never correctness. Only growing the slice takes its mutex (a
// store racing with growth may be lost, which costs a recomputation).
//
// A policy keeps one table per pod shape (keyedTables), so finding a
// node's value for the shape being scored is one array read and two
// loads.
type NodeTable[V any] struct {
	mu    sync.Mutex // growth only
	slots atomic.Pointer[[]atomic.Pointer[cached[V]]]
}

// cached is a value with the node, node version and model generation it
// was computed for.
type cached[V any] struct {
	node         *placement.Node
	version, gen uint64
	v            V
}

// Get returns n's value at model generation gen, computing it in place
// with fill if it is not cached.
func (nt *NodeTable[V]) Get(n *placement.Node, gen uint64, fill func(*V)) *V {
	i := n.Index()
	s := nt.slots.Load()
	if s == nil || i >= len(*s) {
		s = nt.grow(i)
	}
	slot := &(*s)[i]
	if c := slot.Load(); c != nil && c.node == n && c.version == n.Version && c.gen == gen {
		return &c.v
	}
	c := &cached[V]{node: n, version: n.Version, gen: gen}
	fill(&c.v)
	slot.Store(c)
	return &c.v
}

// grow makes room for index i (at least doubling) and returns the slots;
// a caller that lost the race finds them grown already.
func (nt *NodeTable[V]) grow(i int) *[]atomic.Pointer[cached[V]] {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	s := nt.slots.Load()
	if s != nil && i < len(*s) {
		return s
	}
	size := 64
	if s != nil {
		size = 2 * len(*s)
	}
	next := make([]atomic.Pointer[cached[V]], max(size, i+1))
	if s != nil {
		for j := range *s {
			next[j].Store((*s)[j].Load())
		}
	}
	nt.slots.Store(&next)
	return &next
}

// keyedTables is one NodeTable per key (a pod shape's number), made on
// first use; finding a key's table takes no lock.
type keyedTables[V any] struct {
	mu     sync.Mutex
	tables atomic.Pointer[[]*NodeTable[V]]
}

func (k *keyedTables[V]) table(key int) *NodeTable[V] {
	if ts := k.tables.Load(); ts != nil && key < len(*ts) {
		return (*ts)[key]
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var old []*NodeTable[V]
	if ts := k.tables.Load(); ts != nil {
		old = *ts
	}
	if key < len(old) {
		return old[key]
	}
	next := make([]*NodeTable[V], max(key+1, 2*len(old)))
	copy(next, old)
	for i := len(old); i < len(next); i++ {
		next[i] = &NodeTable[V]{}
	}
	k.tables.Store(&next)
	return next[key]
}

// shapeIDs numbers shapes for the per-shape tables without a lock on
// lookup.
type shapeIDs struct {
	ids  sync.Map // Shape → int
	next atomic.Int64
}

func (s *shapeIDs) id(sh Shape) int {
	if v, ok := s.ids.Load(sh); ok {
		return v.(int)
	}
	// If another goroutine numbers it first, ours is skipped.
	v, _ := s.ids.LoadOrStore(sh, int(s.next.Add(1)-1))
	return v.(int)
}

// maxCachedShapes bounds the shapes a shapeTables caches values for. A
// shape's table holds a value (a few hundred bytes) for every node the
// shape was scored on, so at 5,000 nodes a table is about 2 MB; a cluster's
// workload has a few dozen shapes (the openb trace 91, counting CPU-only
// ones), a stream of pods with all-different requests has one per pod.
const maxCachedShapes = 128

// shapeTables holds the node tables of up to maxCachedShapes pod shapes.
type shapeTables struct {
	ids    shapeIDs
	tables keyedTables[fgdEntry]
}

// table returns key's node table, or nil when the set is full.
func (st *shapeTables) table(key Shape) *NodeTable[fgdEntry] {
	id := st.ids.id(key)
	if id >= maxCachedShapes {
		return nil
	}
	return st.tables.table(id)
}
