package policies

import (
	"math"
	"slices"
	"testing"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies/policytest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// traceShares is the default openb trace's GPU shares by size (percent of
// a GPU) and count.
var traceShares = map[int]float64{81: 1078, 65: 260, 59: 76, 55: 73, 48: 19, 47: 764, 46: 132,
	37: 47, 32: 337, 23: 143, 22: 62, 16: 76, 11: 24, 5: 7}

func tracePricing(t *testing.T) *pricing {
	t.Helper()
	var target []WeightedShape
	for s, n := range traceShares {
		target = append(target, WeightedShape{Shape: Shape{NumGPU: 1, GPUMilli: int64(10 * s)}, Weight: n / 3078})
	}
	target = append(target, WeightedShape{Shape: Shape{NumGPU: 1, GPUMilli: 1000}, Weight: 0.5})
	p := newPricing(target)
	if p == nil {
		t.Fatal("no pricing")
	}
	return p
}

// The prices reproduce the best packing's pairings: a 320m share beside a
// 650m one and a 470m share beside another lose nothing, a 160m share in
// the 190m beside an 810m one neither; a 230m share beside a 650m one, a
// 470m share beside a 320m one and a 650m share beside a 230m one leave
// room the workload cannot fill as well, so they lose. No loss is
// negative and a fresh GPU loses nothing to a share the workload has.
func TestPricingFollowsTheBestPacking(t *testing.T) {
	p := tracePricing(t)
	zero := []struct{ free, share int }{{35, 32}, {53, 47}, {19, 16}, {100, 81}, {100, 65}, {100, 47}}
	for _, c := range zero {
		if l := p.loss(c.free, c.share); l > 1e-9 {
			t.Errorf("%d%% share on a GPU with %d%% free loses %v, want 0", c.share, c.free, l)
		}
	}
	positive := []struct{ free, share int }{{35, 23}, {68, 47}, {77, 65}}
	for _, c := range positive {
		if l := p.loss(c.free, c.share); l < 0.01 {
			t.Errorf("%d%% share on a GPU with %d%% free loses %v, want a clear loss", c.share, c.free, l)
		}
	}
	for g := 0; g <= 100; g++ {
		for s := 1; s <= g; s++ {
			if l := p.loss(g, s); l < 0 || math.IsNaN(l) {
				t.Fatalf("loss(%d, %d) = %v", g, s, l)
			}
		}
	}
	// A size the workload never showed is worth what its room would
	// earn (a 23% share's 1/4): on a GPU with 60% free, where a 59% share
	// would earn 2/3, a 30% one leaves 30% that earns another 1/4 only.
	if l := p.loss(60, 30); math.Abs(l-(2.0/3-0.25-0.25)) > 1e-6 {
		t.Errorf("unseen 30%% share on 60%% free loses %v, want 1/6", l)
	}
}

// Without shares there is nothing to price.
func TestPricingWithoutShares(t *testing.T) {
	if p := newPricing([]WeightedShape{{Shape: Shape{NumGPU: 2, GPUMilli: 1000}, Weight: 1}}); p != nil {
		t.Errorf("pricing %+v for a workload of whole GPUs, want none", p)
	}
}

// Priced, tessera pairs shares as the best packing of the workload does
// where its fragmentation measure alone does not.
func TestTesseraPricesPlacement(t *testing.T) {
	var shapes []Shape
	for s, n := range traceShares {
		for k := 0; k < int(n); k++ {
			shapes = append(shapes, Shape{CPUMilli: 4000, NumGPU: 1, GPUMilli: int64(10 * s)})
		}
	}
	for k := 0; k < 3000; k++ {
		shapes = append(shapes, Shape{CPUMilli: 8000, NumGPU: 1, GPUMilli: 1000})
	}
	choose := func(lossWeight float64, pct, usedA, usedB int) string {
		c := placement.NewCluster()
		for _, x := range []struct {
			name string
			used int
		}{{"A", usedA}, {"B", usedB}} {
			n := policytest.Node(t, 64000, 0, "T4", 1000, 1000)
			n.Name = x.name
			c.UpsertNode(n)
			rec := &api.PodAllocation{Node: x.name, Containers: []api.ContainerAllocation{{Name: "main",
				Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: int64(x.used) * 100, Cores: x.used}}}}}
			if err := c.AssignRecord("old-"+x.name, 4000, 0, rec); err != nil {
				t.Fatal(err)
			}
		}
		p := DefaultTesseraParams()
		p.UseTarget, p.LossWeight = true, lossWeight
		pol := NewTessera(c, p)
		pol.SetTarget(shapes)
		cr, err := c.Compile(&placement.Request{Pod: "p", CPUMilli: 4000, Containers: []placement.Container{{Name: "main", GPUs: 1, MemoryPercent: pct, Cores: pct}}})
		if err != nil {
			t.Fatal(err)
		}
		pol.Observe(cr)
		best := placement.NewSearch(c).Best(cr, pol)
		if best == nil {
			t.Fatal("no placement")
		}
		return best.Node.Name
	}
	cases := []struct {
		share, usedA, usedB int
		priced, unpriced    string
	}{
		// A 230m share beside a 550m one (room left for a 220m share),
		// not beside a 650m one (whose 350m room is a 320m share's).
		{23, 65, 55, "B", "A"},
		// A 650m share on a fresh GPU (room left for a 320m share), not
		// beside a 230m one (120m left that nothing fills).
		{65, 23, 0, "B", "A"},
		// A 320m share beside the 650m one either way.
		{32, 65, 55, "A", "A"},
	}
	for _, c := range cases {
		if got := choose(1000, c.share, c.usedA, c.usedB); got != c.priced {
			t.Errorf("%d%% share, GPUs %d%% (A) and %d%% (B) used: priced, it went to %s, want %s", c.share, c.usedA, c.usedB, got, c.priced)
		}
		if got := choose(0, c.share, c.usedA, c.usedB); got != c.unpriced {
			t.Errorf("%d%% share, GPUs %d%% (A) and %d%% (B) used: unpriced, it went to %s; the test expects %s", c.share, c.usedA, c.usedB, got, c.unpriced)
		}
	}
}

