package placement

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

func oneNodeCluster(t *testing.T, inv *api.NodeInventory) (*Cluster, *Node) {
	t.Helper()
	c := NewCluster()
	n := mustNode(t, "node-a", inv)
	c.UpsertNode(n)
	return c, n
}

func TestSharesBinpackOntoOneGPUUntilFull(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(2, "A100", 40960, 10))
	for i, want := range []string{"GPU-A100-00", "GPU-A100-00", "GPU-A100-00", "GPU-A100-01"} {
		rec := place(t, c, pod("p"+string(rune('0'+i)), share("main", 12000, 30)))
		if got := rec.Containers[0].Devices[0].UUID; got != want {
			t.Fatalf("pod %d went to %s, want %s (binpack fills the fuller GPU first)", i, got, want)
		}
	}
	if got := n.GPUs[0].Used; got != (Usage{MemoryMiB: 36000, Cores: 90, Shares: 3}) {
		t.Fatalf("GPU 0 usage %+v", got)
	}
	checkInvariants(t, c)
}

func TestGPUSpreadPolicy(t *testing.T) {
	c, _ := oneNodeCluster(t, inventory(3, "A100", 40960, 10))
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		r := pod("p"+string(rune('0'+i)), share("main", 1000, 10))
		r.GPUPolicy = api.GPUSpread
		seen[place(t, c, r).Containers[0].Devices[0].UUID] = true
	}
	if len(seen) != 3 {
		t.Fatalf("spread put 3 pods on %d GPUs, want 3", len(seen))
	}
}

func TestExclusiveGPUExcludesShares(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(2, "A100", 40960, 10))
	place(t, c, pod("small", share("main", 1000, 10)))
	rec := place(t, c, pod("whole", whole("train", 1)))
	d := rec.Containers[0].Devices[0]
	if d.UUID != "GPU-A100-01" || !d.Exclusive || d.Cores != 100 || d.MemoryMiB != 40960 {
		t.Fatalf("whole GPU grant %+v, want the idle GPU 1 exclusively with all memory", d)
	}
	// Both GPUs are now taken for whole-GPU requests, and GPU 1 for shares.
	reason := fitOn(t, c, n, pod("whole2", whole("train", 1)))
	if reason.Kind != ReasonWholeGPUs || reason.Have != 0 || reason.Total != 2 {
		t.Fatalf("reason %+v", reason)
	}
	if got := reason.String(); got != `container "train": needs 1 whole free GPUs, 0 of 2 free` {
		t.Fatalf("message %q", got)
	}
	rec = place(t, c, pod("small2", share("main", 1000, 10)))
	if rec.Containers[0].Devices[0].UUID != "GPU-A100-00" {
		t.Fatalf("share landed on the exclusive GPU: %+v", rec)
	}
	checkInvariants(t, c)
}

func TestCoresHundredIsExclusive(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	rec := place(t, c, pod("p", share("main", 8000, 100)))
	d := rec.Containers[0].Devices[0]
	if !d.Exclusive || d.MemoryMiB != 8000 {
		t.Fatalf("grant %+v: cores 100 must be exclusive with the asked memory limit", d)
	}
	if n.GPUs[0].Used.Exclusive != 1 || n.GPUs[0].FreeMemory() != 0 {
		t.Fatalf("exclusive GPU usage %+v", n.GPUs[0].Used)
	}
}

func TestMultiGPUTopologyAwarePrefersNVLink(t *testing.T) {
	// GPUs 1-2 and 3-4... only 2<->3 are NVLinked.
	c, _ := oneNodeCluster(t, inventory(4, "H100", 81920, 10, [2]int{2, 3}))
	r := pod("p", whole("train", 2))
	r.GPUPolicy = api.GPUTopologyAware
	rec := place(t, c, r)
	got := []string{rec.Containers[0].Devices[0].UUID, rec.Containers[0].Devices[1].UUID}
	if !(got[0] == "GPU-H100-02" && got[1] == "GPU-H100-03" || got[0] == "GPU-H100-03" && got[1] == "GPU-H100-02") {
		t.Fatalf("got %v, want the NVLinked pair 2,3", got)
	}
}

