package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// quarter asks a quarter of a 40 GB GPU's memory and cores.
func quarter(name string) *Request { return pod(name, share("c", 10240, 25)) }

// fullOfQuarters is a cluster of one node with gpus 40 GB GPUs, each
// holding four quarter shares q<gpu>-<k>, placed GPU by GPU.
func fullOfQuarters(t *testing.T, gpus int) *Cluster {
	t.Helper()
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", inventory(gpus, "A100", 40960, 10)))
	for g := range gpus {
		for k := range 4 {
			place(t, c, quarter(fmt.Sprintf("q%d-%d", g, k)))
		}
	}
	return c
}

// evictables lists the pods on node n, in name order, at priority 0.
func evictables(c *Cluster, n string) []Evictable {
	var ev []Evictable
	for _, k := range c.PodsOn(n) {
		ev = append(ev, Evictable{Pod: k})
	}
	return ev
}

// victimsOf runs Victims for r on node n and returns the victims' names
// and the GPU the request gets.
func victimsOf(t *testing.T, c *Cluster, n string, r *Request, ev []Evictable) ([]string, string, Eviction) {
	t.Helper()
	cr := mustCompile(t, c, r)
	v := c.View(n)
	var s Scratch
	var p Placement
	e, ok := cr.Victims(v, ev, nil, &s, &p)
	if !ok {
		t.Fatalf("%s does not fit %s even with every pod gone", r.Pod, n)
	}
	var names []string
	for _, i := range e.Victims {
		names = append(names, ev[i].Pod)
	}
	if r := cr.Fit(v.Node, nil, &s, &p); !r.OK() {
		t.Fatalf("with the victims gone the request does not fit: %v", r)
	}
	if err := c.Check(); err != nil {
		t.Fatalf("the search changed the cluster: %v", err)
	}
	return names, v.Node.GPUs[p.Grants(0)[0].GPU].UUID, e
}

// TestVictimsOneGPU: a node full of quarter shares; a half share evicts
// exactly two of them, both on one GPU, not one on each of two GPUs.
func TestVictimsOneGPU(t *testing.T) {
	c := fullOfQuarters(t, 4)
	names, gpu, e := victimsOf(t, c, "n", pod("half", share("c", 20480, 50)), evictables(c, "n"))
	if len(names) != 2 {
		t.Fatalf("victims %v, want two", names)
	}
	a, b := c.Allocation(names[0]).Containers[0].Devices[0].UUID, c.Allocation(names[1]).Containers[0].Devices[0].UUID
	if a != b || a != gpu {
		t.Errorf("victims %v on GPUs %s and %s, the pod on %s: want one GPU", names, a, b, gpu)
	}
	if e.Cost.Count != 2 || e.Cost.Protected != 0 || e.Cost.MaxPriority != 0 {
		t.Errorf("cost %+v", e.Cost)
	}
	// The node is full for the pod without preemption.
	if r := fitOn(t, c, c.Node("n"), pod("half", share("c", 20480, 50))); r.OK() {
		t.Fatal("the node fits the half share without preemption")
	}
	// A view the caller took every evictable pod off already (kube-
	// scheduler's dry run does so first) gives the same victims, and
	// the others back on.
	v := c.View("n")
	ev := evictables(c, "n")
	for _, x := range ev {
		v.Remove(x.Pod)
	}
	cr := mustCompile(t, c, pod("half", share("c", 20480, 50)))
	var s Scratch
	var p Placement
	again, ok := cr.Victims(v, ev, nil, &s, &p)
	if !ok || len(again.Victims) != 2 || ev[again.Victims[0]].Pod != names[0] || ev[again.Victims[1]].Pod != names[1] {
		t.Errorf("from a view without the pods: %+v %v, want %v", again, ok, names)
	}
	if held := len(v.ClusterPods()); held != len(ev)-2 {
		t.Errorf("the view holds %d pods, want %d", held, len(ev)-2)
	}
}

