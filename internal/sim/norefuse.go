package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tessera-gpu/tessera/internal/lp"
)

// The never-refuse floor. Under the methodology a task is dropped only
// when it fits nowhere, and nothing departs. So once a task is dropped,
// every later task that needs at least as much of everything it needed is
// dropped too: for a dropped share of s% with CPU c and memory m, every
// later task needing at least s% of one GPU (a larger share or any whole
// GPU), c and m, under the same or a stricter model constraint; for a
// dropped task of g whole GPUs, every later task of at least g whole GPUs,
// c and m, same or stricter model. A run's set of dropped tasks D is
// therefore closed under "later and needing at least as much", and the
// tasks it places must pack: the placed shares need some B GPUs (at least
// the arc-flow LP of packing them) and the placed whole-GPU tasks their
// GPUs, together at most the cluster's. The floor is the least GPU such a
// D can drop by arrived = 100% (plus what arrivals fall short of 100%).
//
// Finding that D exactly is a precedence-constrained knapsack problem; we
// compute a lower bound on it by Lagrangian relaxation. For prices π of
// the share sizes that are feasible in the dual of the packing LP, any m
// shares need at least π·m GPUs (weak duality), so a feasible D must
// "cover" E = π·n + W − G, where n counts the arrived shares by size, W
// is the arrived whole GPUs and G the cluster's GPUs, with each dropped
// share of s% covering π_s and each dropped whole-GPU task its GPUs.
// Relaxing that cover constraint with a multiplier λ ≥ 0 leaves
// λE + min over closed D of Σ_{j∈D} (volume_j − λ·cover_j), a minimum-
// weight closure, i.e. a minimum cut (lp.Network). Every λ gives a lower
// bound; the best λ is found by the breakpoint search of the piecewise
// linear dual, and π is re-priced (at the counts the relaxation leaves)
// a few times, keeping the best bound. The bound equals the LP
// relaxation of the model, so it can sit a little below the model's exact
// optimum (seed 1 of the default trace: 3.652% here, 3.671% from an exact
// MILP solver on the same model; see docs/simulation.md).

// nrTask is one GPU task arrived by 100%, for the never-refuse floor.
type nrTask struct {
	share bool
	need  int // share: percent of one GPU; whole: GPUs
	cpu   int64
	mem   int64
	spec  []string // sorted; nil = any model
}

// volume is the task's GPU in % of one GPU.
func (t *nrTask) volume() float64 {
	if t.share {
		return float64(t.need)
	}
	return float64(100 * t.need)
}

// blocks reports whether a later task u must be dropped once t was: u
// needs at least what t needed of one GPU, CPU and memory, under the same
// or a stricter model constraint.
func (t *nrTask) blocks(u *nrTask) bool {
	if u.cpu < t.cpu || u.mem < t.mem || !stricter(u.spec, t.spec) {
		return false
	}
	if t.share {
		return !u.share || u.need >= t.need
	}
	return !u.share && u.need >= t.need
}

// stricter reports whether model list a allows no model that b does not.
func stricter(a, b []string) bool {
	if b == nil {
		return true
	}
	if a == nil {
		return false
	}
	for _, m := range a {
		if !slices.Contains(b, m) {
			return false
		}
	}
	return true
}

// neverRefuse computes the never-refuse floor, in % of one GPU, for the
// tasks arrived by 100% (in arrival order), on a cluster of gpus GPUs;
// short is what arrivals fall short of 100%, in % of one GPU.
func neverRefuse(tasks []nrTask, gpus int, short float64) (float64, error) {
	var n shareCounts
	whole := 0
	for i := range tasks {
		if tasks[i].share {
			n[tasks[i].need]++
		} else {
			whole += tasks[i].need
		}
	}
	cl := newClosureNet(tasks)
	best := short
	counts := n
	for round := 0; round < 3; round++ {
		_, price, err := counts.packingDual()
		if err != nil {
			return 0, err
		}
		// π·n for the full counts (π is dual feasible for any counts).
		cover := make([]float64, len(tasks))
		var piN float64
		for s, k := range n {
			piN += 100 * price[s] * float64(k)
		}
		for i := range tasks {
			if tasks[i].share {
				cover[i] = 100 * price[tasks[i].need]
			} else {
				cover[i] = tasks[i].volume()
			}
		}
		e := piN + float64(100*(whole-gpus))
		if e <= 0 {
			return best, nil // everything fits: nothing needs dropping
		}
		bound, dropped := cl.lagrangian(tasks, cover, e)
		best = math.Max(best, bound+short)
		// Re-price at the shares the relaxation places.
		counts = n
		for i, d := range dropped {
			if d && tasks[i].share {
				counts[tasks[i].need]--
			}
		}
		if counts == n {
			break
		}
	}
	return best, nil
}

// closureNet is the minimum-cut network of the closure constraints: node
// i+2 is task i, node 0 the source, node 1 the sink; task i has an arc of
// infinite capacity to the first later task of each type it blocks (later
// tasks of that type follow through that task's own arc to the next of
// its type), and arcs from the source and to the sink whose capacities
// the multiplier sets.
type closureNet struct {
	g        *lp.Network
	src, snk []int // arc indexes per task
}

