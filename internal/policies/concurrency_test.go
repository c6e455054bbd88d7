package policies

import (
	"math"
	"testing"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies/policytest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Scoring takes no policy-wide lock (policytest.ConcurrentScoringMatchesSerial),
// for every policy of All. Run with -race.
func TestConcurrentScoringMatchesSerial(t *testing.T) {
	for _, e := range All() {
		t.Run(e.Name, func(t *testing.T) { policytest.ConcurrentScoringMatchesSerial(t, e.New) })
	}
}

// Ranking a node's GPUs in one call (placement.GPUsRanker) gives what
// ranking them one at a time gives, and the ranks and priced scores that
// tessera keeps with a node's cache entry are what it would compute from
// the node's GPUs: for every pod of a stream and every node.
func TestRankGPUsAsRankGPU(t *testing.T) {
	c := policytest.Cluster(t, 40, 7)
	for _, name := range []string{NameFGD, NameTessera} {
		pol, err := New(name, c, 1)
		if err != nil {
			t.Fatal(err)
		}
		obs := pol.(placement.Observer)
		checked := 0
		for _, r := range policytest.Pods(60, 8) {
			cr, err := c.Compile(r)
			if err != nil {
				t.Fatal(err)
			}
			obs.Observe(cr)
			ps := placement.Prepare(cr, pol).(*podScorer)
			for _, n := range c.Nodes() {
				var cand []int
				var pending, demand [api.MaxGPUsPerNode]placement.Usage
				for i := range n.GPUs {
					if FreeMilli(&n.GPUs[i]) > 0 {
						cand = append(cand, i)
						demand[i] = placement.Usage{MemoryMiB: 1000, Cores: int(ps.shape.GPUMilli / 10), Shares: 1}
					}
				}
				rank := make([]float64, len(n.GPUs))
				ps.RankGPUs(cr, n, cand, pending[:], demand[:], rank)
				for _, i := range cand {
					if one := ps.RankGPU(cr, n, i, pending[i], demand[i]); one != rank[i] {
						t.Fatalf("%s, pod %s, node %s GPU %d: RankGPUs %v, RankGPU %v", name, r.Pod, n.Name, i, rank[i], one)
					}
				}
				e := ps.entry(n)
				if e == nil || e.rank == nil {
					continue
				}
				for i := range n.GPUs {
					free := FreeMilli(&n.GPUs[i])
					g := freePercent(free)
					want := -float64(free)
					if g >= ps.pct {
						want = -(lossRank*ps.loss[g] + float64(g-ps.pct))
					}
					if e.rank[i] != want {
						t.Fatalf("%s, pod %s, node %s GPU %d: cached rank %v, want %v", name, r.Pod, n.Name, i, e.rank[i], want)
					}
					if e.nodeAt == nil {
						continue
					}
					want = e.node // where the share does not fit
					if !math.IsInf(e.gpu[i], 0) {
						want = ps.pricedAt(e, i, g)
					}
					if e.priced[i] != want {
						t.Fatalf("%s, pod %s, node %s GPU %d: cached priced score %v, want %v", name, r.Pod, n.Name, i, e.priced[i], want)
					}
					checked++
				}
			}
		}
		if name == NameTessera && checked == 0 {
			t.Errorf("tessera: no cached priced GPU was checked")
		}
	}
}