// TestVictimsLowestPriority: the victims are the lowest-priority pods
// that make room, wherever they are; protected pods (PodDisruptionBudget)
// are kept while others can go.
func TestVictimsLowestPriority(t *testing.T) {
	c := fullOfQuarters(t, 2)
	prio := map[string]int32{"q0-0": 5, "q0-1": 5, "q0-2": 5, "q0-3": 5, "q1-0": 1, "q1-1": 10, "q1-2": 1, "q1-3": 10}
	var ev []Evictable
	for _, k := range c.PodsOn("n") {
		ev = append(ev, Evictable{Pod: k, Priority: prio[k]})
	}
	half := pod("half", share("c", 20480, 50))
	// GPU 1's two priority-1 pods (highest victim priority 1) beat two
	// of GPU 0's priority-5 pods, and any pair with a priority-10 pod.
	names, _, e := victimsOf(t, c, "n", half, ev)
	if !slices.Equal(names, []string{"q1-0", "q1-2"}) || e.Cost.MaxPriority != 1 {
		t.Errorf("victims %v cost %+v, want [q1-0 q1-2]", names, e.Cost)
	}
	// With those two protected, two of GPU 0's priority-5 pods go rather
	// than a protected pod or a priority-10 one.
	for i := range ev {
		ev[i].Protected = ev[i].Pod == "q1-0" || ev[i].Pod == "q1-2"
	}
	names, _, e = victimsOf(t, c, "n", half, ev)
	if e.Cost.Protected != 0 || e.Cost.MaxPriority != 5 || len(names) != 2 || names[0][:2] != "q0" || names[1][:2] != "q0" {
		t.Errorf("with q1-0, q1-2 protected: victims %v cost %+v, want two of GPU 0's", names, e.Cost)
	}
}

// TestVictimsFewest: one half share beats two quarter shares, whatever
// their order of importance (kube-scheduler's greedy reprieve, which
// gives the more important pods back first, would evict the two quarters
// when the half share is the most important pod).
func TestVictimsFewest(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", inventory(1, "A100", 40960, 10)))
	place(t, c, pod("old-half", share("c", 20480, 50)))
	place(t, c, quarter("q1"))
	place(t, c, quarter("q2"))
	ev := []Evictable{{Pod: "old-half"}, {Pod: "q1"}, {Pod: "q2"}} // old-half most important
	names, _, _ := victimsOf(t, c, "n", pod("half", share("c", 20480, 50)), ev)
	if !slices.Equal(names, []string{"old-half"}) {
		t.Errorf("victims %v, want [old-half]", names)
	}
}

// TestVictimsNone: a request that does not fit even on an empty node
// gets no victims and leaves the view as it was.
func TestVictimsNone(t *testing.T) {
	c := fullOfQuarters(t, 1)
	cr := mustCompile(t, c, pod("huge", share("c", 50000, 50)))
	v := c.View("n")
	before := v.Node.GPUs[0].Used
	var s Scratch
	var p Placement
	if _, ok := cr.Victims(v, evictables(c, "n"), nil, &s, &p); ok {
		t.Fatal("a request larger than the GPU got victims")
	}
	if v.Node.GPUs[0].Used != before {
		t.Errorf("view changed: %+v, was %+v", v.Node.GPUs[0].Used, before)
	}
}

// TestVictimsStaticMIG: a mig-1g.5gb pod evicts the holder of one 1g.5gb
// device, not the holder of another profile's device.
func TestVictimsStaticMIG(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", migInventory(1, api.SharingMIG, api.MIGStrategyMixed, "1g.5gb@0", "1g.5gb@1", "2g.10gb@2", "3g.20gb@4")))
	for _, p := range []struct{ name, profile string }{{"a", "3g.20gb"}, {"b", "2g.10gb"}, {"c", "1g.5gb"}, {"d", "1g.5gb"}} {
		place(t, c, migPod(p.name, p.profile))
	}
	ev := []Evictable{{Pod: "a"}, {Pod: "b"}, {Pod: "c"}, {Pod: "d", Priority: 3}}
	names, _, _ := victimsOf(t, c, "n", migPod("new", "1g.5gb"), ev)
	if !slices.Equal(names, []string{"c"}) {
		t.Errorf("victims %v, want [c] (the lower-priority 1g.5gb holder)", names)
	}
}