func TestBinpackMultiGPUStillUsesLinksToBreakTies(t *testing.T) {
	c, _ := oneNodeCluster(t, inventory(4, "H100", 81920, 10, [2]int{1, 3}))
	rec := place(t, c, pod("p", whole("train", 2)))
	a, b := rec.Containers[0].Devices[0].UUID, rec.Containers[0].Devices[1].UUID
	if a == b || !(strings.HasSuffix(a, "01") || strings.HasSuffix(a, "03")) || !(strings.HasSuffix(b, "01") || strings.HasSuffix(b, "03")) {
		t.Fatalf("got %s,%s, want the NVLinked pair 1,3", a, b)
	}
}

func TestInitContainersReuseAppShares(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	r := &Request{
		Pod:            "p",
		InitContainers: []Container{share("init", 30000, 50)},
		Containers:     []Container{share("a", 10000, 20), share("b", 10000, 20)},
	}
	rec := place(t, c, r)
	if len(rec.Containers) != 3 || !rec.Containers[0].Init || rec.Containers[0].Name != "init" || rec.Containers[1].Name != "a" {
		t.Fatalf("record %+v: want init first, then app containers in spec order", rec)
	}
	// Charge is max(init 30000/50%, apps 20000/40%), 2 shares (apps).
	if got := n.GPUs[0].Used; got != (Usage{MemoryMiB: 30000, Cores: 50, Shares: 2}) {
		t.Fatalf("usage %+v, want max(init, sum of apps)", got)
	}
	place(t, c, pod("q", share("main", 10960, 50)))
	checkInvariants(t, c)
	c.Release("p")
	c.Release("q")
	if !n.GPUs[0].Idle() {
		t.Fatalf("usage after release %+v", n.GPUs[0].Used)
	}
}

func TestInitContainerLargerThanFreeFails(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	place(t, c, pod("other", share("main", 20000, 10)))
	r := &Request{Pod: "p", InitContainers: []Container{share("init", 30000, 10)}, Containers: []Container{share("a", 1000, 10)}}
	reason := fitOn(t, c, n, r)
	if reason.Kind != ReasonGPUMemory || reason.Container != "init" || reason.Need != 30000 || reason.Have != 20960 {
		t.Fatalf("reason %+v", reason)
	}
}

func TestMaxSharesLimit(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(1, "T4", 15360, 2))
	place(t, c, pod("a", share("main", 100, 1)))
	place(t, c, pod("b", share("main", 100, 1)))
	if reason := fitOn(t, c, n, pod("c", share("main", 100, 1))); reason.Kind != ReasonShares {
		t.Fatalf("reason %v, want shares exhausted", reason)
	}
}

func TestUnhealthyGPUsAreSkipped(t *testing.T) {
	inv := inventory(2, "A100", 40960, 10)
	inv.GPUs[0].Health, inv.GPUs[0].HealthReason = api.Unhealthy, "XID 79"
	c, n := oneNodeCluster(t, inv)
	rec := place(t, c, pod("p", share("main", 1000, 10)))
	if rec.Containers[0].Devices[0].UUID != "GPU-A100-01" {
		t.Fatalf("placed on %s", rec.Containers[0].Devices[0].UUID)
	}
	inv.GPUs[1].Health = api.Unhealthy
	n2 := mustNode(t, "node-a", inv)
	c.UpsertNode(n2)
	if reason := fitOn(t, c, n2, pod("q", share("main", 1000, 10))); reason.Kind != ReasonUnhealthy || reason.String() != "all 2 GPUs unhealthy" {
		t.Fatalf("reason %q", reason)
	}
	_ = n
	// The pod placed before keeps its charge on the replaced node state.
	if n2.GPUs[1].Used.MemoryMiB != 1000 {
		t.Fatalf("charge lost on inventory update: %+v", n2.GPUs[1].Used)
	}
	checkInvariants(t, c)
}

