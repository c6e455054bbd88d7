package placement

import (
	"fmt"
	"math/rand"
	"reflect"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

var propModels = []string{"NVIDIA A100-SXM4-40GB", "NVIDIA A10", "NVIDIA T4", "NVIDIA H100 80GB HBM3"}
var propSelectors = []string{"A100", "A10", "T4", "H100", "V100"}
var propMemory = []int64{15360, 24576, 40960, 81920}

func randomCluster(rng *rand.Rand) *Cluster {
	c := NewCluster()
	for ni, nodes := 0, 1+rng.Intn(6); ni < nodes; ni++ {
		count := rng.Intn(9)
		m := rng.Intn(len(propModels))
		inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind,
			MemoryOvercommit: []float64{1, 1, 1.5, 2}[rng.Intn(4)]}
		for i := 0; i < count; i++ {
			g := api.GPU{
				UUID: fmt.Sprintf("GPU-%d-%d", ni, i), Index: i, Model: propModels[m], MemoryMiB: propMemory[m],
				NUMANode: rng.Intn(2), Health: api.Healthy, Sharing: api.SharingShared, MaxShares: 1 + rng.Intn(10),
			}
			if rng.Intn(10) == 0 {
				g.Health = api.Unhealthy
			}
			if rng.Intn(10) == 0 {
				g.Sharing, g.MaxShares = api.SharingExclusive, 1
			}
			inv.GPUs = append(inv.GPUs, g)
		}
		for i := range inv.GPUs {
			for j := range inv.GPUs {
				if i != j && rng.Intn(3) == 0 {
					inv.GPUs[i].Links = append(inv.GPUs[i].Links, api.Link{PeerUUID: inv.GPUs[j].UUID, Type: api.LinkNVLink, NVLinks: 1 + rng.Intn(12)})
				}
			}
		}
		n, err := NewNode(fmt.Sprintf("node-%d", ni), int64(8000+rng.Intn(64000)), int64(16384+rng.Intn(262144)), inv)
		if err != nil {
			panic(err)
		}
		c.UpsertNode(n)
	}
	return c
}

func randomContainer(rng *rand.Rand, name string) Container {
	c := Container{Name: name, GPUs: rng.Intn(4)}
	if c.GPUs == 0 {
		return c
	}
	switch rng.Intn(4) {
	case 0: // whole GPUs
	case 1:
		c.MemoryPercent = 1 + rng.Intn(100)
		c.Cores = rng.Intn(101)
	default:
		c.MemoryMiB = int64(1 + rng.Intn(45000))
		c.Cores = rng.Intn(101)
	}
	return c
}

func randomRequest(rng *rand.Rand, c *Cluster, id int) *Request {
	r := &Request{Pod: fmt.Sprintf("ns/pod-%d", id), CPUMilli: int64(rng.Intn(8000)), MemoryMiB: int64(rng.Intn(32768))}
	for i, n := 0, rng.Intn(3); i < n; i++ {
		r.InitContainers = append(r.InitContainers, randomContainer(rng, fmt.Sprintf("init-%d", i)))
	}
	for i, n := 0, 1+rng.Intn(3); i < n; i++ {
		r.Containers = append(r.Containers, randomContainer(rng, fmt.Sprintf("c-%d", i)))
	}
	switch rng.Intn(6) {
	case 0:
		r.IncludeModels = []string{propSelectors[rng.Intn(len(propSelectors))]}
	case 1:
		r.ExcludeModels = []string{propSelectors[rng.Intn(len(propSelectors))]}
	}
	if rng.Intn(8) == 0 && len(c.nodes) > 0 {
		n := c.nodes[rng.Intn(len(c.nodes))]
		if len(n.GPUs) > 0 {
			u := n.GPUs[rng.Intn(len(n.GPUs))].UUID
			if rng.Intn(2) == 0 {
				r.IncludeUUIDs = []string{u}
			} else {
				r.ExcludeUUIDs = []string{u}
			}
		}
	}
	r.NUMABind = rng.Intn(5) == 0
	r.GPUPolicy = []api.GPUPolicy{"", api.GPUBinpack, api.GPUSpread, api.GPUTopologyAware}[rng.Intn(4)]
	r.NodePolicy = []api.NodePolicy{"", api.NodeBinpack, api.NodeSpread}[rng.Intn(3)]
	return r
}

type nodeSnapshot struct {
	CPU, Mem int64
	Used     []Usage
}

func snapshot(c *Cluster) map[string]nodeSnapshot {
	out := map[string]nodeSnapshot{}
	for _, n := range c.nodes {
		s := nodeSnapshot{CPU: n.CPUUsed, Mem: n.MemUsed}
		for i := range n.GPUs {
			s.Used = append(s.Used, n.GPUs[i].Used)
		}
		out[n.Name] = s
	}
	return out
}