// TestVictimsDynamicMIG: seven 1g.5gb instances fill an A100; a 3g.20gb
// pod needs the memory slices of one of the profile's two placements:
// start 4 (slices 4–7) frees with three evictions, start 0 with four.
func TestVictimsDynamicMIG(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", migInventory(1, api.SharingMIGDynamic, "")))
	var ev []Evictable
	for i := range 7 {
		name := fmt.Sprintf("m%d", i)
		place(t, c, migPod(name, "1g.5gb"))
		ev = append(ev, Evictable{Pod: name})
	}
	// The node agent creates the instances and lists them in the
	// inventory: they stay there until it destroys them, after their pods
	// are gone; the search counts a victim's instance free all the same.
	c.UpsertNode(mustNode(t, "n", migInventory(1, api.SharingMIGDynamic, "", "1g.5gb@0", "1g.5gb@1", "1g.5gb@2", "1g.5gb@3", "1g.5gb@4", "1g.5gb@5", "1g.5gb@6")))
	if r := fitOn(t, c, c.Node("n"), migPod("big", "3g.20gb")); r.OK() {
		t.Fatal("3g.20gb fits a GPU full of 1g.5gb instances")
	}
	names, _, e := victimsOf(t, c, "n", migPod("big", "3g.20gb"), ev)
	if len(names) != 3 {
		t.Fatalf("victims %v, want three", names)
	}
	for _, n := range names {
		if s := c.Allocation(n).Containers[0].Devices[0].MIG.Start; s < 4 {
			t.Errorf("victim %s at start %d, want the instances at 4, 5, 6", n, s)
		}
	}
	if e.Cost.Count != 3 {
		t.Errorf("cost %+v", e.Cost)
	}
}

// TestNodeViewRoundTrip: taking pods off a view and putting them back,
// and putting a pod on and taking it off, leaves the view's usage equal
// to the cluster's, and never changes the cluster.
func TestNodeViewRoundTrip(t *testing.T) {
	c := fullOfQuarters(t, 2)
	n := c.Node("n")
	v := c.View("n")
	if !v.Remove("q0-1") || v.Remove("q0-1") || v.Holds("q0-1") {
		t.Fatal("Remove twice, or Holds after Remove")
	}
	if v.Node.GPUs[0].Used == n.GPUs[0].Used {
		t.Fatal("Remove did not free the share on the view")
	}
	cl := v.Clone()
	if !v.Add("q0-1") || v.Add("q0-1") {
		t.Fatal("Add twice")
	}
	if v.Node.GPUs[0].Used != n.GPUs[0].Used {
		t.Errorf("after Remove and Add: %+v, cluster %+v", v.Node.GPUs[0].Used, n.GPUs[0].Used)
	}
	if cl.Holds("q0-1") {
		t.Error("the clone follows the original")
	}
	rec := &api.PodAllocation{Node: "n", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: n.GPUs[1].UUID, MemoryMiB: 1, Cores: 1}}}}}
	if err := cl.Put("q0-0", 0, 0, rec); err == nil {
		t.Error("Put of a pod the view holds")
	}
	if err := cl.Put("nominated", 100, 10, rec); err != nil {
		t.Fatal(err)
	}
	if cl.Node.GPUs[1].Used.Shares != n.GPUs[1].Used.Shares+1 || cl.Node.CPUUsed != n.CPUUsed+100 {
		t.Errorf("Put: %+v cpu %d", cl.Node.GPUs[1].Used, cl.Node.CPUUsed)
	}
	bad := &api.PodAllocation{Node: "n", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: "GPU-nope"}}}}}
	if err := cl.Put("other", 0, 0, bad); err == nil {
		t.Error("Put of a record naming a GPU the node lacks")
	}
	if !cl.Remove("nominated") || !cl.Add("q0-1") {
		t.Fatal("Remove of a pod put on, or Add back")
	}
	for i := range n.GPUs {
		if cl.Node.GPUs[i].Used != n.GPUs[i].Used {
			t.Errorf("GPU %d: %+v, cluster %+v", i, cl.Node.GPUs[i].Used, n.GPUs[i].Used)
		}
	}
	if cl.Node.CPUUsed != n.CPUUsed || cl.Node.MemUsed != n.MemUsed {
		t.Errorf("CPU/memory %d/%d, cluster %d/%d", cl.Node.CPUUsed, cl.Node.MemUsed, n.CPUUsed, n.MemUsed)
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestVictimsOptimal compares Victims with a search of every subset, on
// random nodes of share pods of random priorities and a one-GPU request
// (CPU and memory unlimited): where the cheapest set protects every
// PodDisruptionBudget, Victims finds a set of that cost.
func TestVictimsOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := range 300 {
		c := NewCluster()
		c.UpsertNode(mustNode(t, "n", inventory(1+rng.IntN(3), "A100", 40960, 6)))
		var ev []Evictable
		for k := range 3 + rng.IntN(8) {
			r := pod(fmt.Sprintf("p%d", k), share("c", int64(2048*(1+rng.IntN(8))), 5*(1+rng.IntN(10))))
			cr := mustCompile(t, c, r)
			var s Scratch
			var p Placement
			if !cr.Fit(c.Node("n"), nil, &s, &p).OK() {
				continue
			}
			if _, err := c.Assign(cr, &p); err != nil {
				t.Fatal(err)
			}
			ev = append(ev, Evictable{Pod: r.Pod, Priority: int32(rng.IntN(3)), Protected: rng.IntN(5) == 0})
		}
		req := pod("new", share("c", int64(4096*(1+rng.IntN(9))), 10*(1+rng.IntN(9))))
		cr := mustCompile(t, c, req)
		best, ok := bruteForce(t, c, cr, ev)
		v := c.View("n")
		var s Scratch
		var p Placement
		got, gotOK := cr.Victims(v, ev, nil, &s, &p)
		if ok != gotOK {
			t.Fatalf("iteration %d: brute force fits %v, Victims %v", iter, ok, gotOK)
		}
		if !ok {
			continue
		}
		if !cr.Fit(v.Node, nil, &s, &p).OK() {
			t.Fatalf("iteration %d: victims %v do not make room", iter, got.Victims)
		}
		if best.Protected == 0 && best != got.Cost {
			t.Errorf("iteration %d: victims %v cost %+v, the cheapest costs %+v", iter, got.Victims, got.Cost, best)
		}
	}
}