func TestModelSelectors(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "t4", inventory(1, "NVIDIA T4", 15360, 10)))
	c.UpsertNode(mustNode(t, "a100", inventory(1, "NVIDIA A100-SXM4-40GB", 40960, 10)))
	c.UpsertNode(mustNode(t, "a10", inventory(1, "NVIDIA A10", 24576, 10)))

	r := pod("p", share("main", 1000, 10))
	r.IncludeModels = []string{"A100"}
	if rec := place(t, c, r); rec.Node != "a100" {
		t.Fatalf("use-gputype=A100 placed on %s", rec.Node)
	}
	r = pod("q", share("main", 1000, 10))
	r.IncludeModels = []string{"A10"}
	if rec := place(t, c, r); rec.Node != "a10" {
		t.Fatalf("use-gputype=A10 placed on %s (must not match A100)", rec.Node)
	}
	r = pod("r", share("main", 1000, 10))
	r.IncludeModels = []string{"V100"}
	cr := mustCompile(t, c, r)
	sr := NewSearch(c)
	if sr.Best(cr, Binpack{}) != nil {
		t.Fatal("V100 request placed")
	}
	want := "0/3 nodes fit: 1 GPU model NVIDIA A10 not selected by use-gputype=V100, 1 GPU model NVIDIA A100-SXM4-40GB not selected by use-gputype=V100, 1 GPU model NVIDIA T4 not selected by use-gputype=V100"
	if got := sr.Explain(); got != want {
		t.Fatalf("explain:\n got %s\nwant %s", got, want)
	}
	r = pod("s", share("main", 1000, 10))
	r.ExcludeModels = []string{"T4", "A10"}
	if rec := place(t, c, r); rec.Node != "a100" {
		t.Fatalf("nouse-gputype=T4,A10 placed on %s", rec.Node)
	}
}

func TestModelAddedAfterCompileStillFiltered(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "t4", inventory(1, "T4", 15360, 10)))
	r := pod("p", share("main", 1000, 10))
	r.ExcludeModels = []string{"A100"}
	cr := mustCompile(t, c, r)
	n := mustNode(t, "a100", inventory(1, "A100", 40960, 10))
	c.UpsertNode(n)
	var s Scratch
	var p Placement
	if reason := cr.Fit(n, nil, &s, &p); reason.Kind != ReasonModelExcluded {
		t.Fatalf("reason %v", reason)
	}
}

func TestUUIDSelectors(t *testing.T) {
	c, _ := oneNodeCluster(t, inventory(4, "A100", 40960, 10))
	r := pod("p", share("main", 1000, 10))
	r.IncludeUUIDs = []string{"GPU-A100-02"}
	if rec := place(t, c, r); rec.Containers[0].Devices[0].UUID != "GPU-A100-02" {
		t.Fatalf("use-gpuuuid ignored: %+v", rec)
	}
	r = pod("q", share("main", 1000, 10))
	r.ExcludeUUIDs = []string{"GPU-A100-02"}
	if rec := place(t, c, r); rec.Containers[0].Devices[0].UUID == "GPU-A100-02" {
		t.Fatalf("nouse-gpuuuid ignored: %+v", rec)
	}
	r = pod("r", share("main", 1000, 10))
	r.IncludeUUIDs = []string{"GPU-elsewhere"}
	cr := mustCompile(t, c, r)
	sr := NewSearch(c)
	if sr.Best(cr, Binpack{}) != nil || !strings.Contains(sr.Explain(), "1 no GPU allowed by the pod's GPU UUID selection") {
		t.Fatalf("explain %q", sr.Explain())
	}
}

