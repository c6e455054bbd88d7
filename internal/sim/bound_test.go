package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

func counts(sizes ...int) *shareCounts {
	var c shareCounts
	for _, s := range sizes {
		c[s]++
	}
	return &c
}

func TestMinGPUsHandCases(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		want  int64
	}{
		{nil, 0},
		{[]int{60, 60, 60}, 3}, // no two fit together; volume alone says 2
		{[]int{50, 50, 50, 50}, 2},
		{[]int{81, 19}, 1},
		{[]int{34, 33, 33, 34}, 2},
		{[]int{81, 81, 47, 47, 47}, 4}, // 81s alone; 47s pair once
		{[]int{100, 1}, 2},
	} {
		got, err := counts(tc.sizes...).minGPUs()
		if err != nil || got != tc.want {
			t.Errorf("%v: minGPUs = %d, %v; want %d", tc.sizes, got, err, tc.want)
		}
	}
}

// optimalGPUs packs sizes into as few GPUs as possible by trying every
// assignment (small inputs only).
func optimalGPUs(sizes []int) int {
	slices.Sort(sizes)
	slices.Reverse(sizes)
	best := len(sizes)
	var free []int
	var place func(i int)
	place = func(i int) {
		if len(free) >= best {
			return
		}
		if i == len(sizes) {
			best = len(free)
			return
		}
		for g := range free {
			if free[g] >= sizes[i] {
				free[g] -= sizes[i]
				place(i + 1)
				free[g] += sizes[i]
			}
		}
		free = append(free, 100-sizes[i])
		place(i + 1)
		free = free[:len(free)-1]
	}
	place(0)
	return best
}

// The LP bound never exceeds the true optimum and never falls below the
// volume bound; on most inputs it is the optimum.
func TestMinGPUsAgainstExhaustiveSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	exact := 0
	const cases = 300
	for k := 0; k < cases; k++ {
		n := 1 + rng.IntN(9)
		sizes := make([]int, n)
		var vol int
		for i := range sizes {
			sizes[i] = 1 + rng.IntN(99)
			vol += sizes[i]
		}
		got, err := counts(sizes...).minGPUs()
		if err != nil {
			t.Fatalf("%v: %v", sizes, err)
		}
		opt := optimalGPUs(slices.Clone(sizes))
		if got > int64(opt) || got < int64((vol+99)/100) {
			t.Fatalf("%v: bound %d, optimum %d, volume bound %d", sizes, got, opt, (vol+99)/100)
		}
		if got == int64(opt) {
			exact++
		}
	}
	t.Logf("bound = optimum on %d of %d random inputs", exact, cases)
}

func TestMinUnallocatedHandCase(t *testing.T) {
	// Two 81% shares: placing both idles 2 × 19; dropping y of them
	// costs 81·y and idles 19·(2 − y); the LP balances at y = 0.38.
	got, err := counts(81, 81).minUnallocated(0)
	if err != nil || math.Abs(got-30.78) > 1e-6 {
		t.Fatalf("minUnallocated = %v, %v; want 30.78", got, err)
	}
	// Shares that tile exactly leave nothing, except arrivals short of 100%.
	got, err = counts(50, 50, 30, 70).minUnallocated(12)
	if err != nil || math.Abs(got-12) > 1e-6 {
		t.Fatalf("minUnallocated(short 12) = %v, %v; want 12", got, err)
	}
}

// The bundled trace's own 3,078 shares, before inflation, against GLPK 5.0
// solving the same arc-flow model (as an integer program too: 1,965 GPUs,
// and 188.64 GPUs unallocated with drops).
func TestPackingMatchesGLPK(t *testing.T) {
	tr := bundledTrace(t)
	var c shareCounts
	for _, p := range tr.Pods {
		if p.NumGPU == 1 && p.GPUMilli < 1000 {
			c[SharePercent(p.GPUMilli)]++
		}
	}
	if c.total() != 3078 {
		t.Fatalf("%d shares in the bundled trace, want 3078", c.total())
	}
	v, err := c.packingLP()
	if err != nil || math.Abs(v-1964.583333) > 1e-5 {
		t.Errorf("packing LP = %v, %v; GLPK says 1964.583333", v, err)
	}
	u, err := c.minUnallocated(0)
	if err != nil || math.Abs(u-18855.45) > 0.01 {
		t.Errorf("unallocated LP = %v, %v; GLPK says 18855.45", u, err)
	}
}

