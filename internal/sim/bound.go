package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tessera-gpu/tessera/internal/lp"
	"github.com/tessera-gpu/tessera/internal/policies"
)

// Floor is how little GPU any run of one seed's arrivals can leave
// unallocated at arrived = 100%, as % of capacity. The figures come from
// a relaxation that ignores CPU, memory, GPU models and node boundaries
// and lets whole-GPU tasks use any GPU no share touches, except for large
// tasks (see largeDropped): no node takes two of them, so those the nodes
// cannot all take are dropped whatever the policy. No real policy can go
// below them.
//
// At arrived = 100% the unallocated GPU equals the GPU of the tasks
// dropped so far (plus the few thousandths by which arrivals fall short of
// 100%). A share of s% blocks s% of one GPU and the rest of that GPU can
// only take other shares, so idle slivers beside shares that no other
// share fills push whole-GPU tasks off the cluster.
type Floor struct {
	Seed int64 `json:"seed"`
	// AnyPolicy holds for every policy, even one that knows the future
	// and chooses which shares to drop.
	AnyPolicy float64 `json:"anyPolicy"`
	// AllShares holds for a run that places every share that arrives
	// by 100% (the sliver waste of the best packing of those shares).
	AllShares float64 `json:"allShares"`
	// NeverRefuse holds for a run that drops a task only when it fits
	// nowhere, as the methodology does (see neverRefuse): once a task is
	// dropped, every later task needing at least as much is dropped too.
	NeverRefuse float64 `json:"neverRefuse"`
	// LargeTasks is the GPU of the large tasks (more than half the GPUs
	// of every node they fit) that the nodes cannot all take, one per
	// node: dropped by every run, and part of the three floors above.
	LargeTasks float64 `json:"largeTasks"`
}

// Floor computes the floors for one seed's arrivals (see Floor).
func (t *Trace) Floor(seed int64) (Floor, error) {
	capacity := t.CapacityMilli()
	if capacity == 0 {
		return Floor{}, fmt.Errorf("the node list has no GPUs; unallocated GPU %% is undefined")
	}
	var counts shareCounts
	var arrived int64
	var tasks []nrTask
	var whole []PodRow
	for _, i := range t.Arrivals(seed, Inflation) {
		p := t.Pods[i]
		g := p.GPURequestMilli()
		if arrived+g > capacity {
			break
		}
		arrived += g
		if p.NumGPU == 0 {
			continue
		}
		if p.GPUMilli >= 1000 {
			whole = append(whole, p)
		}
		task := nrTask{need: p.NumGPU, cpu: p.CPUMilli, mem: p.MemMiB, spec: sortedModels(p.Spec)}
		if p.NumGPU == 1 && p.GPUMilli < 1000 {
			counts[SharePercent(p.GPUMilli)]++
			task.share, task.need = true, SharePercent(p.GPUMilli)
		}
		tasks = append(tasks, task)
	}
	// Arrivals short of 100% are unallocated whatever happens, and so are
	// the large tasks no node is left for.
	large, err := largeDropped(t.Nodes, whole)
	if err != nil {
		return Floor{}, fmt.Errorf("seed %d: large tasks: %w", seed, err)
	}
	short := float64(capacity-arrived) / 10 // in % of one GPU
	forced := short + float64(large)*100
	pct := func(units float64) float64 { return units * 1000 / float64(capacity) }

	bins, err := counts.minGPUs()
	if err != nil {
		return Floor{}, fmt.Errorf("seed %d: %w", seed, err)
	}
	waste := float64(bins*100 - counts.volume())
	anyPolicy, err := counts.minUnallocated(forced)
	if err != nil {
		return Floor{}, fmt.Errorf("seed %d: %w", seed, err)
	}
	// The LP's rounding noise must not put the floor below what is certain.
	anyPolicy = math.Max(anyPolicy, forced)
	never, err := neverRefuse(tasks, int(capacity/1000), short)
	if err != nil {
		return Floor{}, fmt.Errorf("seed %d: never-refuse floor: %w", seed, err)
	}
	// A never-refusing run is one policy among all.
	never = math.Max(never, anyPolicy)
	return Floor{Seed: seed, AnyPolicy: pct(anyPolicy), AllShares: pct(math.Max(waste, forced)), NeverRefuse: pct(never),
		LargeTasks: pct(float64(large) * 100)}, nil
}