func TestNUMABinding(t *testing.T) {
	// 4 GPUs: 0,1 on NUMA 0 and 2,3 on NUMA 1; GPU 1 is busy.
	c, n := oneNodeCluster(t, inventory(4, "A100", 40960, 10))
	r := pod("busy", whole("main", 1))
	r.IncludeUUIDs = []string{"GPU-A100-01"}
	place(t, c, r)
	r = pod("p", whole("main", 2))
	r.NUMABind = true
	rec := place(t, c, r)
	for _, d := range rec.Containers[0].Devices {
		if i := n.GPUByUUID(d.UUID); n.GPUs[i].NUMANode != 1 {
			t.Fatalf("GPU %s on NUMA %d, want both on NUMA 1", d.UUID, n.GPUs[i].NUMANode)
		}
	}
	r = pod("q", whole("main", 2))
	r.NUMABind = true
	// One free GPU remains (GPU 0): not enough GPUs at all.
	if reason := fitOn(t, c, n, r); reason.Kind != ReasonWholeGPUs {
		t.Fatalf("reason %v", reason)
	}
}

func TestNUMABindingFailsAcrossNodes(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(4, "A100", 40960, 10))
	for _, u := range []string{"GPU-A100-01", "GPU-A100-03"} {
		r := pod("busy-"+u, whole("main", 1))
		r.IncludeUUIDs = []string{u}
		place(t, c, r)
	}
	r := pod("p", whole("main", 2))
	r.NUMABind = true
	reason := fitOn(t, c, n, r)
	if reason.Kind != ReasonNUMA || reason.Have != 1 {
		t.Fatalf("reason %+v, want NUMA with at most 1 GPU per NUMA node", reason)
	}
	r.NUMABind = false
	if reason := fitOn(t, c, n, r); !reason.OK() {
		t.Fatalf("without NUMA binding: %v", reason)
	}
}

func TestMemoryOvercommit(t *testing.T) {
	inv := inventory(1, "A100", 40000, 10)
	inv.MemoryOvercommit = 1.5
	c, n := oneNodeCluster(t, inv)
	place(t, c, pod("a", share("main", 30000, 10)))
	place(t, c, pod("b", share("main", 30000, 10)))
	if n.GPUs[0].FreeMemory() != 0 {
		t.Fatalf("free %d, want 0 of 60000 overcommitted MiB", n.GPUs[0].FreeMemory())
	}
	// A single grant may not exceed the physical memory.
	c2, n2 := oneNodeCluster(t, inv)
	_ = c2
	if reason := fitOn(t, c2, n2, pod("big", share("main", 50000, 10))); reason.Kind != ReasonGPUMemoryPhysical {
		t.Fatalf("reason %v", reason)
	}
}

func TestMemoryPercentOnDifferentGPUs(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "a", inventory(1, "A100", 40960, 10)))
	c.UpsertNode(mustNode(t, "b", inventory(1, "H100", 81920, 10)))
	r := pod("p", Container{Name: "main", GPUs: 1, MemoryPercent: 25, Cores: 25})
	r.IncludeModels = []string{"H100"}
	rec := place(t, c, r)
	if d := rec.Containers[0].Devices[0]; d.MemoryMiB != 20480 || d.Cores != 25 {
		t.Fatalf("grant %+v, want 25%% of 81920 MiB", d)
	}
}

func TestGPUMemoryReasonText(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(2, "A100", 40960, 10))
	place(t, c, pod("a", share("main", 24576, 10)))
	place(t, c, pod("b", share("main", 30000, 10)))
	reason := fitOn(t, c, n, pod("p", share("main", 20000, 10)))
	want := `container "main": no GPU with 20000 MiB free; largest free is 16384 MiB on GPU-A100-0…`
	if reason.String() != want {
		t.Fatalf("got %q\nwant %q", reason.String(), want)
	}
	got := Summarize(12, []Reason{reason, reason, {Kind: ReasonModelNotIncluded, GPU: "T4", Detail: "A100"}})
	if want := `0/12 nodes fit: 2 container "main" no GPU with 20000 MiB free (largest 16384 MiB), 1 GPU model T4 not selected by use-gputype=A100`; got != want {
		t.Fatalf("summary\n got %s\nwant %s", got, want)
	}
}

