package placement

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// bigCluster builds nodes × 8 GPUs (a mix of A100 and H100 nodes, NVLinked
// in pairs) holding allocs fractional allocations spread at random.
func bigCluster(tb testing.TB, nodes, allocs int) *Cluster {
	tb.Helper()
	rng := rand.New(rand.NewSource(1))
	c := NewCluster()
	for i := 0; i < nodes; i++ {
		model, mem := "NVIDIA A100-SXM4-40GB", int64(40960)
		if i%4 == 3 {
			model, mem = "NVIDIA H100 80GB HBM3", 81920
		}
		inv := inventory(8, model, mem, 10, [2]int{0, 1}, [2]int{2, 3}, [2]int{4, 5}, [2]int{6, 7})
		for g := range inv.GPUs {
			inv.GPUs[g].UUID = fmt.Sprintf("GPU-%05d-%d", i, g)
		}
		for g := range inv.GPUs {
			for l := range inv.GPUs[g].Links {
				peer := inv.GPUs[g].Links[l].PeerUUID
				inv.GPUs[g].Links[l].PeerUUID = fmt.Sprintf("GPU-%05d-%s", i, peer[len(peer)-1:])
			}
		}
		n, err := NewNode(fmt.Sprintf("node-%05d", i), 128000, 1<<20, inv)
		if err != nil {
			tb.Fatal(err)
		}
		c.UpsertNode(n)
	}
	for k := 0; k < allocs; k++ {
		n := c.nodes[rng.Intn(len(c.nodes))]
		g := &n.GPUs[rng.Intn(len(n.GPUs))]
		mem := g.MemoryMiB / int64(4+rng.Intn(8))
		if g.FreeMemory() < mem || g.FreeCores() < 10 || g.FreeShares() < 1 {
			k--
			continue
		}
		rec := &api.PodAllocation{Node: n.Name, Containers: []api.ContainerAllocation{{Name: "main",
			Devices: []api.DeviceGrant{{UUID: g.UUID, MemoryMiB: mem, Cores: 10}}}}}
		if err := c.AssignRecord(fmt.Sprintf("ns/existing-%d", k), 1000, 1024, rec); err != nil {
			tb.Fatal(err)
		}
	}
	return c
}

// benchRequests are the pod shapes the benchmarks cycle through.
func benchRequests() []*Request {
	return []*Request{
		pod("frac", share("main", 10240, 30)),
		{Pod: "pct", Containers: []Container{{Name: "main", GPUs: 1, MemoryPercent: 25, Cores: 25}}},
		pod("whole", whole("main", 1)),
		{Pod: "multi", Containers: []Container{whole("train", 2)}, GPUPolicy: api.GPUTopologyAware},
		{Pod: "h100", Containers: []Container{share("main", 20000, 50)}, IncludeModels: []string{"H100"}},
		{Pod: "sidecar", Containers: []Container{share("a", 4096, 20), share("b", 2048, 10)}, InitContainers: []Container{share("init", 8192, 20)}},
	}
}

// BenchmarkFitNode is the per-node check kube-scheduler's Filter runs.
func BenchmarkFitNode(b *testing.B) {
	c := bigCluster(b, 64, 256)
	cr := mustCompile(b, c, pod("frac", share("main", 10240, 30)))
	var s Scratch
	var p Placement
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cr.Fit(c.nodes[i%len(c.nodes)], nil, &s, &p)
	}
}

// The per-node fit check must not allocate: Filter runs it for every node
// of the cluster for every pod.
func TestFitAllocatesNothing(t *testing.T) {
	c := bigCluster(t, 16, 64)
	s, p := &Scratch{}, &Placement{}
	for _, r := range benchRequests() {
		cr := mustCompile(t, c, r)
		for _, n := range c.nodes { // grow the buffers once
			cr.Fit(n, nil, s, p)
		}
		allocs := testing.AllocsPerRun(50, func() {
			for _, n := range c.nodes {
				cr.Fit(n, nil, s, p)
			}
		})
		if allocs != 0 {
			t.Errorf("pod %s: %v allocations per run of Fit over %d nodes, want 0", r.Pod, allocs, len(c.nodes))
		}
	}
	// Failing checks build their reasons without allocating too.
	full := mustCompile(t, c, pod("huge", share("main", 80000, 10)))
	excluded := mustCompile(t, c, &Request{Pod: "x", Containers: []Container{share("main", 1, 1)}, IncludeModels: []string{"T4"}})
	for _, cr := range []*Compiled{full, excluded} {
		if allocs := testing.AllocsPerRun(50, func() { cr.Fit(c.nodes[0], nil, s, p) }); allocs != 0 {
			t.Errorf("pod %s: failing fit allocates %v times", cr.Req.Pod, allocs)
		}
	}
}