// largeDropped is how many GPUs of the whole-GPU tasks given every run
// must drop because no node can take two large ones. A task is large when
// it asks for more than half the GPUs of every node it fits (GPU count,
// CPU, memory, model as the placement core matches it): two large tasks
// never share a node, so at most one per node is placed, and the most GPU
// of them the nodes can take is a maximum-weight matching of large tasks to
// nodes. The tasks a matching can cover form a transversal matroid, so with
// weights the tasks' GPU counts the greedy is exact: the most GPU is the
// sum over the distinct counts g₁ > g₂ > … of (gᵢ − gᵢ₊₁) times the largest
// matching of the tasks of at least gᵢ GPUs, an integer maximum flow
// (tasks and nodes grouped by shape). What it cannot place is dropped by
// every policy; a task that fits no node counts too.
func largeDropped(nodes []NodeRow, tasks []PodRow) (int64, error) {
	type nodeKind struct {
		gpus     int
		cpu, mem int64
		model    string
	}
	type taskKind struct {
		gpus     int
		cpu, mem int64
		spec     string // sorted models, '|'-separated
	}
	kinds := map[nodeKind]int64{}
	var nodeKinds []nodeKind
	for _, n := range nodes {
		if n.GPUs == 0 {
			continue
		}
		k := nodeKind{n.GPUs, n.CPUMilli, n.MemMiB, n.Model}
		if kinds[k] == 0 {
			nodeKinds = append(nodeKinds, k)
		}
		kinds[k]++
	}
	counts := map[taskKind]int64{}
	var shapes []taskKind
	for _, p := range tasks {
		k := taskKind{p.NumGPU, p.CPUMilli, p.MemMiB, strings.Join(sortedModels(p.Spec), "|")}
		if counts[k] == 0 {
			shapes = append(shapes, k)
		}
		counts[k]++
	}
	fits := func(t taskKind, n nodeKind) bool {
		return t.gpus <= n.gpus && t.cpu <= n.cpu && t.mem <= n.mem && policies.ModelAllowed(t.spec, n.model)
	}
	// Network: source 0, one node per large shape, one per node kind, sink.
	var dropped int64
	var large []taskKind
	var hosts [][]int
	for _, t := range shapes {
		var fit []int
		isLarge := true
		for j, n := range nodeKinds {
			if fits(t, n) {
				fit = append(fit, j)
				isLarge = isLarge && 2*t.gpus > n.gpus
			}
		}
		if len(fit) == 0 || isLarge {
			dropped += int64(t.gpus) * counts[t]
		}
		if len(fit) > 0 && isLarge {
			large = append(large, t)
			hosts = append(hosts, fit)
		}
	}
	if len(large) == 0 {
		return dropped, nil
	}
	src, sink := 0, 1+len(large)+len(nodeKinds)
	g := lp.NewNetwork(sink + 1)
	supply := make([]int, len(large))
	for i, t := range large {
		supply[i] = g.AddArc(src, 1+i, counts[t])
		for _, j := range hosts[i] {
			g.AddArc(1+i, 1+len(large)+j, lp.Infinite)
		}
	}
	for j, n := range nodeKinds {
		g.AddArc(1+len(large)+j, sink, kinds[n])
	}
	levels := make([]int, 0, len(large))
	for _, t := range large {
		levels = append(levels, t.gpus)
	}
	slices.Sort(levels)
	levels = slices.Compact(levels)
	var placed int64
	for i := len(levels) - 1; i >= 0; i-- {
		for k, t := range large {
			c := int64(0)
			if t.gpus >= levels[i] {
				c = counts[t]
			}
			g.SetCap(supply[k], c)
		}
		next := 0
		if i > 0 {
			next = levels[i-1]
		}
		placed += int64(levels[i]-next) * g.MaxFlow(src, sink)
	}
	return dropped - placed, nil
}