func TestCPUAndMemoryChecked(t *testing.T) {
	c := NewCluster()
	n, err := NewNode("small", 4000, 8192, inventory(1, "T4", 15360, 10))
	if err != nil {
		t.Fatal(err)
	}
	c.UpsertNode(n)
	r := pod("p", share("main", 1000, 10))
	r.CPUMilli = 3000
	place(t, c, r)
	r2 := pod("q", share("main", 1000, 10))
	r2.CPUMilli = 2000
	if reason := fitOn(t, c, n, r2); reason.String() != "insufficient CPU: pod needs 2000m, node has 1000m free" {
		t.Fatalf("reason %q", reason)
	}
	r3 := pod("r", share("main", 1000, 10))
	r3.MemoryMiB = 9000
	if reason := fitOn(t, c, n, r3); reason.Kind != ReasonMemory {
		t.Fatalf("reason %v", reason)
	}
}

func TestCPUOnlyPodAndNodePolicies(t *testing.T) {
	c := NewCluster()
	for _, name := range []string{"n1", "n2"} {
		c.UpsertNode(mustNode(t, name, inventory(2, "A100", 40960, 10)))
	}
	place(t, c, pod("a", share("main", 20000, 50)))
	// Binpack: the next share goes to the node already used.
	if rec := place(t, c, pod("b", share("main", 1000, 10))); rec.Node != "n1" {
		t.Fatalf("binpack chose %s", rec.Node)
	}
	r := pod("c", share("main", 1000, 10))
	r.NodePolicy = api.NodeSpread
	if rec := place(t, c, r); rec.Node != "n2" {
		t.Fatalf("spread chose %s", rec.Node)
	}
	cpu := &Request{Pod: "cpu", CPUMilli: 1000}
	rec := place(t, c, cpu)
	if len(rec.Containers) != 0 {
		t.Fatalf("CPU-only pod got GPUs: %+v", rec)
	}
}

func TestMultiContainerDistinctAndShared(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(2, "A100", 40960, 10))
	// Two containers each needing 2 GPUs at 30%: both GPUs carry both.
	rec := place(t, c, pod("p", Container{Name: "a", GPUs: 2, MemoryMiB: 10000, Cores: 30}, Container{Name: "b", GPUs: 2, MemoryMiB: 10000, Cores: 30}))
	for _, ca := range rec.Containers {
		if len(ca.Devices) != 2 || ca.Devices[0].UUID == ca.Devices[1].UUID {
			t.Fatalf("container %s devices %+v: want 2 distinct GPUs", ca.Name, ca.Devices)
		}
	}
	for i := range n.GPUs {
		if n.GPUs[i].Used != (Usage{MemoryMiB: 20000, Cores: 60, Shares: 2}) {
			t.Fatalf("GPU %d usage %+v", i, n.GPUs[i].Used)
		}
	}
	checkInvariants(t, c)
}

func TestExclusiveSharingModeTakesOnlyWholeGPUs(t *testing.T) {
	inv := inventory(1, "A100", 40960, 1)
	inv.GPUs[0].Sharing = api.SharingExclusive
	c, n := oneNodeCluster(t, inv)
	if reason := fitOn(t, c, n, pod("p", share("main", 1000, 10))); reason.Kind != ReasonSharingMode {
		t.Fatalf("reason %v", reason)
	}
	place(t, c, pod("q", whole("main", 1)))
}

