package policies

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies/policytest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// A Search, which remembers verdicts and scores per pod shape (Memo),
// chooses exactly what a plain scan of every node chooses, while pods
// arrive and depart, nodes are replaced and removed and the learning
// policies rebuild their models. Two identical clusters, two instances of
// the policy: one placed through Search, the other by fitting and scoring
// every node afresh for every pod.
func TestMemoSearchMatchesPlainScan(t *testing.T) {
	for _, name := range []string{"binpack", "spread", NameFGD, NameTessera} {
		t.Run(name, func(t *testing.T) {
			const nodes = 40
			ca, cb := policytest.Cluster(t, nodes, 7), policytest.Cluster(t, nodes, 7)
			pa, err := New(name, ca, 1)
			if err != nil {
				t.Fatal(err)
			}
			pb, _ := New(name, cb, 1)
			sr := placement.NewSearch(ca)
			order := make([]int, nodes)
			for i := range order {
				order[i] = i
			}
			rng := rand.New(rand.NewPCG(3, 4))
			var placed []string
			for k, r := range policytest.Pods(1500, 11) {
				cra, err := ca.Compile(r)
				if err != nil {
					t.Fatal(err)
				}
				crb, _ := cb.Compile(r)
				for _, obs := range []placement.Policy{pa, pb} {
					if o, ok := obs.(placement.Observer); ok {
						o.Observe(map[placement.Policy]*placement.Compiled{pa: cra, pb: crb}[obs])
					}
				}
				got := sr.Best(cra, pa)
				prep := placement.Prepare(crb, placement.PolicyFor(crb, pb))
				scores, charges := policytest.ScoreAll(cb, crb, prep, order, 1)
				want := -1
				for i, s := range scores {
					if !math.IsNaN(s) && (want < 0 || s > scores[want]) {
						want = i
					}
				}
				switch {
				case got == nil && want < 0:
					continue
				case got == nil || want < 0:
					t.Fatalf("pod %d (%s): search %v, plain scan %d", k, r.Pod, got != nil, want)
				case got.Node.Name != cb.Nodes()[want].Name:
					t.Fatalf("pod %d (%s): search chose %s, plain scan %s", k, r.Pod, got.Node.Name, cb.Nodes()[want].Name)
				}
				for g := range got.Node.GPUs {
					if got.Charge(g) != charges[want][g] {
						t.Fatalf("pod %d (%s) on %s: GPU %d charged %+v, plain scan %+v", k, r.Pod, got.Node.Name, g, got.Charge(g), charges[want][g])
					}
				}
				if _, err := ca.Assign(cra, got); err != nil {
					t.Fatal(err)
				}
				var p placement.Placement
				var s placement.Scratch
				if r := crb.Fit(cb.Nodes()[want], placement.RankerFor(crb, prep), &s, &p); !r.OK() {
					t.Fatal(r)
				}
				if _, err := cb.Assign(crb, &p); err != nil {
					t.Fatal(err)
				}
				placed = append(placed, r.Pod)
				// Departures, and now and then a node replaced (its
				// pods keep their charges) with a GPU failing, or
				// removed and added again.
				if len(placed) > 60 && rng.IntN(3) > 0 {
					i := rng.IntN(len(placed))
					ca.Release(placed[i])
					cb.Release(placed[i])
					placed = append(placed[:i], placed[i+1:]...)
				}
				if k%97 == 0 {
					i := rng.IntN(nodes)
					for _, c := range []*placement.Cluster{ca, cb} {
						old := c.Nodes()[i]
						if k%194 == 0 {
							// Removed and added again: the last node
							// moves into its index, it goes last.
							c.RemoveNode(old.Name)
						}
						inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: 1}
						for g := range old.GPUs {
							health := api.Healthy
							if g == k%8 {
								health = api.Unhealthy
							}
							inv.GPUs = append(inv.GPUs, api.GPU{UUID: old.GPUs[g].UUID, Index: g, Model: old.GPUs[g].Model,
								MemoryMiB: 10000, Health: health, Sharing: api.SharingShared, MaxShares: 100})
						}
						n, err := placement.NewNode(old.Name, 64000, 1<<20, inv)
						if err != nil {
							t.Fatal(err)
						}
						c.UpsertNode(n)
					}
				}
			}
			if len(placed) < 100 {
				t.Fatalf("only %d pods placed: the stream does not exercise the memo", len(placed))
			}
		})
	}
}