// sortedModels is a gpu_spec's models, sorted; nil for none.
func sortedModels(spec string) []string {
	m := SpecModels(spec)
	slices.Sort(m)
	return m
}

// shareCounts[s] is the number of shares of s% of a GPU.
type shareCounts [101]int

func (c *shareCounts) volume() int64 {
	var v int64
	for s, n := range c {
		v += int64(s * n)
	}
	return v
}

// arcFlow is the arc-flow model (lp.ArcFlow) of packing the shares into
// GPUs of 100%; gpuCost is the objective's weight on GPUs.
func (c *shareCounts) arcFlow(gpuCost float64) (*lp.ArcFlow, error) {
	counts := make([]float64, len(c))
	for s, n := range c {
		counts[s] = float64(n)
	}
	return lp.NewArcFlow(100, counts, gpuCost)
}

// minGPUs is a lower bound on the GPUs that hold all the shares: the LP
// optimum rounded up.
func (c *shareCounts) minGPUs() (int64, error) {
	v, err := c.packingLP()
	return int64(math.Ceil(v - 1e-6)), err
}

// packingLP is the optimum of the arc-flow LP: fractional GPUs.
func (c *shareCounts) packingLP() (float64, error) {
	if c.volume() == 0 {
		return 0, nil
	}
	m, err := c.arcFlow(1)
	if err != nil {
		return 0, err
	}
	for s, n := range c {
		if n > 0 {
			if err := m.AddRow(m.Demand(s), lp.GE, float64(n)); err != nil {
				return 0, err
			}
		}
	}
	v, _, err := m.Solve()
	if err != nil {
		return 0, fmt.Errorf("packing %d shares: %w", c.total(), err)
	}
	return v, nil
}

// minUnallocated is a lower bound, in % of one GPU, on the GPU left
// unallocated when any subset of the shares may be dropped: at least the
// idle slivers of the placed shares' packing, and at least the dropped
// shares plus short (whole-GPU tasks cannot use more GPUs than the
// arrivals ask for).
func (c *shareCounts) minUnallocated(short float64) (float64, error) {
	if c.volume() == 0 {
		return short, nil
	}
	m, err := c.arcFlow(0)
	if err != nil {
		return 0, err
	}
	u := m.NewVar(1)
	waste := []lp.Term{{Var: u, Coeff: 1}, {Var: m.Bins, Coeff: -100}}
	dropped := []lp.Term{{Var: u, Coeff: 1}}
	for s, n := range c {
		if n == 0 {
			continue
		}
		y := m.NewVar(0) // shares of size s dropped
		rows := []struct {
			terms []lp.Term
			sense lp.Sense
			rhs   float64
		}{
			{m.Demand(s, lp.Term{Var: y, Coeff: 1}), lp.GE, float64(n)},
			{[]lp.Term{{Var: y, Coeff: 1}}, lp.LE, float64(n)},
		}
		for _, r := range rows {
			if err := m.AddRow(r.terms, r.sense, r.rhs); err != nil {
				return 0, err
			}
		}
		waste = append(waste, lp.Term{Var: y, Coeff: -float64(s)})
		dropped = append(dropped, lp.Term{Var: y, Coeff: -float64(s)})
	}
	// u ≥ 100·gpus − (volume − Σ s·y)  and  u ≥ Σ s·y + short.
	if err := m.AddRow(waste, lp.GE, -float64(c.volume())); err != nil {
		return 0, err
	}
	if err := m.AddRow(dropped, lp.GE, short); err != nil {
		return 0, err
	}
	v, _, err := m.Solve()
	if err != nil {
		return 0, fmt.Errorf("packing %d shares with drops: %w", c.total(), err)
	}
	return v, nil
}

func (c *shareCounts) total() int {
	n := 0
	for _, k := range c {
		n += k
	}
	return n
}