// Among nodes that score alike, a multi-GPU task goes where it leaves the
// least CPU (MultiCPUFit), keeping the node with the most CPU for a task
// that needs it; without, it goes to the first node.
func TestTesseraMultiGPUFitsCPU(t *testing.T) {
	choose := func(fit bool) string {
		c := placement.NewCluster()
		for _, x := range []struct {
			name string
			cpu  int64
		}{{"big", 128000}, {"small", 96000}} {
			n := policytest.Node(t, x.cpu, 0, "G2", 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
			n.Name = x.name
			c.UpsertNode(n)
		}
		p := DefaultTesseraParams()
		p.MultiCPUFit = fit
		pol := NewTessera(c, p)
		cr, err := c.Compile(&placement.Request{Pod: "p", CPUMilli: 88000, Containers: []placement.Container{{Name: "main", GPUs: 8, MemoryPercent: 100, Cores: 100}}})
		if err != nil {
			t.Fatal(err)
		}
		pol.Observe(cr)
		return placement.NewSearch(c).Best(cr, pol).Node.Name
	}
	if got := choose(true); got != "small" {
		t.Errorf("8-GPU 88-core task went to %s, want small (8 cores left, not 40)", got)
	}
	if got := choose(false); got != "big" {
		t.Errorf("without MultiCPUFit the task went to %s; the test expects the first node", got)
	}
}

// By default tessera learns online: the simulator's target is ignored.
func TestTesseraLearnsOnline(t *testing.T) {
	pol := NewTessera(nil, DefaultTesseraParams())
	pol.SetTarget([]Shape{{NumGPU: 1, GPUMilli: 500}})
	if m := pol.snap.Load().model; m != nil {
		t.Fatalf("model %+v after SetTarget, want none until pods are observed", m)
	}
	c := placement.NewCluster()
	cr, err := c.Compile(&placement.Request{Pod: "p", Containers: []placement.Container{{Name: "main", GPUs: 1, MemoryPercent: 30, Cores: 30}}})
	if err != nil {
		t.Fatal(err)
	}
	pol.Observe(cr)
	m := pol.snap.Load().model
	if m == nil || len(m.gpu) != 1 || m.gpu[0].GPUMilli != 300 || m.prices == nil {
		t.Fatalf("model after one 300m pod: %+v, want that shape, priced", m)
	}
}

// While it warms up, tessera's learned model adds WarmUpPrior to every
// seen shape's count, so one 8-GPU pod among seven shares is not weighed
// as a mere 1/8; from the first model after WarmUpTasks pods the counts
// stand alone; a target given by SetTarget is never smoothed.
func TestTesseraWarmUpPrior(t *testing.T) {
	c := placement.NewCluster()
	compile := func(gpus, pct int) *placement.Compiled {
		cr, err := c.Compile(&placement.Request{Pod: "p", CPUMilli: 1000, Containers: []placement.Container{{Name: "main", GPUs: gpus, MemoryPercent: pct, Cores: pct}}})
		if err != nil {
			t.Fatal(err)
		}
		return cr
	}
	large, share := compile(8, 100), compile(1, 30)
	largeWeight := func(pol *Tessera) float64 {
		t.Helper()
		m := pol.snap.Load().model
		if m == nil {
			t.Fatal("no model")
		}
		for _, w := range m.gpu {
			if w.NumGPU == 8 {
				return w.Weight
			}
		}
		t.Fatalf("no 8-GPU shape in %+v", m.gpu)
		return 0
	}
	p := DefaultTesseraParams()
	if p.WarmUpPrior != 20 {
		t.Fatalf("default WarmUpPrior %v, want 20 (docs/simulation.md)", p.WarmUpPrior)
	}
	pol := NewTessera(c, p)
	pol.Observe(large)
	for range 7 {
		pol.Observe(share)
	}
	// Rebuilt at 8 pods: (1 + 20) / (8 + 2·20).
	if got, want := largeWeight(pol), 21.0/48; math.Abs(got-want) > 1e-12 {
		t.Errorf("after 8 pods the 8-GPU shape weighs %v, want %v (smoothed)", got, want)
	}
	for range 1024 - 8 {
		pol.Observe(share)
	}
	if got, want := largeWeight(pol), 21.0/1064; math.Abs(got-want) > 1e-12 {
		t.Errorf("after 1024 pods the 8-GPU shape weighs %v, want %v (still warming up)", got, want)
	}
	for range 1024 {
		pol.Observe(share)
	}
	if got, want := largeWeight(pol), 1.0/2048; math.Abs(got-want) > 1e-12 {
		t.Errorf("after 2048 pods the 8-GPU shape weighs %v, want %v (counts alone)", got, want)
	}

	// The prior is added to counts out of the tasks the target covers:
	// with cover 0.8, of 6 shares, 1 8-GPU task and 1 200m share, the
	// 200m share (a tie, the smaller shape) is left out, so
	// (1 + 20) / (7 + 2·20).
	pc := p
	pc.Cover = 0.8
	covered := NewTessera(c, pc)
	covered.Observe(large)
	covered.Observe(compile(1, 20))
	for range 6 {
		covered.Observe(share)
	}
	if got, want := largeWeight(covered), 21.0/47; math.Abs(got-want) > 1e-12 {
		t.Errorf("cover 0.8: the 8-GPU shape weighs %v, want %v (counts of the 7 covered tasks)", got, want)
	}

	p.UseTarget = true
	given := NewTessera(c, p)
	given.SetTarget(append([]Shape{ShapeOf(large)}, slices.Repeat([]Shape{ShapeOf(share)}, 7)...))
	if got, want := largeWeight(given), 1.0/8; math.Abs(got-want) > 1e-12 {
		t.Errorf("given target: the 8-GPU shape weighs %v, want %v (not smoothed)", got, want)
	}
}

// smooth adds the prior to counts out of the tasks the shapes cover, not
// out of all tasks.
func TestSmoothCountsCoveredTasks(t *testing.T) {
	a := Shape{NumGPU: 1, GPUMilli: 500}
	b := Shape{NumGPU: 1, GPUMilli: 1000}
	tasks := append(append(slices.Repeat([]Shape{a}, 8), slices.Repeat([]Shape{b}, 3)...), Shape{CPUMilli: 500})
	target, covered := popularShapes(tasks, 0.7)
	if covered != 11 || len(target) != 2 {
		t.Fatalf("covered %v with %d shapes, want 11 with 2", covered, len(target))
	}
	smooth(target, covered, 1)
	if math.Abs(target[0].Weight-9.0/13) > 1e-12 || math.Abs(target[1].Weight-4.0/13) > 1e-12 {
		t.Errorf("smoothed weights %v, %v, want 9/13 and 4/13", target[0].Weight, target[1].Weight)
	}
}

// A workload of every size from 1% to 99%: the LP prices the 24 most
// frequent sizes of at least 5% and the others are worth what their room
// earns, so the LP stays small whatever the workload.
func TestPricingManySizes(t *testing.T) {
	var target []WeightedShape
	for s := 1; s <= 99; s++ {
		// 30%..53% are the most frequent.
		w := 1.0
		if s >= 30 && s < 54 {
			w = 5
		}
		target = append(target, WeightedShape{Shape: Shape{NumGPU: 1, GPUMilli: int64(10 * s)}, Weight: w})
	}
	p := newPricing(target)
	if p == nil {
		t.Fatal("no pricing")
	}
	for _, s := range []int{1, 4, 20, 60, 99} {
		if p.price[s] != p.fill[s] {
			t.Errorf("size %d%% outside the priced ones: price %v, want its room's worth %v", s, p.price[s], p.fill[s])
		}
	}
	for g := 0; g <= 100; g++ {
		for s := 1; s <= g; s++ {
			if l := p.loss(g, s); l < 0 || math.IsNaN(l) {
				t.Fatalf("loss(%d, %d) = %v", g, s, l)
			}
		}
	}
}

// BenchmarkPricing prices the trace's shares and a workload of every size.
//
//	go test -run '^$' -bench Pricing ./internal/policies/
func BenchmarkPricing(b *testing.B) {
	var trace, all []WeightedShape
	for s, n := range traceShares {
		trace = append(trace, WeightedShape{Shape: Shape{NumGPU: 1, GPUMilli: int64(10 * s)}, Weight: n})
	}
	for s := 1; s <= 99; s++ {
		all = append(all, WeightedShape{Shape: Shape{NumGPU: 1, GPUMilli: int64(10 * s)}, Weight: 1})
	}
	for name, target := range map[string][]WeightedShape{"trace": trace, "every-size": all} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				newPricing(target)
			}
		})
	}
}