func TestValidateMessages(t *testing.T) {
	cases := []struct {
		r    *Request
		want string
	}{
		{pod("p", share("c", 1, 101)), `pod p: container "c": GPU cores 101% outside [0, 100]`},
		{pod("p", share("c", 1, -1)), `pod p: container "c": GPU cores -1% outside [0, 100]`},
		{pod("p", Container{Name: "c", GPUs: 1, MemoryPercent: 120}), `pod p: container "c": GPU memory percentage 120 outside [0, 100]`},
		{pod("p", Container{Name: "c", GPUs: 1, MemoryPercent: -3}), `pod p: container "c": GPU memory percentage -3 outside [0, 100]`},
		{pod("p", Container{Name: "c", GPUs: 1, MemoryMiB: 10, MemoryPercent: 10}), `pod p: container "c": GPU memory given both as 10 MiB and as 10%; give one`},
		{pod("p", Container{Name: "c", GPUs: -1}), `pod p: container "c": GPU count -1 outside [0, 64]`},
		{pod("p", Container{Name: "c", GPUs: 65}), `pod p: container "c": GPU count 65 outside [0, 64]`},
		{pod("p", Container{Name: "c", Cores: 10}), `pod p: container "c": GPU memory or cores requested with a GPU count of 0`},
		{pod("p", Container{Name: "c", GPUs: 1, MemoryMiB: -1}), `pod p: container "c": GPU memory -1 MiB is negative`},
		{&Request{Pod: "p", IncludeModels: []string{"T4"}, ExcludeModels: []string{"T4"}}, `pod p: GPU model "T4" is both included and excluded`},
		{&Request{Pod: "p", GPUPolicy: "tight"}, `pod p: unknown GPU policy "tight" (want one of [binpack spread topology-aware])`},
		{&Request{Pod: "p", NodePolicy: "pack"}, `pod p: unknown node policy "pack" (want one of [binpack spread])`},
		{&Request{Pod: "p", CPUMilli: -5}, `pod p: CPU request -5m is negative`},
		{&Request{Pod: "p", MemoryMiB: -1}, `pod p: memory request -1 MiB is negative`},
		{&Request{Pod: "p", InitContainers: []Container{share("i", 1, 200)}}, `pod p: container "i": GPU cores 200% outside [0, 100]`},
	}
	for _, tc := range cases {
		if err := tc.r.Validate(); err == nil || err.Error() != tc.want {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
	if err := pod("p", share("c", 1000, 50), whole("w", 2)).Validate(); err != nil {
		t.Errorf("valid request rejected: %v", err)
	}
}

func TestAssignRecordRejectsUnknownGPUAndDuplicates(t *testing.T) {
	c, _ := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	rec := place(t, c, pod("p", share("main", 1000, 10)))
	if err := c.AssignRecord("p", 0, 0, rec); err == nil || !strings.Contains(err.Error(), "already holds") {
		t.Fatalf("duplicate assign: %v", err)
	}
	bad := &api.PodAllocation{Node: "node-a", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: "GPU-x", MemoryMiB: 1, Cores: 1}}}}}
	if err := c.AssignRecord("q", 0, 0, bad); err == nil || err.Error() != `pod q: container "c" holds GPU GPU-x, which node node-a does not have` {
		t.Fatalf("unknown GPU: %v", err)
	}
}

func TestCheckRecordsFindsOvercommit(t *testing.T) {
	inv := inventory(1, "A100", 40960, 10)
	grant := func(mem int64, cores int) *api.PodAllocation {
		return &api.PodAllocation{Node: "n", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: "GPU-A100-00", MemoryMiB: mem, Cores: cores}}}}}
	}
	invs := map[string]*api.NodeInventory{"n": inv}
	if err := CheckRecords(invs, map[string]*api.PodAllocation{"a": grant(20000, 50), "b": grant(20960, 50)}); err != nil {
		t.Fatalf("exactly full GPU reported: %v", err)
	}
	err := CheckRecords(invs, map[string]*api.PodAllocation{"a": grant(20000, 50), "b": grant(20961, 51)})
	if err == nil || !strings.Contains(err.Error(), "40961 MiB allocated, capacity 40960 MiB") || !strings.Contains(err.Error(), "101% cores allocated") {
		t.Fatalf("overcommit not reported: %v", err)
	}
	excl := &api.PodAllocation{Node: "n", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: "GPU-A100-00", MemoryMiB: 1, Cores: 100, Exclusive: true}}}}}
	err = CheckRecords(invs, map[string]*api.PodAllocation{"a": excl, "b": grant(1, 0)})
	if err == nil || !strings.Contains(err.Error(), "held exclusively but shared by 2 pods") {
		t.Fatalf("shared exclusive GPU not reported: %v", err)
	}
	err = CheckRecords(invs, map[string]*api.PodAllocation{"a": {Node: "gone"}})
	if err == nil || !strings.Contains(err.Error(), "node gone, which has no inventory") {
		t.Fatalf("unknown node: %v", err)
	}
}

