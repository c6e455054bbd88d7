package policies

import (
	"math"

	"github.com/tessera-gpu/tessera/internal/placement"
)

// TesseraParams tune the tessera policy.
type TesseraParams struct {
	// Multi weighs the multi-copy fragmentation measure (fragMulti)
	// against FGD's single-copy one: 1 is fragMulti alone, 0 FGD's.
	Multi float64
	// Quantum rounds the node's fragmentation change (in GPUs) to a
	// multiple of itself, so that near-equal nodes tie and the first node
	// in the cluster's order wins: first-fit among equals keeps whole
	// nodes free for large tasks. 0 scores the change exactly.
	Quantum float64
	// Cover is the share of observed tasks the target's shapes cover
	// (0 means 0.95, FGD's value).
	Cover float64
	// Memory also limits a shape's copies by the node's free memory.
	Memory bool
	// WholeOne counts copies for GPU shares only and keeps FGD's
	// single-copy test for whole-GPU shapes.
	WholeOne bool
	// Sigmoid scores nodes like FGD: int(100·sigmoid(−Δ/Scale)).
	Sigmoid bool
	// Scale is the sigmoid's scale in thousandths of a GPU (0: 1000).
	Scale float64
	// Scarcity weighs a shape limited to some GPU models by (all GPUs /
	// GPUs it may use)^Scarcity, so scarce models are kept for the tasks
	// that need them. 0 disables.
	Scarcity float64
	// UseTarget takes the trace's workload from the simulator
	// (TargetSetter) instead of learning it online from the pods it
	// observes, as a scheduler has to. Off by default: the results in
	// docs/simulation.md are for the policy learning online.
	UseTarget bool
	// LossWeight is what a share's node score (FGD's 0..100 scale) loses
	// per GPU of packing loss (pricing) on the GPU it goes to; 0 leaves
	// placements unpriced.
	LossWeight float64
	// RankByLoss (with LossWeight) ranks a share's GPUs within a node by
	// packing loss, then by the room left (best fit), instead of by the
	// exact fragmentation change: as good (docs/simulation.md) and it
	// needs no per-node lookup for every GPU.
	RankByLoss bool
	// MultiCPUFit breaks ties between nodes for a multi-GPU task towards
	// the node it leaves the least CPU on, so the nodes with the most
	// CPU stay free for the tasks that need it.
	MultiCPUFit bool
	// WarmUpPrior is a pseudo-count added to the count of every shape
	// seen while the target is learned from at most WarmUpTasks pods
	// (additive smoothing). Early counts of a rare shape are noisy, and
	// what is placed against them stays placed; the prior keeps a rare
	// shape's nodes from being given away on that evidence
	// (docs/simulation.md, tessera item 8). Not applied to a target given
	// by SetTarget. 0 disables.
	WarmUpPrior float64
	// WarmUpTasks is how many learned pods the warm-up lasts (0 or less:
	// 1024, the last model the learner builds on a doubling; see
	// learner). At most maxSeen−1, the learner's window.
	WarmUpTasks int
}

// DefaultTesseraParams are the values documented in docs/simulation.md.
func DefaultTesseraParams() TesseraParams {
	return TesseraParams{Multi: 1, WholeOne: true, Sigmoid: true, Cover: 1, Scarcity: 1,
		LossWeight: 1000, RankByLoss: true, MultiCPUFit: true, WarmUpPrior: 20}
}

// Tessera is our fragmentation-aware policy. It shares FGD's machinery
// (expected fragmentation of a target workload, per-node caching, FGD's
// rounded node score with ties to the first node) but: for GPU shares,
// fragmentation counts how many copies the node can still take given its
// GPU room and CPU (FGD asks only whether one fits); the target covers
// every shape seen and weighs model-constrained shapes by how scarce their
// models are; GPUs within a node are ranked by the exact change; a share's
// node score pays for the packing loss of the GPU it would go to (pricing:
// room left that the workload's best packing cannot fill as well); and a
// multi-GPU task breaks ties towards the node it leaves the least CPU on.
// It learns the workload online from the pods it observes.
type Tessera struct {
	*FGD
	p TesseraParams
}

// NewTessera returns a tessera policy for cluster c (whose GPU models weigh
// constrained shapes; c may be nil). It makes no random choices, so it
// takes no seed.
func NewTessera(c *placement.Cluster, p TesseraParams) *Tessera {
	cover := p.Cover
	if cover == 0 {
		cover = 0.95
	}
	warmUp := p.WarmUpTasks
	if warmUp <= 0 {
		warmUp = 1024
	}
	// The model sees the learner's window, which stops growing at maxSeen.
	warmUp = min(warmUp, maxSeen-1)
	newModel := func(tasks []Shape, learned bool) *fragModel {
		target, covered := popularShapes(tasks, cover)
		if learned && p.WarmUpPrior > 0 && len(tasks) <= warmUp {
			smooth(target, covered, p.WarmUpPrior)
		}
		if p.Scarcity > 0 && c != nil {
			weighByScarcity(target, c, p.Scarcity)
		}
		m := newFragModel(target, p.Memory)
		if p.LossWeight > 0 {
			m.prices = newPricing(target)
		}
		m.multi = p.Multi
		m.wholeOne = p.WholeOne
		return m
	}
	sc := scoring{perGPU: true, lossWeight: p.LossWeight, multiCPUFit: p.MultiCPUFit, rankByLoss: p.RankByLoss}
	sc.gpu = func(delta float64) float64 { return -delta / Milli }
	sc.node = func(delta float64) float64 {
		v := -delta / Milli
		if p.Quantum > 0 {
			v = math.Floor(v/p.Quantum) * p.Quantum
		}
		return v
	}
	if p.Sigmoid {
		scale := p.Scale
		if scale == 0 {
			scale = 1000
		}
		sc.node = func(delta float64) float64 { return float64(int64(sigmoid(-delta/scale) * 100)) }
	}
	return &Tessera{FGD: newFGD(NameTessera, sc, newModel), p: p}
}

// SetTarget takes the trace's workload only when configured to.
func (t *Tessera) SetTarget(tasks []Shape) {
	if t.p.UseTarget {
		t.FGD.SetTarget(tasks)
	}
}

// smooth adds prior to the count of each shape of target, whose weights
// are shares of covered tasks, and renormalises.
func smooth(target []WeightedShape, covered, prior float64) {
	total := covered + prior*float64(len(target))
	for i := range target {
		target[i].Weight = (target[i].Weight*covered + prior) / total
	}
}

// weighByScarcity multiplies the weight of each shape by (GPUs in the
// cluster / GPUs of models it may use)^alpha and renormalises.
func weighByScarcity(target []WeightedShape, c *placement.Cluster, alpha float64) {
	perModel := map[string]float64{}
	var all float64
	for _, n := range c.Nodes() {
		perModel[nodeModel(n)] += float64(len(n.GPUs))
		all += float64(len(n.GPUs))
	}
	var sum float64
	for i := range target {
		w := &target[i]
		if w.NumGPU > 0 && w.Spec != "" {
			var usable float64
			for m, g := range perModel {
				if ModelAllowed(w.Spec, m) {
					usable += g
				}
			}
			if usable > 0 {
				w.Weight *= math.Pow(all/usable, alpha)
			}
		}
		sum += w.Weight
	}
	for i := range target {
		target[i].Weight /= sum
	}
}