// verifyPlacement checks a record against its request independently of the
// fit code: every constraint the request states holds.
func verifyPlacement(c *Cluster, r *Request, rec *api.PodAllocation) error {
	n := c.Node(rec.Node)
	if n == nil {
		return fmt.Errorf("record names unknown node %s", rec.Node)
	}
	type key struct {
		init bool
		name string
	}
	want := map[key]Container{}
	for _, ct := range r.InitContainers {
		if ct.GPUs > 0 {
			want[key{true, ct.Name}] = ct
		}
	}
	for _, ct := range r.Containers {
		if ct.GPUs > 0 {
			want[key{false, ct.Name}] = ct
		}
	}
	if len(rec.Containers) != len(want) {
		return fmt.Errorf("record has %d GPU containers, request %d", len(rec.Containers), len(want))
	}
	for _, ca := range rec.Containers {
		ct, ok := want[key{ca.Init, ca.Name}]
		if !ok {
			return fmt.Errorf("record container %q (init %v) not in request", ca.Name, ca.Init)
		}
		if len(ca.Devices) != ct.GPUs {
			return fmt.Errorf("container %s: %d devices, want %d", ca.Name, len(ca.Devices), ct.GPUs)
		}
		seen := map[string]bool{}
		numa := -2
		for _, d := range ca.Devices {
			if seen[d.UUID] {
				return fmt.Errorf("container %s: GPU %s twice", ca.Name, d.UUID)
			}
			seen[d.UUID] = true
			i := n.GPUByUUID(d.UUID)
			if i < 0 {
				return fmt.Errorf("container %s: GPU %s not on node", ca.Name, d.UUID)
			}
			g := &n.GPUs[i]
			if !g.Healthy {
				return fmt.Errorf("container %s: unhealthy GPU %s", ca.Name, d.UUID)
			}
			for _, x := range r.ExcludeModels {
				if api.ModelMatches(x, g.Model) {
					return fmt.Errorf("container %s: model %s excluded by %s", ca.Name, g.Model, x)
				}
			}
			if len(r.IncludeModels) > 0 && !api.ModelMatches(r.IncludeModels[0], g.Model) {
				return fmt.Errorf("container %s: model %s not included", ca.Name, g.Model)
			}
			if len(r.IncludeUUIDs) > 0 && d.UUID != r.IncludeUUIDs[0] || len(r.ExcludeUUIDs) > 0 && d.UUID == r.ExcludeUUIDs[0] {
				return fmt.Errorf("container %s: GPU %s against UUID selection", ca.Name, d.UUID)
			}
			if r.NUMABind {
				if numa != -2 && g.NUMANode != numa {
					return fmt.Errorf("container %s: GPUs on NUMA %d and %d", ca.Name, numa, g.NUMANode)
				}
				numa = g.NUMANode
			}
			wantMem := ct.MemoryMiB
			if wantMem == 0 {
				wantMem = g.MemoryMiB
				if ct.MemoryPercent > 0 {
					wantMem = g.MemoryMiB * int64(ct.MemoryPercent) / 100
				}
			}
			wantCores := ct.Cores
			if ct.Exclusive() {
				wantCores = 100
			}
			if d.MemoryMiB != wantMem || d.Cores != wantCores || d.Exclusive != ct.Exclusive() {
				return fmt.Errorf("container %s on %s: grant %+v, want %d MiB, %d%%, exclusive %v", ca.Name, d.UUID, d, wantMem, wantCores, ct.Exclusive())
			}
			if !ct.Exclusive() && g.Sharing == api.SharingExclusive {
				return fmt.Errorf("container %s: share on exclusive-mode GPU %s", ca.Name, d.UUID)
			}
		}
	}
	return nil
}

// oracleFits decides by brute force whether a pod with one app container
// and no init containers fits node n: count GPUs that could each take one
// share, within one NUMA node if asked.
func oracleFits(n *Node, r *Request) bool {
	if r.CPUMilli > n.FreeCPU() || r.MemoryMiB > n.FreeMem() {
		return false
	}
	ct := r.Containers[0]
	if ct.GPUs == 0 {
		return true
	}
	perNUMA := map[int]int{}
	total := 0
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.Healthy || g.Used.Exclusive > 0 {
			continue
		}
		if modelVerdict(g.Model, r.IncludeModels, r.ExcludeModels) != modelAllowed {
			continue
		}
		if len(r.IncludeUUIDs) > 0 && g.UUID != r.IncludeUUIDs[0] || len(r.ExcludeUUIDs) > 0 && g.UUID == r.ExcludeUUIDs[0] {
			continue
		}
		ok := false
		if ct.Exclusive() {
			ok = g.Used.Shares == 0
		} else if g.Sharing != api.SharingExclusive {
			mem := ct.memoryOn(g)
			ok = mem <= g.MemoryMiB && g.Used.MemoryMiB+mem <= g.MemoryCap && g.Used.Cores+ct.Cores <= 100 && g.Used.Shares+1 <= g.MaxShares
		}
		if ok {
			total++
			perNUMA[g.NUMANode]++
		}
	}
	if !r.NUMABind {
		return total >= ct.GPUs
	}
	for _, k := range perNUMA {
		if k >= ct.GPUs {
			return true
		}
	}
	return false
}