func newClosureNet(tasks []nrTask) *closureNet {
	type key struct {
		share    bool
		need     int
		cpu, mem int64
		spec     string
	}
	typeOf := make([]int, len(tasks))
	ids := map[key]int{}
	var reps []int // a task of each type
	for i := range tasks {
		t := &tasks[i]
		k := key{t.share, t.need, t.cpu, t.mem, strings.Join(t.spec, "|")}
		id, ok := ids[k]
		if !ok {
			id = len(reps)
			ids[k] = id
			reps = append(reps, i)
		}
		typeOf[i] = id
	}
	blocked := make([][]int, len(reps)) // type → the types it blocks
	for a, ra := range reps {
		for b, rb := range reps {
			if tasks[ra].blocks(&tasks[rb]) {
				blocked[a] = append(blocked[a], b)
			}
		}
	}
	g := lp.NewNetwork(len(tasks) + 2)
	cl := &closureNet{g: g, src: make([]int, len(tasks)), snk: make([]int, len(tasks))}
	next := make([]int, len(reps)) // next task of each type after the sweep point
	for i := range next {
		next[i] = -1
	}
	for i := len(tasks) - 1; i >= 0; i-- {
		for _, u := range blocked[typeOf[i]] {
			if j := next[u]; j >= 0 {
				g.AddArc(i+2, j+2, lp.Infinite)
			}
		}
		next[typeOf[i]] = i
	}
	for i := range tasks {
		cl.src[i] = g.AddArc(0, i+2, 0)
		cl.snk[i] = g.AddArc(i+2, 1, 0)
	}
	return cl
}

// flowScale turns the weights (% of a GPU) into integer capacities.
const flowScale = 1 << 20

// minClosure returns the least total weight of a closed set of tasks, and
// the set: the tasks on the source side of a minimum cut in the network
// where a task of negative weight gets that much from the source and a
// task of positive weight sends that much to the sink.
func (cl *closureNet) minClosure(weight []float64) (float64, []bool) {
	for i, w := range weight {
		c := int64(math.Round(math.Abs(w) * flowScale))
		if w < 0 {
			cl.g.SetCap(cl.src[i], c)
			cl.g.SetCap(cl.snk[i], 0)
		} else {
			cl.g.SetCap(cl.src[i], 0)
			cl.g.SetCap(cl.snk[i], c)
		}
	}
	cl.g.MaxFlow(0, 1)
	side := cl.g.SourceSide(0)
	in := make([]bool, len(weight))
	var total float64
	for i := range in {
		if side[i+2] {
			in[i] = true
			total += weight[i]
		}
	}
	return total, in
}

// lagrangian returns max over λ ≥ 0 of λ·e + min over closed D of
// Σ_{i∈D} (volume_i − λ·cover_i), a lower bound on the least volume of a
// closed set covering e, and the closed set at the best λ.
func (cl *closureNet) lagrangian(tasks []nrTask, cover []float64, e float64) (float64, []bool) {
	weight := make([]float64, len(tasks))
	eval := func(lambda float64) (l, vol, cov float64, d []bool) {
		for i := range tasks {
			weight[i] = tasks[i].volume() - lambda*cover[i]
		}
		w, d := cl.minClosure(weight)
		for i, in := range d {
			if in {
				vol += tasks[i].volume()
				cov += cover[i]
			}
		}
		// The cut rounds each weight to 1/flowScale, so the set found may
		// miss the minimum by that much per task: the bound gives it up.
		return lambda*e + w - float64(len(tasks))/flowScale, vol, cov, d
	}
	// lo: a closed set covering less than e (the empty set at λ = 0);
	// hi: one covering at least e.
	bestL, loV, loC, bestD := eval(0)
	hiL := 1.0
	_, hiV, hiC, _ := eval(hiL)
	for hiC < e {
		hiL *= 2
		if hiL > 1e6 {
			return bestL, bestD // cannot happen: dropping everything covers e
		}
		_, hiV, hiC, _ = eval(hiL)
	}
	for it := 0; it < 60; it++ {
		if hiC-loC <= 1e-9 {
			break
		}
		// The λ where the two sets' lines cross.
		lambda := (hiV - loV) / (hiC - loC)
		l, v, c, d := eval(lambda)
		if l > bestL {
			bestL, bestD = l, d
		}
		line := lambda*e + (loV - lambda*loC)
		if l >= line-1e-6 {
			break // the dual's maximum: no set below the two lines
		}
		if c < e {
			loV, loC = v, c
		} else {
			hiV, hiC = v, c
		}
	}
	return bestL, bestD
}

// packingDual solves the arc-flow LP of packing the shares and returns
// its value (GPUs) and the dual price of each share size (GPUs per share).
func (c *shareCounts) packingDual() (float64, [101]float64, error) {
	var price [101]float64
	if c.volume() == 0 {
		return 0, price, nil
	}
	m, err := c.arcFlow(1)
	if err != nil {
		return 0, price, err
	}
	rows := map[int]int{}
	for s, k := range c {
		if k > 0 {
			rows[s] = m.Rows()
			if err := m.AddRow(m.Demand(s), lp.GE, float64(k)); err != nil {
				return 0, price, err
			}
		}
	}
	sol, err := m.SolveDual()
	if err != nil {
		return 0, price, fmt.Errorf("packing %d shares: %w", c.total(), err)
	}
	for s, r := range rows {
		price[s] = math.Max(0, sol.Dual[r])
	}
	return sol.Value, price, nil
}
