package policies

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tessera-gpu/tessera/internal/placement"
)

// nodeCache keeps values a policy computed for a node's state, per key (a
// pod shape), until the node changes (placement.Node.Version) or the
// policy's model does (gen). Lookups take no lock: nodes are found in an
// open-addressing table of atomic pointers, and each node's values live
// in an immutable state record swapped atomically when the node changes;
// values are written once per key with atomic stores. Two goroutines that
// compute the same missing value store equal values, so a race costs
// work, never correctness. Only a node seen for the first time takes the
// table's mutex.
type nodeCache[V any] struct {
	mu  sync.Mutex
	tab atomic.Pointer[nodeTable[V]]
}

type nodeTable[V any] struct {
	slots []atomic.Pointer[nodeSlot[V]]
	mask  uint64
	used  int // written under nodeCache.mu
}

type nodeSlot[V any] struct {
	node  *placement.Node
	state atomic.Pointer[nodeState[V]]
}

// nodeState holds a node's values at one version and model generation,
// indexed by key.
type nodeState[V any] struct {
	version uint64
	gen     uint64
	vals    []atomic.Pointer[V]
}

// maxCachedNodes bounds the table: nodes replaced by UpsertNode or removed
// leave stale slots, so a long-running scheduler starts afresh beyond it.
const maxCachedNodes = 1 << 16

// get returns the value for key on n at model generation gen, computing
// it with compute if it is not cached. keys hints how many keys exist.
func (c *nodeCache[V]) get(n *placement.Node, gen uint64, key, keys int, compute func() *V) *V {
	sl := c.slot(n)
	st := sl.state.Load()
	for st == nil || st.version != n.Version || st.gen != gen || key >= len(st.vals) {
		next := &nodeState[V]{version: n.Version, gen: gen, vals: make([]atomic.Pointer[V], max(key+1, keys))}
		if st != nil && st.version == n.Version && st.gen == gen {
			for i := range st.vals { // more keys than when it was made
				next.vals[i].Store(st.vals[i].Load())
			}
		}
		if sl.state.CompareAndSwap(st, next) {
			st = next
			break
		}
		st = sl.state.Load()
	}
	if v := st.vals[key].Load(); v != nil {
		return v
	}
	v := compute()
	st.vals[key].Store(v)
	return v
}

// slot returns n's slot, adding one if n was never seen.
func (c *nodeCache[V]) slot(n *placement.Node) *nodeSlot[V] {
	h := hashNode(n)
	if sl := c.tab.Load().find(n, h); sl != nil {
		return sl
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.tab.Load()
	if sl := t.find(n, h); sl != nil {
		return sl
	}
	switch {
	case t == nil || t.used >= maxCachedNodes:
		t = newNodeTable[V](64)
	case 2*(t.used+1) > len(t.slots):
		bigger := newNodeTable[V](2 * len(t.slots))
		for i := range t.slots {
			if sl := t.slots[i].Load(); sl != nil {
				bigger.put(sl, hashNode(sl.node))
			}
		}
		t = bigger
	}
	sl := &nodeSlot[V]{node: n}
	t.put(sl, h)
	c.tab.Store(t)
	return sl
}

func newNodeTable[V any](size int) *nodeTable[V] {
	return &nodeTable[V]{slots: make([]atomic.Pointer[nodeSlot[V]], size), mask: uint64(size - 1)}
}

func (t *nodeTable[V]) find(n *placement.Node, h uint64) *nodeSlot[V] {
	if t == nil {
		return nil
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		sl := t.slots[i].Load()
		if sl == nil {
			return nil
		}
		if sl.node == n {
			return sl
		}
	}
}

// put adds a slot; the caller holds the cache's mutex and has made room.
func (t *nodeTable[V]) put(sl *nodeSlot[V], h uint64) {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		if t.slots[i].Load() == nil {
			t.slots[i].Store(sl)
			t.used++
			return
		}
	}
}

// hashNode mixes a node's address (Go's heap does not move objects).
func hashNode(n *placement.Node) uint64 {
	h := uint64(uintptr(unsafe.Pointer(n)))
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// shapeIDs numbers shapes for the per-node caches without a lock on
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

// count is an upper bound on the numbers given out.
func (s *shapeIDs) count() int { return int(s.next.Load()) }