// bruteForce is the cheapest cost of any subset of ev whose eviction
// makes room for cr.
func bruteForce(t *testing.T, c *Cluster, cr *Compiled, ev []Evictable) (VictimCost, bool) {
	t.Helper()
	var best VictimCost
	found := false
	var s Scratch
	var p Placement
	for set := range 1 << len(ev) {
		v := c.View("n")
		cost := VictimCost{MaxPriority: math.MinInt64}
		for i, e := range ev {
			if set&(1<<i) == 0 {
				continue
			}
			v.Remove(e.Pod)
			cost.Count++
			cost.MaxPriority = max(cost.MaxPriority, int64(e.Priority))
			cost.SumPriority += int64(e.Priority) + math.MaxInt32 + 1
			if e.Protected {
				cost.Protected++
			}
		}
		if cr.Fit(v.Node, nil, &s, &p).OK() && (!found || cost.Less(best)) {
			best, found = cost, true
		}
	}
	return best, found
}

// BenchmarkVictims: the victim search on a node of 8 GPUs full of
// quarter shares, for a half share.
func BenchmarkVictims(b *testing.B) {
	c := NewCluster()
	n, _ := NewNode("n", 64000, 256*1024, inventory(8, "A100", 40960, 10))
	c.UpsertNode(n)
	for g := range 8 {
		for k := range 4 {
			cr, _ := c.Compile(quarter(fmt.Sprintf("q%d-%d", g, k)))
			var s Scratch
			var p Placement
			cr.Fit(c.Node("n"), nil, &s, &p)
			if _, err := c.Assign(cr, &p); err != nil {
				b.Fatal(err)
			}
		}
	}
	ev := evictables(c, "n")
	cr, _ := c.Compile(pod("half", share("c", 20480, 50)))
	var s Scratch
	var p Placement
	b.ReportAllocs()
	for b.Loop() {
		v := c.View("n")
		if _, ok := cr.Victims(v, ev, nil, &s, &p); !ok {
			b.Fatal("no victims")
		}
	}
}
