package policies

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tessera-gpu/tessera/internal/placement"
)

// nodeTable keeps one value per node, computed for the node's state
// (placement.Node.Version) under one generation of the policy's model,
// until either changes. Lookups take no lock: nodes are found in an
// open-addressing table of atomic pointers, a node's slot is claimed with
// a compare-and-swap, and each value is an immutable record stored with an
// atomic pointer. Two goroutines that compute the same missing value store
// equal values, so a race costs work, never correctness. Only growing the
// table takes its mutex.
//
// A policy keeps one table per pod shape (keyedTables), so finding a
// node's value for the shape being scored is one hash probe and two
// loads.
type nodeTable[V any] struct {
	mu  sync.Mutex // growth only
	cur atomic.Pointer[tableSlots[V]]
}

type tableSlots[V any] struct {
	slots []tableSlot[V]
	mask  uint64
	used  atomic.Int64
}

type tableSlot[V any] struct {
	node atomic.Pointer[placement.Node]
	val  atomic.Pointer[cached[V]]
}

// cached is a value with the node version and model generation it was
// computed at.
type cached[V any] struct {
	version, gen uint64
	v            V
}

// maxCachedNodes bounds a table: nodes replaced by UpsertNode or removed
// leave stale slots, so a long-running scheduler starts afresh beyond it.
const maxCachedNodes = 1 << 16

// get returns n's value at model generation gen, computing it in place
// with fill if it is not cached.
func (nt *nodeTable[V]) get(n *placement.Node, gen uint64, fill func(*V)) *V {
	h := hashNode(n)
	for {
		t := nt.cur.Load()
		if t == nil {
			nt.grow(nil)
			continue
		}
		for i := h & t.mask; ; {
			s := &t.slots[i]
			switch p := s.node.Load(); {
			case p == n:
				if c := s.val.Load(); c != nil && c.version == n.Version && c.gen == gen {
					return &c.v
				}
				c := &cached[V]{version: n.Version, gen: gen}
				fill(&c.v)
				s.val.Store(c)
				return &c.v
			case p != nil:
				i = (i + 1) & t.mask
				continue
			}
			// An empty slot: n is not in the table.
			if 2*(t.used.Load()+1) > int64(len(t.slots)) {
				nt.grow(t)
				break // probe the new table
			}
			if s.node.CompareAndSwap(nil, n) {
				t.used.Add(1)
			}
			// Claimed, or taken by another node meanwhile: look again.
		}
	}
}

// grow replaces table t (nil: none yet) by one twice its size holding its
// slots, or by an empty one once it holds maxCachedNodes nodes; a caller
// that lost the race finds the table already replaced.
func (nt *nodeTable[V]) grow(t *tableSlots[V]) {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if nt.cur.Load() != t {
		return
	}
	size := 64
	if t != nil && int(t.used.Load()) < maxCachedNodes {
		size = 2 * len(t.slots)
	}
	next := &tableSlots[V]{slots: make([]tableSlot[V], size), mask: uint64(size - 1)}
	if t != nil && size > len(t.slots) {
		for i := range t.slots {
			n := t.slots[i].node.Load()
			if n == nil {
				continue
			}
			for j := hashNode(n) & next.mask; ; j = (j + 1) & next.mask {
				if next.slots[j].node.Load() == nil {
					next.slots[j].node.Store(n)
					next.slots[j].val.Store(t.slots[i].val.Load())
					next.used.Add(1)
					break
				}
			}
		}
	}
	nt.cur.Store(next)
}

// hashNode places a node by its address (Go's heap does not move
// objects), keeping the addresses' order: nodes made one after another,
// as a cluster's are, land in nearby slots, so a pass over the cluster
// reads the table nearly in sequence instead of at random (one cache miss
// per node otherwise, most of the lookup's cost).
func hashNode(n *placement.Node) uint64 {
	return uint64(uintptr(unsafe.Pointer(n))) >> 8
}

// keyedTables is one nodeTable per key (a pod shape's number), made on
// first use; finding a key's table takes no lock.
type keyedTables[V any] struct {
	mu     sync.Mutex
	tables atomic.Pointer[[]*nodeTable[V]]
}

func (k *keyedTables[V]) table(key int) *nodeTable[V] {
	if ts := k.tables.Load(); ts != nil && key < len(*ts) {
		return (*ts)[key]
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var old []*nodeTable[V]
	if ts := k.tables.Load(); ts != nil {
		old = *ts
	}
	if key < len(old) {
		return old[key]
	}
	next := make([]*nodeTable[V], max(key+1, 2*len(old)))
	copy(next, old)
	for i := len(old); i < len(next); i++ {
		next[i] = &nodeTable[V]{}
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