func TestPropertyRandomClustersAndStreams(t *testing.T) {
	iterations := 300
	if testing.Short() {
		iterations = 40
	}
	placed, failed, released := 0, 0, 0
	for it := 0; it < iterations; it++ {
		seed := int64(it)
		rng := rand.New(rand.NewSource(seed))
		c := randomCluster(rng)
		sr := NewSearch(c)
		var live []*Request
		for op := 0; op < 60; op++ {
			if len(live) > 0 && rng.Intn(4) == 0 {
				k := rng.Intn(len(live))
				before := c.Allocation(live[k].Pod)
				if !c.Release(live[k].Pod) || c.Allocation(live[k].Pod) != nil || before == nil {
					t.Fatalf("seed %d: release of %s failed", seed, live[k].Pod)
				}
				live = append(live[:k], live[k+1:]...)
				released++
				if err := c.Check(); err != nil {
					t.Fatalf("seed %d after release: %v", seed, err)
				}
				continue
			}
			r := randomRequest(rng, c, op)
			cr, err := c.Compile(r)
			if err != nil {
				continue // invalid random request (e.g. model both in and out)
			}
			def := []Policy{Binpack{}, Spread{}}[rng.Intn(2)]
			p := sr.Best(cr, def)
			simple := len(r.InitContainers) == 0 && len(r.Containers) == 1
			if p == nil {
				failed++
				if simple {
					for _, n := range c.nodes {
						if oracleFits(n, r) {
							t.Fatalf("seed %d op %d: pod %+v fits node %s by brute force but the core found no node: %s", seed, op, r, n.Name, sr.Explain())
						}
					}
				}
				continue
			}
			before := snapshot(c)
			var charge [api.MaxGPUsPerNode]Usage
			for i := range p.Node.GPUs {
				charge[i] = p.Charge(i)
			}
			rec, err := c.Assign(cr, p)
			if err != nil {
				t.Fatalf("seed %d: assign: %v", seed, err)
			}
			// The charge scoring saw is exactly what the record charges.
			n := c.Node(rec.Node)
			for i := range n.GPUs {
				got := n.GPUs[i].Used
				got.sub(before[n.Name].Used[i])
				if got != charge[i] {
					t.Fatalf("seed %d op %d: GPU %s: placement charge %+v, record charged %+v", seed, op, n.GPUs[i].UUID, charge[i], got)
				}
			}
			if err := verifyPlacement(c, r, rec); err != nil {
				t.Fatalf("seed %d op %d: placement breaks its request: %v\nrequest %+v\nrecord %+v", seed, op, err, r, rec)
			}
			if err := c.Check(); err != nil {
				t.Fatalf("seed %d op %d: invariants: %v\nrequest %+v\nrecord %+v", seed, op, err, r, rec)
			}
			// Add-then-remove restores the state bit for bit.
			if rng.Intn(3) == 0 {
				c.Release(r.Pod)
				if after := snapshot(c); !reflect.DeepEqual(before, after) {
					t.Fatalf("seed %d op %d: release did not restore the state\nbefore %+v\nafter  %+v", seed, op, before, after)
				}
				if err := c.AssignRecord(r.Pod, r.CPUMilli, r.MemoryMiB, rec); err != nil {
					t.Fatalf("seed %d: re-assign: %v", seed, err)
				}
			}
			placed++
			live = append(live, r)
		}
		// The per-node index agrees with the records.
		for _, n := range c.nodes {
			for _, k := range c.PodsOn(n.Name) {
				if rec := c.Allocation(k); rec == nil || rec.Node != n.Name {
					t.Fatalf("seed %d: PodsOn(%s) lists %s, whose record says %+v", seed, n.Name, k, rec)
				}
			}
		}
		indexed := 0
		for _, n := range c.nodes {
			indexed += len(c.PodsOn(n.Name))
		}
		if indexed != c.PodCount() {
			t.Fatalf("seed %d: %d pods indexed by node, %d held", seed, indexed, c.PodCount())
		}
		// Rebuilding from the records alone (a scheduler restart) gives the same state.
		rebuilt := NewCluster()
		for _, n := range c.nodes {
			rebuilt.UpsertNode(n.Clone())
		}
		for _, r := range live {
			if err := rebuilt.AssignRecord(r.Pod, r.CPUMilli, r.MemoryMiB, c.Allocation(r.Pod)); err != nil {
				t.Fatal(err)
			}
		}
		if !reflect.DeepEqual(snapshot(c), snapshot(rebuilt)) {
			t.Fatalf("seed %d: state rebuilt from records differs", seed)
		}
		for _, r := range live {
			c.Release(r.Pod)
		}
		for _, n := range c.nodes {
			for i := range n.GPUs {
				if !n.GPUs[i].Idle() {
					t.Fatalf("seed %d: GPU %s not idle after releasing every pod: %+v", seed, n.GPUs[i].UUID, n.GPUs[i].Used)
				}
			}
			if n.CPUUsed != 0 || n.MemUsed != 0 {
				t.Fatalf("seed %d: node %s CPU/memory not released", seed, n.Name)
			}
		}
	}
	if placed < iterations*5 || failed == 0 || released == 0 {
		t.Fatalf("the random streams exercised too little: placed %d, failed %d, released %d", placed, failed, released)
	}
	t.Logf("placed %d, failed %d, released %d", placed, failed, released)
}
