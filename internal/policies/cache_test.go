package policies

import (
	"fmt"
	"math"
	"testing"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies/policytest"
)

// cachedShapes counts the shapes the policy's current set of node tables
// holds.
func cachedShapes(f *FGD) int {
	n := 0
	f.tables.Load().ids.ids.Range(func(any, any) bool { n++; return true })
	return n
}

// The per-shape node tables stay bounded however many shapes arrive (a
// stream of pods with all-different CPU requests used to grow them
// without end, about 2 MB per shape at 5,000 nodes), a new model starts
// them afresh, and the scores are what a policy that never dropped a
// table gives.
func TestShapeTablesBounded(t *testing.T) {
	c := policytest.Cluster(t, 12, 3)
	var target []Shape
	for _, r := range policytest.Pods(300, 5) {
		target = append(target, RequestShape(r))
	}
	// A fixed target: the model never changes below, so only the bound
	// drops tables.
	f := NewTessera(c, DefaultTesseraParams())
	f.p.UseTarget = true
	f.SetTarget(target)
	order := make([]int, len(c.Nodes()))
	for i := range order {
		order[i] = i
	}
	const shapes = 400 // more than maxCachedShapes
	for i := 0; i < shapes; i++ {
		r := &placement.Request{Pod: fmt.Sprintf("p%d", i), CPUMilli: int64(1000 + i), MemoryMiB: 512,
			Containers: []placement.Container{{Name: "main", GPUs: 1, MemoryPercent: 30, Cores: 30}}}
		cr, err := c.Compile(r)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := policytest.ScoreAll(c, cr, f.ForPod(cr), order, 2)
		// A fresh policy with the same model: nothing cached.
		ref := NewTessera(c, DefaultTesseraParams())
		ref.p.UseTarget = true
		ref.SetTarget(target)
		want, _ := policytest.ScoreAll(c, cr, ref.ForPod(cr), order, 1)
		for k := range got {
			if got[k] != want[k] && !(math.IsNaN(got[k]) && math.IsNaN(want[k])) {
				t.Fatalf("pod %d node %d: score %v, uncached %v", i, k, got[k], want[k])
			}
		}
		if n := cachedShapes(f.FGD); n > maxCachedShapes+1 {
			t.Fatalf("after %d shapes the policy caches %d, want at most %d", i+1, n, maxCachedShapes+1)
		}
	}
	if n := cachedShapes(f.FGD); n >= shapes {
		t.Fatalf("%d shapes seen, %d cached: nothing was ever dropped", shapes, n)
	}
	f.SetTarget(target)
	if n := cachedShapes(f.FGD); n != 0 {
		t.Fatalf("a new model keeps %d shapes' tables, want 0", n)
	}
}
