package policies

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies/policytest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestFreeMilli(t *testing.T) {
	n := policytest.Node(t, 64000, 0, "T4", 1000, 300)
	if got := FreeMilli(&n.GPUs[0]); got != 1000 {
		t.Errorf("idle GPU: %d, want 1000", got)
	}
	if got := FreeMilli(&n.GPUs[1]); got != 300 {
		t.Errorf("GPU with 700 used: %d, want 300", got)
	}
	n.GPUs[0].Used = placement.Usage{MemoryMiB: 10000, Cores: 100, Shares: 1, Exclusive: 1}
	if got := FreeMilli(&n.GPUs[0]); got != 0 {
		t.Errorf("exclusive GPU: %d, want 0", got)
	}
}

// twoShapes is a target of a 500m share and a whole GPU, equally popular.
var twoShapes = []WeightedShape{
	{Shape: Shape{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}, Weight: 0.5},
	{Shape: Shape{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}, Weight: 0.5},
}

func TestFGDFrag(t *testing.T) {
	m := newFragModel(twoShapes, false)
	a := m.accessFor("T4")
	// Free [1000, 300]: both shapes fit; the 300m GPU is a fragment to
	// both: 0.5·300 + 0.5·300.
	if got := m.frag(a, 64000, 0, []int64{1000, 300}); got != 300 {
		t.Errorf("frag = %v, want 300", got)
	}
	// CPU short for both shapes: all 1300m idle is fragment.
	if got := m.frag(a, 500, 0, []int64{1000, 300}); got != 1300 {
		t.Errorf("frag without CPU = %v, want 1300", got)
	}
	// A model the shapes exclude: all idle is fragment.
	x := newFragModel([]WeightedShape{{Shape: Shape{NumGPU: 1, GPUMilli: 500, Spec: "A10"}, Weight: 1}}, false)
	if got := x.frag(x.accessFor("T4"), 64000, 0, []int64{1000}); got != 1000 {
		t.Errorf("frag of excluded model = %v, want 1000", got)
	}
}

func TestFGDChoosesGPUAndScores(t *testing.T) {
	// A 200m share on free [1000, 300]: on GPU 1 frag goes 300 → 100
	// (Δ = −200, score int(100·sigmoid(0.2)) = 54); on GPU 0 it goes
	// 300 → 700 (the whole-GPU shape no longer fits; Δ = +400, score 40).
	n := policytest.Node(t, 64000, 0, "T4", 1000, 300)
	var e fgdEntry
	fragScores(newFragModel(twoShapes, false), n, Shape{CPUMilli: 1000, NumGPU: 1, GPUMilli: 200}, scoring{node: fgdQuantised, gpu: fgdQuantised}, &e)
	if e.gpu[0] != 40 || e.gpu[1] != 54 || e.node != 54 {
		t.Errorf("scores gpu0 %v gpu1 %v node %v, want 40, 54, 54", e.gpu[0], e.gpu[1], e.node)
	}
}

func TestFragMulti(t *testing.T) {
	m := newFragModel(twoShapes, false)
	m.multi = 1
	a := m.accessFor("T4")
	// Free [1000, 300]: two 500m copies fit (in the idle GPU), leaving
	// 300; one whole GPU fits, leaving 300: 0.5·300 + 0.5·300.
	if got := m.frag(a, 64000, 0, []int64{1000, 300}); got != 300 {
		t.Errorf("fragMulti = %v, want 300", got)
	}
	// 700m free: FGD sees one 500m share fit and no fragment for it;
	// fragMulti sees 200m left over.
	if got := m.fragMulti(a, 64000, 0, []int64{700}); got != 0.5*200+0.5*700 {
		t.Errorf("fragMulti(700) = %v, want %v", got, 0.5*200+0.5*700)
	}
	// CPU for one copy only: one 500m share, 800m left for that shape.
	if got := m.fragMulti(a, 1500, 0, []int64{1000, 300}); got != 0.5*800+0.5*300 {
		t.Errorf("fragMulti with CPU for one copy = %v, want %v", got, 0.5*800+0.5*300)
	}
}

func TestPopularShapes(t *testing.T) {
	a := Shape{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500, MemMiB: 100}
	b := Shape{CPUMilli: 2000, NumGPU: 1, GPUMilli: 1000}
	c := Shape{CPUMilli: 500}
	tasks := []Shape{a, a, a, a, a, a, b, b, b, c}
	a.MemMiB = 300 // memory is averaged, not part of the key
	tasks = append(tasks, a, a)
	got := PopularShapes(tasks, 0.7)
	if len(got) != 2 {
		t.Fatalf("got %d shapes, want 2 (8+3 of 12 tasks reach 70%%): %+v", len(got), got)
	}
	if got[0].GPUMilli != 500 || math.Abs(got[0].Weight-8.0/11) > 1e-9 || got[0].MemMiB != 150 {
		t.Errorf("first shape %+v, want the 500m share with weight 8/11 and mean memory 150", got[0])
	}
	if got[1].CPUMilli != 2000 || math.Abs(got[1].Weight-3.0/11) > 1e-9 {
		t.Errorf("second shape %+v, want the whole GPU with weight 3/11", got[1])
	}
}

