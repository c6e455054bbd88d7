// Package policytest is what the tests of placement policies share: small
// clusters and nodes, a stream of requests, and the check that a policy
// scores concurrently exactly as it scores serially. For tests only.
package policytest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Node builds a node with GPUs of 10000 MiB whose free milli are given
// (1000 = idle) and the CPU in use.
func Node(t *testing.T, cpuCap, cpuUsed int64, model string, free ...int64) *placement.Node {
	t.Helper()
	inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: 1}
	for i := range free {
		inv.GPUs = append(inv.GPUs, api.GPU{UUID: fmt.Sprintf("GPU-%d", i), Index: i, Model: model,
			MemoryMiB: 10000, Health: api.Healthy, Sharing: api.SharingShared, MaxShares: 100})
	}
	n, err := placement.NewNode("n", cpuCap, 1<<20, inv)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range free {
		used := 1000 - f
		if used > 0 {
			n.GPUs[i].Used = placement.Usage{MemoryMiB: used * 10, Cores: int(used / 10), Shares: 1}
		}
	}
	n.CPUUsed = cpuUsed
	return n
}

// Cluster is nodes × 8 GPUs (T4 and A10 nodes, 64 cores each) with
// random shares already placed.
func Cluster(t *testing.T, nodes int, seed uint64) *placement.Cluster {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	c := placement.NewCluster()
	for i := 0; i < nodes; i++ {
		model := "T4"
		if i%3 == 2 {
			model = "A10"
		}
		inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: 1}
		for g := 0; g < 8; g++ {
			inv.GPUs = append(inv.GPUs, api.GPU{UUID: fmt.Sprintf("GPU-%d-%d", i, g), Index: g, Model: model,
				MemoryMiB: 10000, Health: api.Healthy, Sharing: api.SharingShared, MaxShares: 100})
		}
		n, err := placement.NewNode(fmt.Sprintf("node-%03d", i), 64000, 1<<20, inv)
		if err != nil {
			t.Fatal(err)
		}
		c.UpsertNode(n)
	}
	for k := 0; k < nodes*3; k++ {
		n := c.Nodes()[rng.IntN(nodes)]
		g := &n.GPUs[rng.IntN(8)]
		pct := []int{10, 20, 30, 50}[rng.IntN(4)]
		if g.FreeCores() < pct {
			continue
		}
		rec := &api.PodAllocation{Node: n.Name, Containers: []api.ContainerAllocation{{Name: "main",
			Devices: []api.DeviceGrant{{UUID: g.UUID, MemoryMiB: int64(pct) * 100, Cores: pct}}}}}
		if err := c.AssignRecord(fmt.Sprintf("old-%d", k), 2000, 1024, rec); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// Pods is a stream of requests: shares of trace-like sizes, whole and
// multi-GPU tasks, a model-constrained share and CPU-only tasks.
func Pods(n int, seed uint64) []*placement.Request {
	rng := rand.New(rand.NewPCG(seed, 2))
	var out []*placement.Request
	for i := 0; i < n; i++ {
		r := &placement.Request{Pod: fmt.Sprintf("p-%d", i), CPUMilli: int64(1000 * (1 + rng.IntN(12))), MemoryMiB: 1024}
		switch k := rng.IntN(10); {
		case k < 5:
			pct := []int{81, 47, 65, 32, 23, 16}[rng.IntN(6)]
			r.Containers = []placement.Container{{Name: "main", GPUs: 1, MemoryPercent: pct, Cores: pct}}
			if k == 4 {
				r.IncludeModels = []string{"A10"}
			}
		case k < 8:
			r.Containers = []placement.Container{{Name: "main", GPUs: 1 + rng.IntN(2)*rng.IntN(4), MemoryPercent: 100, Cores: 100}}
		case k < 9:
			r.Containers = []placement.Container{{Name: "main", GPUs: 1, MemoryPercent: 20, Cores: 20},
				{Name: "side", GPUs: 1, MemoryPercent: 10, Cores: 10}}
		}
		out = append(out, r)
	}
	return out
}

// ScoreAll fits and scores pod cr on every node of c under pol in the
// given node order, with workers goroutines; it returns the scores (NaN
// where the pod does not fit) and the charges of each placement.
func ScoreAll(c *placement.Cluster, cr *placement.Compiled, pol placement.Policy, order []int, workers int) ([]float64, [][api.MaxGPUsPerNode]placement.Usage) {
	nodes := c.Nodes()
	scores := make([]float64, len(nodes))
	charges := make([][api.MaxGPUsPerNode]placement.Usage, len(nodes))
	ranker := placement.RankerFor(cr, pol)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s placement.Scratch
			var p placement.Placement
			for k := w; k < len(order); k += workers {
				i := order[k]
				n := nodes[i]
				if r := cr.Fit(n, ranker, &s, &p); !r.OK() {
					scores[i] = math.NaN()
					continue
				}
				scores[i] = pol.ScoreNode(cr, &p)
				for g := range n.GPUs {
					charges[i][g] = p.Charge(g)
				}
			}
		}()
	}
	wg.Wait()
	return scores, charges
}

