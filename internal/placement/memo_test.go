package placement

import (
	"fmt"
	"testing"
)

// countingPolicy scores as binpack and counts its ScoreNode calls;
// memoizedCounting is the same with gen as its generation (Memoizable).
type countingPolicy struct {
	calls *int
	gen   *uint64
}

func (countingPolicy) Name() string { return "counting" }

func (c countingPolicy) ScoreNode(cr *Compiled, p *Placement) float64 {
	*c.calls++
	return Binpack{}.ScoreNode(cr, p)
}

type memoizedCounting struct{ countingPolicy }

func (c memoizedCounting) Generation() (any, uint64) { return c.calls, *c.gen }

// Between two pods of a shape, the Memo fits and scores again only the
// nodes that changed, and everything after a new generation.
func TestMemoRescoresOnlyChangedNodes(t *testing.T) {
	c := NewCluster()
	for i := 0; i < 20; i++ {
		c.UpsertNode(mustNode(t, fmt.Sprintf("n%02d", i), inventory(4, "T4", 16000, 10)))
	}
	calls, gen := 0, uint64(1)
	pol := memoizedCounting{countingPolicy{calls: &calls, gen: &gen}}
	sr := NewSearch(c)
	next := 0
	placeOne := func(r *Request) *Placement {
		t.Helper()
		r.Pod = fmt.Sprintf("p%d", next)
		next++
		cr := mustCompile(t, c, r)
		p := sr.Best(cr, pol)
		if p == nil {
			t.Fatalf("%s fits nowhere: %s", r.Pod, sr.Explain())
		}
		if _, err := c.Assign(cr, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	frac := func() *Request { return pod("", share("main", 2000, 10)) }
	expect := func(what string, want int) {
		t.Helper()
		if calls != want {
			t.Fatalf("%s: %d ScoreNode calls, want %d", what, calls, want)
		}
		calls = 0
	}
	placeOne(frac())
	expect("first pod of the shape", 20)
	p := placeOne(frac())
	expect("second pod: only the node the first went to changed", 1)
	c.Release("p1")
	placeOne(frac())
	expect("after a release on the node the second pod went to", 1)
	placeOne(pod("", whole("main", 1)))
	expect("a new shape", 20)
	placeOne(frac())
	expect("the share again, two nodes changed since (one if both pods went to one node)", calls)
	gen++
	placeOne(frac())
	expect("a new generation", 20)
	// A node replaced (new inventory) is fit afresh.
	c.UpsertNode(mustNode(t, p.Node.Name, inventory(4, "T4", 16000, 10)))
	placeOne(frac())
	if calls < 1 || calls > 2 {
		t.Fatalf("after replacing a node: %d ScoreNode calls, want 1 or 2", calls)
	}
	calls = 0
	// A policy that is not Memoizable is scored on every node every time.
	plain := countingPolicy{calls: &calls, gen: &gen}
	cr := mustCompile(t, c, frac())
	sr.Best(cr, plain)
	sr.Best(cr, plain)
	expect("a policy without Generation, twice", 40)
}

// Requests that differ in anything Fit or a policy reads have different
// shape keys; the pod's name is not part of it.
func TestMemoShapeKey(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", inventory(4, "T4", 16000, 10)))
	base := func() *Request {
		return &Request{Pod: "a", CPUMilli: 1000, MemoryMiB: 512, Containers: []Container{share("main", 2000, 10)}}
	}
	key := func(r *Request) string { return mustCompile(t, c, r).shapeKey() }
	want := key(base())
	other := base()
	other.Pod = "b"
	if key(other) != want {
		t.Errorf("the pod's name changed the shape key")
	}
	changes := map[string]func(r *Request){
		"cpu":            func(r *Request) { r.CPUMilli++ },
		"memory":         func(r *Request) { r.MemoryMiB++ },
		"gpu memory":     func(r *Request) { r.Containers[0].MemoryMiB++ },
		"cores":          func(r *Request) { r.Containers[0].Cores++ },
		"gpus":           func(r *Request) { r.Containers[0].GPUs++ },
		"percent":        func(r *Request) { r.Containers[0].MemoryMiB, r.Containers[0].MemoryPercent = 0, 20 },
		"container name": func(r *Request) { r.Containers[0].Name = "other" },
		"init container": func(r *Request) { r.InitContainers = []Container{share("init", 1000, 5)} },
		"include model":  func(r *Request) { r.IncludeModels = []string{"T4"} },
		"exclude model":  func(r *Request) { r.ExcludeModels = []string{"A10"} },
		"include uuid":   func(r *Request) { r.IncludeUUIDs = []string{"GPU-n-0"} },
		"exclude uuid":   func(r *Request) { r.ExcludeUUIDs = []string{"GPU-n-0"} },
		"numa":           func(r *Request) { r.NUMABind = true },
		"node policy":    func(r *Request) { r.NodePolicy = "spread" },
		"gpu policy":     func(r *Request) { r.GPUPolicy = "spread" },
		"models split":   func(r *Request) { r.IncludeModels = []string{"T4,A10"} },
		"models two":     func(r *Request) { r.IncludeModels = []string{"T4", "A10"} },
	}
	seen := map[string]string{want: "base"}
	for name, change := range changes {
		r := base()
		change(r)
		k := key(r)
		if prev, dup := seen[k]; dup {
			t.Errorf("%s: same shape key as %s", name, prev)
		}
		seen[k] = name
	}
}

// RemoveNode moves the last node into the removed one's index, at the
// same Version here (both fresh): the memo must not take the moved node
// for the removed one.
func TestMemoAfterRemoveNode(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "small", inventory(1, "T4", 16000, 10)))
	c.UpsertNode(mustNode(t, "big", inventory(4, "T4", 16000, 10)))
	sr := NewSearch(c)
	four := func(name string) *Compiled { return mustCompile(t, c, pod(name, whole("main", 4))) }
	if p := sr.Best(four("a"), Binpack{}); p == nil || p.Node.Name != "big" {
		t.Fatalf("want big, got %v", p)
	}
	c.RemoveNode("small")
	if p := sr.Best(four("b"), Binpack{}); p == nil || p.Node.Name != "big" {
		t.Fatalf("after removing small: want big, got %v (%s)", p, sr.Explain())
	}
}