func TestInitContainersRunOneAtATime(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	r := &Request{
		Pod:            "p",
		InitContainers: []Container{share("init-a", 30000, 60), share("init-b", 30000, 60)},
		Containers:     []Container{share("app", 5000, 10)},
	}
	place(t, c, r)
	if got := n.GPUs[0].Used; got != (Usage{MemoryMiB: 30000, Cores: 60, Shares: 1}) {
		t.Fatalf("usage %+v: two init containers must not add up", got)
	}
}

func TestShareOnGPUHeldWholeSaysSo(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	place(t, c, pod("whole", whole("main", 1)))
	reason := fitOn(t, c, n, pod("p", share("main", 1000, 10)))
	if reason.Kind != ReasonHeldWhole || reason.String() != `container "main": every usable GPU is held whole by another pod (1)` {
		t.Fatalf("reason %q", reason)
	}
}

// Node.Index is the node's position in Nodes() after every change of the
// node set, so policies may keep per-node values in a slice by it.
func TestNodeIndexIsPosition(t *testing.T) {
	c := NewCluster()
	check := func(when string) {
		t.Helper()
		for i, n := range c.Nodes() {
			if n.Index() != i {
				t.Fatalf("%s: node %s at position %d has index %d", when, n.Name, i, n.Index())
			}
		}
	}
	for i := range 6 {
		c.UpsertNode(mustNode(t, fmt.Sprintf("n%d", i), inventory(2, "A100", 40960, 4)))
	}
	check("after adding")
	c.RemoveNode("n1") // n5 moves into position 1
	check("after removing n1")
	c.UpsertNode(mustNode(t, "n5", inventory(4, "A100", 40960, 4))) // replaced in place
	check("after replacing n5")
	c.RemoveNode("n4") // the last node
	c.UpsertNode(mustNode(t, "n6", inventory(1, "A100", 40960, 4)))
	check("after removing the last node and adding another")
	if got := c.Node("n5").Index(); got != 1 {
		t.Errorf("n5 has index %d, want 1 (it took n1's place)", got)
	}
}

// batchRanker ranks GPUs by position, highest first, and counts how it
// was asked.
type batchRanker struct{ one, batch, ranked int }

func (r *batchRanker) RankGPU(_ *Compiled, _ *Node, i int, _, _ Usage) float64 {
	r.one++
	return float64(i)
}

func (r *batchRanker) RankGPUs(_ *Compiled, _ *Node, cand []int, pending, demand []Usage, rank []float64) {
	r.batch++
	for _, i := range cand {
		if demand[i] == (Usage{}) {
			panic("no demand for a candidate")
		}
		r.ranked++
		rank[i] = float64(i)
	}
}

// Fit asks a GPUsRanker once per container and node, for every GPU the
// container fits, and follows its ranks.
func TestFitRanksGPUsInOneCall(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(4, "A100", 40960, 4))
	place(t, c, pod("busy", whole("main", 1))) // one GPU held whole
	cr := mustCompile(t, c, pod("p", share("a", 1024, 10), share("b", 1024, 10)))
	r := &batchRanker{}
	var s Scratch
	var p Placement
	if reason := cr.Fit(n, r, &s, &p); !reason.OK() {
		t.Fatalf("does not fit: %s", reason)
	}
	if r.one != 0 || r.batch != 2 || r.ranked != 6 {
		t.Errorf("RankGPU called %d times, RankGPUs %d times for %d GPUs; want 0, 2 (one per container), 6 (3 free GPUs each)", r.one, r.batch, r.ranked)
	}
	for k := range 2 {
		if g := p.Grants(k); len(g) != 1 || g[0].GPU != 3 {
			t.Errorf("container %d got %+v, want GPU 3 (ranked highest)", k, g)
		}
	}
}