// ConcurrentScoringMatchesSerial checks that the policy newPolicy makes
// (a fresh instance for a cluster and seed) scores without a policy-wide
// lock: many goroutines fit and score the nodes (each node by several at
// once, through the prepared per-pod scorer and through the policy
// itself) while the next pod is observed, and every score and GPU choice
// equals the serial run's, pod after pod, as the policy learns the
// workload online and the cluster fills. Run with -race.
func ConcurrentScoringMatchesSerial(t *testing.T, newPolicy func(c *placement.Cluster, seed int64) placement.Policy) {
	t.Helper()
	serialC, concC := Cluster(t, 48, 7), Cluster(t, 48, 7)
	serialP, concP := newPolicy(serialC, 3), newPolicy(concC, 3)
	pods := Pods(160, 11)
	rng := rand.New(rand.NewPCG(5, 5))
	compile := func(c *placement.Cluster, r *placement.Request) *placement.Compiled {
		cr, err := c.Compile(r)
		if err != nil {
			t.Fatal(err)
		}
		return cr
	}
	observe := func(p placement.Policy, cr *placement.Compiled) {
		if o, ok := p.(placement.Observer); ok {
			o.Observe(cr)
		}
	}
	identity := make([]int, len(serialC.Nodes()))
	for i := range identity {
		identity[i] = i
	}
	nextC := compile(concC, pods[0])
	observe(concP, nextC)
	for k, req := range pods {
		sCR := compile(serialC, req)
		observe(serialP, sCR)
		want, wantCh := ScoreAll(serialC, sCR, placement.Prepare(sCR, serialP), identity, 1)

		cCR := nextC
		prepared := placement.Prepare(cCR, concP)
		order := rng.Perm(len(identity))
		// Several goroutines over the nodes in a shuffled order,
		// twice (so nodes are scored by several at once), while
		// the next pod is observed.
		var got [2][]float64
		var gotCh [2][][api.MaxGPUsPerNode]placement.Usage
		var wg sync.WaitGroup
		for j := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[j], gotCh[j] = ScoreAll(concC, cCR, prepared, order, 4)
			}()
		}
		if k+1 < len(pods) {
			nextC = compile(concC, pods[k+1])
			observe(concP, nextC)
		}
		wg.Wait()
		for j := range got {
			compareScores(t, k, "prepared", want, got[j], wantCh, gotCh[j])
		}
		// The policy scored directly (no Prepare), concurrently,
		// between two Observe calls as in the scheduler.
		if k+1 < len(pods) {
			direct, directCh := ScoreAll(serialC, sCR, serialP, order, 4)
			compareScores(t, k, "unprepared", want, direct, wantCh, directCh)
		}
		// Place the pod on the first best node in both clusters.
		best := -1
		for i, s := range want {
			if !math.IsNaN(s) && (best < 0 || s > want[best]) {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		// (The concurrent side has observed the next pod already:
		// the pod is placed with what was prepared for it.)
		for _, side := range []struct {
			c   *placement.Cluster
			cr  *placement.Compiled
			pol placement.Policy
		}{{serialC, sCR, placement.Prepare(sCR, serialP)}, {concC, cCR, prepared}} {
			var s placement.Scratch
			var p placement.Placement
			if r := side.cr.Fit(side.c.Nodes()[best], placement.RankerFor(side.cr, side.pol), &s, &p); !r.OK() {
				t.Fatalf("pod %d: best node no longer fits: %v", k, r)
			}
			if _, err := side.c.Assign(side.cr, &p); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func compareScores(t *testing.T, k int, how string, want, got []float64, wantCh, gotCh [][api.MaxGPUsPerNode]placement.Usage) {
	t.Helper()
	for i := range want {
		if math.Float64bits(want[i]) != math.Float64bits(got[i]) && !(math.IsNaN(want[i]) && math.IsNaN(got[i])) {
			t.Fatalf("pod %d, node %d (%s): score %v, serial %v", k, i, how, got[i], want[i])
		}
		if wantCh[i] != gotCh[i] {
			t.Fatalf("pod %d, node %d (%s): GPUs %v, serial %v", k, i, how, gotCh[i][:8], wantCh[i][:8])
		}
	}
}
