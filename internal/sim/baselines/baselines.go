// Package baselines holds the placement policies the simulator compares
// Tessera's with, as in the simulator of Weng et al. (ATC '23):
// Random-fit, Dot-product, GPU Clustering, GPU Packing and Best-fit (FGD,
// the sixth, is package policies': the scheduler runs it, and tessera is
// built on it). They are research baselines: the scheduler does not run
// them, and the daemon does not link them.
//
// They keep the original simulator's semantics where they matter for
// results: integer scores, ties broken uniformly at random (as
// kube-scheduler's selectHost does) and the original GPU choice within a
// node. Scores are in thousandths of a GPU ("milli") like the original.
package baselines

import (
	"sync/atomic"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Policy names (Entry.Name in All).
const (
	NameRandom        = "random"
	NameDotProduct    = "dotproduct"
	NameGPUClustering = "gpuclustering"
	NameGPUPacking    = "gpupacking"
	NameBestFit       = "bestfit"
)

// All lists the baselines, in the order of the published comparison.
func All() policies.Catalogue {
	return policies.Catalogue{
		{Name: NameRandom, New: func(_ *placement.Cluster, seed int64) placement.Policy { return &Random{base: base{seed: seed}} }},
		{Name: NameDotProduct, New: func(_ *placement.Cluster, seed int64) placement.Policy { return &DotProduct{base: base{seed: seed}} }},
		{Name: NameGPUClustering, New: func(c *placement.Cluster, seed int64) placement.Policy { return newGPUClustering(c, seed) }},
		{Name: NameGPUPacking, New: func(_ *placement.Cluster, seed int64) placement.Policy { return &GPUPacking{base: base{seed: seed}} }},
		{Name: NameBestFit, New: func(_ *placement.Cluster, seed int64) placement.Policy { return &BestFit{base: base{seed: seed}} }},
	}
}

// Scales of the original simulator (open-gpu-share MaxSpec*): they
// normalise CPU and GPU amounts in the Best-fit and Dot-product scores.
const (
	maxSpecCPU = 128000
	maxSpecGPU = 8000
)

// base carries what random choices need: the run's seed and the arrival
// number of the pod being placed (advanced by Observe).
type base struct {
	seed int64
	seq  atomic.Uint64
}

// Observe advances the arrival number so each pod gets fresh tie-breaks.
func (b *base) Observe(*placement.Compiled) { b.seq.Add(1) }

func (b *base) tie(n *placement.Node, gpu int) float64 {
	return tieBreak(b.seed, b.seq.Load(), n.Name, gpu)
}

// bestFitGPUs gives a policy policies.BestGPU as its GPU choice, as the published
// baselines other than Random and FGD used.
type bestFitGPUs struct{}

func (bestFitGPUs) RankGPU(_ *placement.Compiled, n *placement.Node, i int, _, demand placement.Usage) float64 {
	return policies.BestGPU(n, i, demand)
}

func (bestFitGPUs) RankGPUs(_ *placement.Compiled, n *placement.Node, cand []int, _, demand []placement.Usage, rank []float64) {
	for _, i := range cand {
		rank[i] = policies.BestGPU(n, i, demand[i])
	}
}

// Random places each pod on a uniformly random node that fits it and a
// share on a uniformly random GPU that fits it.
type Random struct{ base }

func (*Random) Name() string { return NameRandom }

func (r *Random) ScoreNode(_ *placement.Compiled, p *placement.Placement) float64 {
	return r.tie(p.Node, -1)
}

func (r *Random) RankGPU(_ *placement.Compiled, n *placement.Node, i int, _, demand placement.Usage) float64 {
	return randomGPU(r.seed, r.seq.Load(), n, i, demand)
}

// ForPod fixes the pod's arrival number, so its draws do not change if
// the next pod is observed while it is being scored.
func (r *Random) ForPod(*placement.Compiled) placement.Policy {
	return &randomPod{seed: r.seed, seq: r.seq.Load()}
}

func randomGPU(seed int64, seq uint64, n *placement.Node, i int, demand placement.Usage) float64 {
	if demand.Exclusive > 0 {
		return -float64(i)
	}
	return tieBreak(seed, seq, n.Name, i)
}

// randomPod is Random prepared for one pod.
type randomPod struct {
	seed int64
	seq  uint64
}

func (*randomPod) Name() string { return NameRandom }

func (r *randomPod) ScoreNode(_ *placement.Compiled, p *placement.Placement) float64 {
	return tieBreak(r.seed, r.seq, p.Node.Name, -1)
}

func (r *randomPod) RankGPU(_ *placement.Compiled, n *placement.Node, i int, _, demand placement.Usage) float64 {
	return randomGPU(r.seed, r.seq, n, i, demand)
}

// BestFit prefers the node with the least CPU and GPU left after placement,
// each normalised by the largest node spec and weighted equally; the score
// is an integer 0..100 as in the original.
type BestFit struct {
	base
	bestFitGPUs
}

func (*BestFit) Name() string { return NameBestFit }

func (b *BestFit) ScoreNode(cr *placement.Compiled, p *placement.Placement) float64 {
	return float64(BestFitScore(p.Node, policies.ShapeOf(cr)))
}

// BestFitScore is Best-fit's integer score of placing s on n.
func BestFitScore(n *placement.Node, s policies.Shape) int64 {
	left := float64(n.FreeCPU()-s.CPUMilli)/maxSpecCPU*0.5 +
		float64(gpuFreeTotal(n)-s.TotalMilli())/maxSpecGPU*0.5
	return int64((1 - left) * 100)
}

// DotProduct is Tetris's alignment score with the GPU dimensions merged and
// normalised by the largest node spec: it prefers the node whose free
// (CPU, GPU) vector has the smallest dot product with the pod's request.
// GPUs within the node are chosen best-fit, as in the published runs.
type DotProduct struct {
	base
	bestFitGPUs
}

func (*DotProduct) Name() string { return NameDotProduct }

func (d *DotProduct) ScoreNode(cr *placement.Compiled, p *placement.Placement) float64 {
	return float64(DotProductScore(p.Node, policies.ShapeOf(cr)))
}

// DotProductScore is Dot-product's integer score of placing s on n.
func DotProductScore(n *placement.Node, s policies.Shape) int64 {
	dot := float64(n.FreeCPU())/maxSpecCPU*float64(s.CPUMilli)/maxSpecCPU +
		float64(gpuFreeTotal(n))/maxSpecGPU*float64(s.TotalMilli())/maxSpecGPU
	return int64(100 * (1 - dot/2))
}

// GPUPacking prefers, in order: nodes where the pod fits on GPUs already in
// use (fuller GPUs first), then used nodes where it needs idle GPUs (fewer
// first), then idle nodes (smaller first). CPU-only pods score 0 everywhere.
type GPUPacking struct {
	base
	bestFitGPUs
}

func (*GPUPacking) Name() string { return NameGPUPacking }

func (g *GPUPacking) ScoreNode(cr *placement.Compiled, p *placement.Placement) float64 {
	return float64(GPUPackingScore(p.Node, policies.ShapeOf(cr)))
}

// GPUPackingScore is GPU Packing's integer score of placing s on n.
func GPUPackingScore(n *placement.Node, s policies.Shape) int64 {
	if s.TotalMilli() <= 0 {
		return 0
	}
	var buf [api.MaxGPUsPerNode]int64
	free := policies.NodeFree(n, &buf)
	idle := 0
	for _, f := range free {
		if f == policies.Milli {
			idle++
		}
	}
	if idle == len(n.GPUs) {
		return max(100/3-int64(idle), int64(idle))
	}
	// Take the fullest GPUs that fit, as the original does.
	var order [api.MaxGPUsPerNode]int
	sortByFree(order[:len(n.GPUs)], free)
	need, idleUsed := s.NumGPU, 0
	var freeOnUsed int64
	for _, i := range order[:len(n.GPUs)] {
		if need == 0 {
			break
		}
		if free[i] >= s.GPUMilli {
			need--
			if free[i] == policies.Milli {
				idleUsed++
			}
			freeOnUsed += free[i] * 100 / policies.Milli
		}
	}
	if need > 0 {
		return 0
	}
	if idleUsed > 0 {
		return max(100/2-int64(idleUsed), 100/3)
	}
	return max(100-freeOnUsed/10, 100/2)
}

// sortByFree fills idx with GPU positions by ascending free room, stable.
func sortByFree(idx []int, free []int64) {
	for i := range idx {
		idx[i] = i
	}
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && free[idx[j]] < free[idx[j-1]]; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}

// Every policy chooses GPUs itself, as its original does.
var (
	_ placement.GPURanker = (*Random)(nil)
	_ placement.GPURanker = (*BestFit)(nil)
	_ placement.GPURanker = (*DotProduct)(nil)
	_ placement.GPURanker = (*GPUPacking)(nil)
	_ placement.GPURanker = (*GPUClustering)(nil)
	_ placement.GPURanker = (*randomPod)(nil)
	_ placement.PodPolicy = (*Random)(nil)
)

// gpuFreeTotal is the node's idle GPU in thousandths.
func gpuFreeTotal(n *placement.Node) int64 {
	var t int64
	for i := range n.GPUs {
		t += policies.FreeMilli(&n.GPUs[i])
	}
	return t
}

// tieBreak is a pseudo-random number in [0, 0.5) that is a pure function of
// the policy seed, the pod's arrival number and the node (and GPU): random
// choices without shared mutable state, so concurrent scoring is safe.
func tieBreak(seed int64, seq uint64, name string, gpu int) float64 {
	h := uint64(seed)*0x9e3779b97f4a7c15 ^ seq*0xbf58476d1ce4e5b9 ^ uint64(gpu+1)*0x94d049bb133111eb
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 0x100000001b3
	}
	h ^= h >> 31
	h *= 0x9e3779b97f4a7c15
	h ^= h >> 29
	return float64(h>>11) / float64(1<<53) * 0.5
}