// A workload of ever-new shapes (all-different CPU requests) gives a
// target of at most maxTargetShapes shapes, the most frequent, weights
// summing to 1.
func TestPopularShapesBounded(t *testing.T) {
	var tasks []Shape
	for i := range 1000 {
		tasks = append(tasks, Shape{CPUMilli: int64(1000 + i), NumGPU: 1, GPUMilli: 300})
	}
	common := Shape{CPUMilli: 4000, NumGPU: 1, GPUMilli: 500}
	for range 50 {
		tasks = append(tasks, common)
	}
	got := PopularShapes(tasks, 1)
	if len(got) != maxTargetShapes {
		t.Fatalf("%d shapes, want %d", len(got), maxTargetShapes)
	}
	if got[0].Shape != common {
		t.Errorf("first shape %+v, want the most frequent %+v", got[0].Shape, common)
	}
	var sum float64
	for _, w := range got {
		sum += w.Weight
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("weights sum to %v, want 1", sum)
	}
}

// Every listed policy is made by name and calls itself by it; the
// scheduler's and the core's are all listed; an unknown name is refused
// with the list.
func TestAllPolicies(t *testing.T) {
	c := placement.NewCluster()
	seen := map[string]bool{}
	for _, name := range Names() {
		if seen[name] {
			t.Errorf("policy %s listed twice", name)
		}
		seen[name] = true
		p, err := New(name, c, 1)
		if err != nil {
			t.Fatal(err)
		}
		if p.Name() != name {
			t.Errorf("policy %s calls itself %s", name, p.Name())
		}
	}
	for _, name := range []string{string(api.NodeBinpack), string(api.NodeSpread), NameFGD, NameTessera} {
		if !seen[name] {
			t.Errorf("policy %s is not in All", name)
		}
	}
	if _, err := New("fdg", c, 1); err == nil || !strings.Contains(err.Error(), `"fdg"`) || !strings.Contains(err.Error(), "tessera") {
		t.Errorf("unknown policy: error %v, want it to name the policy and list the known ones", err)
	}
}

func TestWeighByScarcity(t *testing.T) {
	// 2 T4 GPUs and 6 A10 GPUs: a T4-only shape may use 2 of 8 GPUs, so
	// its weight is multiplied by 8/2 = 4 before renormalising.
	c := placement.NewCluster()
	for i, m := range []string{"T4", "A10", "A10", "A10"} {
		n := policytest.Node(t, 64000, 0, m, 1000, 1000)
		n.Name = fmt.Sprintf("n%d", i)
		c.UpsertNode(n)
	}
	target := []WeightedShape{
		{Shape: Shape{NumGPU: 1, GPUMilli: 500, Spec: "T4"}, Weight: 0.5},
		{Shape: Shape{NumGPU: 1, GPUMilli: 500}, Weight: 0.5},
	}
	weighByScarcity(target, c, 1)
	if math.Abs(target[0].Weight-0.8) > 1e-9 || math.Abs(target[1].Weight-0.2) > 1e-9 {
		t.Errorf("weights %v and %v, want 0.8 and 0.2", target[0].Weight, target[1].Weight)
	}
}

// The per-node cache keeps values by the node's index in its cluster, so
// a value must not pass to another node that takes the index (RemoveNode
// moves the last node into the removed one's place; UpsertNode replaces a
// node in place), even at the same node version.
func TestNodeTableFollowsTheNode(t *testing.T) {
	c := placement.NewCluster()
	var nodes []*placement.Node
	for i := range 70 { // past the table's first size
		n := policytest.Node(t, 64000, 0, "T4", 1000)
		n.Name = fmt.Sprintf("n%d", i)
		c.UpsertNode(n)
		nodes = append(nodes, n)
	}
	var nt NodeTable[string]
	computed := 0
	get := func(n *placement.Node) string {
		return *nt.Get(n, 1, func(v *string) { computed++; *v = n.Name })
	}
	for _, n := range nodes {
		if got := get(n); got != n.Name {
			t.Fatalf("value of %s is %q", n.Name, got)
		}
	}
	before := computed
	for _, n := range nodes {
		get(n)
	}
	if computed != before {
		t.Errorf("%d values recomputed for unchanged nodes, want 0", computed-before)
	}
	c.RemoveNode("n0") // n69 (version 0, like n0) moves to index 0
	if got := get(c.Node("n69")); got != "n69" {
		t.Errorf("after RemoveNode: n69's value is %q (the removed node's)", got)
	}
	repl := policytest.Node(t, 64000, 0, "T4", 1000, 1000)
	repl.Name = "n5"
	c.UpsertNode(repl)
	k := computed
	if got := get(repl); got != "n5" || computed != k+1 {
		t.Errorf("after UpsertNode: value %q, computed %d times, want %q computed once", got, computed-k, "n5")
	}
}