// randomShareTrace is a sliver-prone cluster: 30 8-GPU nodes and pods
// drawn from the trace's awkward share sizes and whole GPUs.
func randomShareTrace(t *testing.T, seed uint64) *Trace {
	t.Helper()
	var nb strings.Builder
	nb.WriteString(nodeHeader)
	for i := 0; i < 30; i++ {
		fmt.Fprintf(&nb, "n%02d,%d,262144,8,V100M16\n", i, 48000+16000*(i%3))
	}
	nodes, err := ParseNodes(strings.NewReader(nb.String()), "nodes.csv")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	kinds := []string{"1,810", "1,470", "1,650", "1,320", "1,160", "1,230", "1,1000", "2,1000", "4,1000", "8,1000", "0,0"}
	var pb strings.Builder
	pb.WriteString(podHeader)
	for i := 0; i < 260; i++ {
		fmt.Fprintf(&pb, "p%03d,%d,8192,%s,,LS,Running,0,0,0\n", i, 1000*(1+rng.IntN(12)), kinds[rng.IntN(len(kinds))])
	}
	pods, err := ParsePods(strings.NewReader(pb.String()), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	return &Trace{Nodes: nodes, Pods: pods}
}

// No policy beats either floor in a real run: the floor for any policy
// always holds, and the all-shares floor whenever no share was dropped by
// arrived = 100%.
func TestFloorsHoldForEveryPolicy(t *testing.T) {
	placedAll := 0
	for seed := uint64(1); seed <= 3; seed++ {
		tr := randomShareTrace(t, seed)
		fl, err := tr.Floor(1)
		if err != nil {
			t.Fatal(err)
		}
		if fl.AnyPolicy > fl.AllShares+1e-9 || fl.AnyPolicy > fl.NeverRefuse+1e-9 {
			t.Fatalf("trace %d: floor for any policy %.3f above the all-shares floor %.3f or the never-refuse one %.3f", seed, fl.AnyPolicy, fl.AllShares, fl.NeverRefuse)
		}
		withAll := 0
		for _, pol := range []string{"random", "dotproduct", "gpuclustering", "gpupacking", "bestfit", "fgd", "tessera"} {
			cv, err := Run(tr, pol, 1)
			if err != nil {
				t.Fatal(err)
			}
			got := cv.Unallocated(100)
			if got < fl.AnyPolicy-1e-9 {
				t.Errorf("trace %d, %s: %.3f%% unallocated, below the floor %.3f%%", seed, pol, got, fl.AnyPolicy)
			}
			// Every policy here drops a task only when it fits nowhere.
			if got < fl.NeverRefuse-1e-9 {
				t.Errorf("trace %d, %s: %.3f%% unallocated, below the never-refuse floor %.3f%%", seed, pol, got, fl.NeverRefuse)
			}
			if sharesDroppedBy100(tr, cv) == 0 {
				withAll++
				if got < fl.AllShares-1e-9 {
					t.Errorf("trace %d, %s placed every share yet left %.3f%%, below %.3f%%", seed, pol, got, fl.AllShares)
				}
			}
		}
		t.Logf("trace %d: floors %.2f%% / %.2f%% / %.2f%%; %d policies placed every share", seed, fl.AnyPolicy, fl.NeverRefuse, fl.AllShares, withAll)
		placedAll += withAll
	}
	if placedAll == 0 {
		t.Fatal("no run placed every share, so the all-shares floor was never checked")
	}
}

func sharesDroppedBy100(tr *Trace, cv *Curve) int {
	order := tr.Arrivals(cv.Seed, Inflation)
	dropped := 0
	var prev int64
	for k, i := range order {
		if cv.Arrived[k] > cv.Capacity {
			break
		}
		p := tr.Pods[i]
		if p.NumGPU == 1 && p.GPUMilli < 1000 && cv.Allocated[k] == prev {
			dropped++
		}
		prev = cv.Allocated[k]
	}
	return dropped
}

func bundledTrace(tb testing.TB) *Trace {
	tb.Helper()
	tr, err := LoadTrace("", "")
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

// The never-refuse floor against the exact optimum of its model, found by
// trying every set of dropped tasks on small random instances: never
// above it, never below the floor for any policy; and on an instance
// where only the order of arrivals forbids the cheap drop, strictly above
// the floor for any policy.
func TestNeverRefuseFloor(t *testing.T) {
	// Three GPUs: a 38% share first, two 81% shares and a whole GPU,
	// each needing more CPU than the one before. No two shares share a
	// GPU, so one GPU's worth must go. Any policy drops the 38% share
	// (38% of a GPU unallocated), but a policy that never refuses would
	// then have to drop everything after it; its best is to drop the
	// whole GPU at the end (100%). The LP relaxation of the model drops a
	// quarter of every task (each covers a GPU; 300% of volume, 4 GPUs
	// of cover): 75%.
	tasks := []nrTask{
		{share: true, need: 38, cpu: 1},
		{share: true, need: 81, cpu: 2},
		{share: true, need: 81, cpu: 2},
		{need: 1, cpu: 3},
	}
	got, err := neverRefuse(tasks, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(got-75) > 1e-4 {
		t.Errorf("never-refuse floor %v%% of a GPU, want the LP relaxation's 75", got)
	}
	if exact := exactNeverRefuse(t, tasks, 3, 0); exact != 100 {
		t.Errorf("exact optimum %v, want 100", exact)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	sizes := []int{81, 65, 47, 32, 23, 16}
	for trial := 0; trial < 60; trial++ {
		var tasks []nrTask
		var counts shareCounts
		gpus := 2 + rng.IntN(3)
		vol := 0.0
		for len(tasks) < 11 {
			task := nrTask{cpu: int64(rng.IntN(4)), mem: int64(rng.IntN(3))}
			if rng.IntN(3) == 0 {
				task.need = 1 + rng.IntN(2)
			} else {
				task.share, task.need = true, sizes[rng.IntN(len(sizes))]
			}
			if rng.IntN(6) == 0 {
				task.spec = []string{"A10"}
			}
			if vol+task.volume() > float64(100*gpus) {
				break
			}
			vol += task.volume()
			if task.share {
				counts[task.need]++
			}
			tasks = append(tasks, task)
		}
		short := float64(100*gpus) - vol
		got, err := neverRefuse(tasks, gpus, short)
		if err != nil {
			t.Fatal(err)
		}
		exact := exactNeverRefuse(t, tasks, gpus, short)
		anyPolicy, err := counts.minUnallocated(short)
		if err != nil {
			t.Fatal(err)
		}
		if got > exact+1e-6 || got < anyPolicy-1e-6 && got < short-1e-6 {
			t.Fatalf("trial %d: never-refuse floor %v, exact %v, any policy %v (tasks %+v, %d GPUs)", trial, got, exact, anyPolicy, tasks, gpus)
		}
	}
}

// exactNeverRefuse tries every set of dropped tasks that is closed under
// nrTask.blocks and leaves a packable rest (shares by the arc-flow LP, plus
// whole GPUs, within gpus), and returns the least GPU dropped plus short.
func exactNeverRefuse(t *testing.T, tasks []nrTask, gpus int, short float64) float64 {
	t.Helper()
	best := math.Inf(1)
	lps := map[shareCounts]float64{} // many sets leave the same shares
	for mask := 0; mask < 1<<len(tasks); mask++ {
		closed := true
		for i := range tasks {
			for j := i + 1; j < len(tasks) && closed; j++ {
				if mask&(1<<i) != 0 && mask&(1<<j) == 0 && tasks[i].blocks(&tasks[j]) {
					closed = false
				}
			}
		}
		if !closed {
			continue
		}
		var counts shareCounts
		whole, dropped := 0, 0.0
		for i, task := range tasks {
			switch {
			case mask&(1<<i) != 0:
				dropped += task.volume()
			case task.share:
				counts[task.need]++
			default:
				whole += task.need
			}
		}
		bins, ok := lps[counts]
		if !ok {
			var err error
			if bins, err = counts.packingLP(); err != nil {
				t.Fatal(err)
			}
			lps[counts] = bins
		}
		if bins+float64(whole) <= float64(gpus)+1e-9 {
			best = math.Min(best, dropped+short)
		}
	}
	return best
}

// largeDropped by hand: one 128-core and two 96-core 8-GPU nodes and a
// 2-GPU node. Three 8-GPU tasks of 120 cores fit only the 128-core node;
// an 8-GPU 64-core task and two 5-GPU tasks compete for the 96-core nodes
// (and the 128-core one). The most GPU placed, one large task per node:
// 120-core task on the 128-core node, the 8-GPU and one 5-GPU task on the
// 96-core nodes: 21 of 42 GPUs, so 21 are dropped. A 4-GPU task (half a
// node, two fit) and a 1-GPU task are not large; a task asking for a model
// no node has fits nowhere and counts whole.
func TestLargeDroppedHandCase(t *testing.T) {
	nodes := []NodeRow{
		{Name: "g3", CPUMilli: 128000, MemMiB: 1 << 20, GPUs: 8, Model: "G3"},
		{Name: "g2a", CPUMilli: 96000, MemMiB: 1 << 20, GPUs: 8, Model: "G2"},
		{Name: "g2b", CPUMilli: 96000, MemMiB: 1 << 20, GPUs: 8, Model: "G2"},
		{Name: "t4", CPUMilli: 104000, MemMiB: 1 << 20, GPUs: 2, Model: "T4"},
		{Name: "cpu", CPUMilli: 256000, MemMiB: 1 << 20},
	}
	task := func(gpus int, cpu int64, spec string) PodRow {
		return PodRow{CPUMilli: cpu, MemMiB: 1024, NumGPU: gpus, GPUMilli: 1000, Spec: spec}
	}
	cases := []struct {
		name  string
		tasks []PodRow
		want  int64
	}{
		{"none", nil, 0},
		{"not large", []PodRow{task(4, 32000, ""), task(4, 32000, ""), task(4, 32000, ""), task(1, 8000, "")}, 0},
		{"one per node", []PodRow{task(8, 120000, ""), task(8, 120000, ""), task(8, 120000, ""), task(8, 64000, ""), task(5, 8000, ""), task(5, 8000, "")}, 21},
		{"fits the 2-GPU node too", []PodRow{task(2, 8000, ""), task(2, 8000, ""), task(2, 8000, ""), task(2, 8000, "")}, 0},
		{"no such model", []PodRow{task(8, 8000, "A100")}, 8},
		{"model", []PodRow{task(8, 8000, "G3"), task(8, 8000, "G3|A100")}, 8},
		{"memory", []PodRow{{CPUMilli: 1000, MemMiB: 2 << 20, NumGPU: 8, GPUMilli: 1000}}, 8},
		{"more GPUs than any node", []PodRow{task(16, 8000, "")}, 16},
		// Models match as the placement core matches them: any case, or a
		// whole word of the node's model.
		{"model case", []PodRow{task(8, 8000, "g3"), task(8, 8000, "t4|G2"), task(8, 8000, "g2")}, 0},
		{"model word", []PodRow{task(8, 8000, "A100|G3")}, 0},
	}
	a100 := []NodeRow{{Name: "a", CPUMilli: 128000, MemMiB: 1 << 20, GPUs: 8, Model: "NVIDIA-A100-SXM4-80GB"}}
	for _, c := range []struct {
		spec string
		want int64
	}{{"a100", 0}, {"A100|T4", 0}, {"A10", 8}, {"SXM", 8}} {
		got, err := largeDropped(a100, []PodRow{task(8, 8000, c.spec)})
		if err != nil || got != c.want {
			t.Errorf("spec %q on an NVIDIA-A100-SXM4-80GB node: %d GPUs dropped (%v), want %d", c.spec, got, err, c.want)
		}
	}
	for _, c := range cases {
		got, err := largeDropped(nodes, c.tasks)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: %d GPUs dropped, want %d", c.name, got, c.want)
		}
	}
}

// On the multi-GPU mixes large 8-GPU tasks outnumber the nodes that can
// take them (the 120-core tasks and the 39 G3 nodes), so the floors must
// count them; and no policy may ever leave less than a floor.
func TestFloorsHoldOnMultiGPUMixes(t *testing.T) {
	base := bundledTrace(t)
	for _, g := range []int64{1, 3} {
		pods, err := Variant(base, "multigpu50", g)
		if err != nil {
			t.Fatal(err)
		}
		tr := &Trace{Nodes: base.Nodes, Pods: pods}
		fl, err := tr.Floor(1)
		if err != nil {
			t.Fatal(err)
		}
		// Counted directly: 8-GPU tasks of more than 96 cores arrived by
		// 100% fit only the 8-GPU nodes of more than 96 cores, one each.
		var big, homes, arrived int64
		for _, n := range tr.Nodes {
			if n.GPUs >= 8 && n.CPUMilli > 96000 {
				homes++
			}
		}
		for _, i := range tr.Arrivals(1, Inflation) {
			p := tr.Pods[i]
			if arrived+p.GPURequestMilli() > tr.CapacityMilli() {
				break
			}
			arrived += p.GPURequestMilli()
			if p.NumGPU == 8 && p.CPUMilli > 96000 {
				big++
			}
		}
		atLeast := float64((big-homes)*8*1000) * 100 / float64(tr.CapacityMilli())
		if big <= homes || fl.LargeTasks < atLeast-1e-9 {
			t.Fatalf("generator seed %d: %d 8-GPU tasks of more than 96 cores for %d nodes (%.2f%% of the GPU dropped), large tasks in the floor %.2f%%", g, big, homes, atLeast, fl.LargeTasks)
		}
		if fl.AnyPolicy < fl.LargeTasks || fl.AllShares < fl.LargeTasks || fl.NeverRefuse < fl.LargeTasks {
			t.Fatalf("generator seed %d: a floor below its large tasks: %+v", g, fl)
		}
		for _, pol := range []string{"bestfit", "fgd", "tessera"} {
			cv, err := Run(tr, pol, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got := cv.Unallocated(100); got < fl.NeverRefuse-1e-9 {
				t.Errorf("generator seed %d, %s: %.3f%% unallocated, below the floor %.3f%%", g, pol, got, fl.NeverRefuse)
			}
		}
		t.Logf("generator seed %d: floors %.2f / %.2f / %.2f, large tasks %.2f", g, fl.AnyPolicy, fl.NeverRefuse, fl.AllShares, fl.LargeTasks)
	}
}

// A base policy at the floor up to the float noise of a mean has no gap to
// close: the table says so instead of dividing by the noise.
func TestGapClosedAtTheFloor(t *testing.T) {
	at := func(v float64) PolicyResult {
		r := PolicyResult{Unallocated: make([]Stat, len(Checkpoints))}
		r.Unallocated[checkpointIndex(100)] = Stat{Mean: v}
		return r
	}
	fl := &FloorResult{NeverRefuse: Stat{Mean: 1.9368426701008825}}
	base, ours := at(1.9368426701008825+2e-16), at(2.1729)
	base.Policy, ours.Policy = "fgd", "tessera"
	if g := GapClosed(&base, &ours, fl); !math.IsNaN(g) {
		t.Fatalf("gap closed %v%% with fgd at the floor, want none", g)
	}
	var out strings.Builder
	if err := WriteTable(&out, []PolicyResult{base, ours}, fl, 3); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "fgd is at the never-refuse floor at arrived = 100% (no gap to close); tessera leaves +0.24 points of unallocated GPU against fgd") {
		t.Fatalf("table:\n%s", out.String())
	}
	// Below the floor is a broken floor, not "at the floor".
	below := at(1.8)
	below.Policy = "fgd"
	out.Reset()
	if err := WriteTable(&out, []PolicyResult{below, ours}, fl, 3); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "fgd leaves 0.137 points less than the never-refuse floor at arrived = 100%: the floor is wrong") {
		t.Fatalf("table:\n%s", out.String())
	}
	far := at(2.9368426701008825)
	if g := GapClosed(&far, &ours, fl); math.Abs(g-76.4) > 0.1 {
		t.Fatalf("gap closed %v%%, want 76.4%%", g)
	}
}

// largeDropped against every placement of small random instances: never
// above the least GPU any placement must drop (it is a floor), and equal
// to it when every task is large (asks for more than half of every node).
func TestLargeDroppedAgainstExhaustiveSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	models := []string{"A", "B"}
	specs := []string{"", "A", "b", "A|B", "C"}
	equal := 0
	for inst := 0; inst < 3000; inst++ {
		allLarge := inst%2 == 0
		var nodes []NodeRow
		for i := 0; i < 1+rng.IntN(3); i++ {
			gpus := []int{2, 4, 8}[rng.IntN(3)]
			if allLarge {
				gpus = 8
			}
			nodes = append(nodes, NodeRow{Name: fmt.Sprint("n", i), CPUMilli: []int64{32000, 64000, 128000}[rng.IntN(3)], MemMiB: 1 << 20, GPUs: gpus, Model: models[rng.IntN(2)]})
		}
		var tasks []PodRow
		for i := 0; i < 1+rng.IntN(5); i++ {
			gpus := 1 + rng.IntN(8)
			if allLarge {
				gpus = 5 + rng.IntN(4)
			}
			tasks = append(tasks, PodRow{CPUMilli: []int64{8000, 48000, 100000}[rng.IntN(3)], MemMiB: 1024, NumGPU: gpus, GPUMilli: 1000, Spec: specs[rng.IntN(len(specs))]})
		}
		got, err := largeDropped(nodes, tasks)
		if err != nil {
			t.Fatal(err)
		}
		best := exactLeastDropped(nodes, tasks)
		if got > best {
			t.Fatalf("instance %d: largeDropped %d GPUs, but a placement drops only %d\nnodes %+v\ntasks %+v", inst, got, best, nodes, tasks)
		}
		if allLarge {
			if got != best {
				t.Fatalf("instance %d (every task large): largeDropped %d GPUs, the least any placement drops is %d\nnodes %+v\ntasks %+v", inst, got, best, nodes, tasks)
			}
			equal++
		}
	}
	if equal == 0 {
		t.Fatal("no all-large instance checked")
	}
}

// exactLeastDropped tries every assignment of tasks to nodes (or none) and
// returns the least GPU dropped by one that fits every node's GPUs, CPU,
// memory and models.
func exactLeastDropped(nodes []NodeRow, tasks []PodRow) int64 {
	best := int64(-1)
	assign := make([]int, len(tasks))
	var try func(k int)
	try = func(k int) {
		if k == len(tasks) {
			gpus := make([]int, len(nodes))
			cpu := make([]int64, len(nodes))
			mem := make([]int64, len(nodes))
			var dropped int64
			for i, p := range tasks {
				j := assign[i]
				if j < 0 {
					dropped += int64(p.NumGPU)
					continue
				}
				ok := p.Spec == ""
				for _, m := range SpecModels(p.Spec) {
					ok = ok || api.ModelMatches(m, nodes[j].Model)
				}
				if !ok {
					return
				}
				gpus[j] += p.NumGPU
				cpu[j] += p.CPUMilli
				mem[j] += p.MemMiB
			}
			for j, n := range nodes {
				if gpus[j] > n.GPUs || cpu[j] > n.CPUMilli || mem[j] > n.MemMiB {
					return
				}
			}
			if best < 0 || dropped < best {
				best = dropped
			}
			return
		}
		for j := -1; j < len(nodes); j++ {
			assign[k] = j
			try(k + 1)
		}
	}
	try(0)
	return best
}
