package baselines

import (
	"strconv"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
)

// GPUClustering packs pods of the same GPU kind together: it prefers nodes
// that hold only pods of the pod's kind (share-gpu, 1-gpu, 2-gpu, …), then
// nodes holding that kind among others, then idle nodes, then the rest;
// within a tier fuller nodes score higher. CPU-only pods score 0.
type GPUClustering struct {
	base
	bestFitGPUs
	c     *placement.Cluster
	kinds policies.NodeTable[map[string]int] // per node version, without a lock
}

func newGPUClustering(c *placement.Cluster, seed int64) *GPUClustering {
	return &GPUClustering{base: base{seed: seed}, c: c}
}

func (*GPUClustering) Name() string { return NameGPUClustering }

func (g *GPUClustering) ScoreNode(cr *placement.Compiled, p *placement.Placement) float64 {
	return float64(GPUClusteringScore(g.kindsOf(p.Node), gpuFreeTotal(p.Node), policies.ShapeOf(cr)))
}

// GPUClusteringScore is GPU Clustering's integer score for a pod of shape
// s on a node holding pods of the given kinds with left idle GPU milli.
func GPUClusteringScore(kinds map[string]int, left int64, s policies.Shape) int64 {
	kind := kindOf(s.NumGPU, s.Share())
	if kind == "" {
		return 0
	}
	fill := 25 * (maxSpecGPU - left) / maxSpecGPU
	switch {
	case kinds[kind] > 0 && len(kinds) == 1:
		return fill + 75
	case kinds[kind] > 0:
		return fill + 50
	case len(kinds) == 0:
		return fill + 25
	}
	return fill
}

func kindOf(gpus int, share bool) string {
	switch {
	case gpus == 0:
		return ""
	case share:
		return "share-gpu"
	}
	return strconv.Itoa(gpus) + "-gpu"
}

// kindsOf counts the kinds of GPU pods on n from the cluster's allocation
// records, cached until the node changes.
func (g *GPUClustering) kindsOf(n *placement.Node) map[string]int {
	return *g.kinds.Get(n, 0, func(kinds *map[string]int) {
		count := map[string]int{}
		for _, pod := range g.c.PodsOn(n.Name) {
			rec := g.c.Allocation(pod)
			devs, excl := 0, 0
			for _, ca := range rec.Containers {
				for _, d := range ca.Devices {
					devs++
					if d.Exclusive {
						excl++
					}
				}
			}
			switch {
			case excl > 0:
				count[kindOf(excl, false)]++
			case devs > 0:
				count[kindOf(1, true)]++
			}
		}
		*kinds = count
	})
}
