package placement

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// migInventory is count A100-40GB GPUs in sharing mode mode; for static
// MIG each GPU carries the given devices (profile@start).
func migInventory(count int, mode api.SharingMode, strategy api.MIGStrategy, devs ...string) *api.NodeInventory {
	inv := inventory(count, "NVIDIA A100-SXM4-40GB", 40960, 7)
	inv.MIGStrategy = strategy
	mem := map[string]int64{"1g.5gb": 4864, "2g.10gb": 9856, "3g.20gb": 19968}
	sms := map[string]int{"1g.5gb": 14, "2g.10gb": 28, "3g.20gb": 42}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		g.Sharing, g.SMCount = mode, 108
		g.MIG = api.MIG{Capable: true, Enabled: true}
		for k, d := range devs {
			var p string
			var s int
			fmt.Sscanf(strings.Replace(d, "@", " ", 1), "%s %d", &p, &s)
			g.MIG.Devices = append(g.MIG.Devices, api.MIGDevice{UUID: fmt.Sprintf("MIG-%d-%d", i, k), Profile: p, Start: s, MemoryMiB: mem[p], SMCount: sms[p], Health: api.Healthy})
		}
		if len(devs) > 0 {
			g.MaxShares = len(devs)
		}
	}
	return inv
}

func migPod(name, profile string) *Request {
	return pod(name, Container{Name: "c", GPUs: 1, MIGProfile: profile})
}

// TestStaticMIGMixed: MIG devices go whole to containers naming their
// profile, one each; plain GPU requests do not get them (mixed).
func TestStaticMIGMixed(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", migInventory(1, api.SharingMIG, api.MIGStrategyMixed, "1g.5gb@0", "1g.5gb@1", "2g.10gb@2", "3g.20gb@4")))
	seen := map[string]bool{}
	for i := range 2 {
		rec := place(t, c, migPod(fmt.Sprintf("p%d", i), "1g.5gb"))
		d := rec.Containers[0].Devices[0]
		if d.MIG == nil || d.MIG.Profile != "1g.5gb" || d.MIG.Device == "" || d.MemoryMiB != 4864 || d.Exclusive || seen[d.MIG.Device] {
			t.Fatalf("grant %+v %+v", d, d.MIG)
		}
		seen[d.MIG.Device] = true
	}
	checkInvariants(t, c)
	r := fitOn(t, c, c.Node("n"), migPod("p3", "1g.5gb"))
	if r.Kind != ReasonMIG || !strings.Contains(r.String(), "no free 1g.5gb MIG device (2 of 2 held or unhealthy)") {
		t.Errorf("third 1g: %v", r)
	}
	r = fitOn(t, c, c.Node("n"), pod("plain", share("c", 1000, 10)))
	if r.Kind != ReasonMIG || !strings.Contains(r.String(), "mixed strategy") {
		t.Errorf("plain request on a mixed MIG node: %v", r)
	}
	rec := place(t, c, migPod("big", "3g.20gb"))
	if d := rec.Containers[0].Devices[0]; d.Cores != 38 || d.MIG.Start != 4 {
		t.Errorf("3g grant %+v", d)
	}
	// Releasing frees the device; a rebuilt cluster holds the same.
	c.Release("default/p0")
	c.Release("p0")
	if r := fitOn(t, c, c.Node("n"), migPod("p4", "1g.5gb")); !r.OK() {
		t.Errorf("after release: %v", r)
	}
}

// TestStaticMIGSingle: under the single strategy any MIG device serves
// the GPU resource, the smallest that satisfies the request.
func TestStaticMIGSingle(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", migInventory(1, api.SharingMIG, api.MIGStrategySingle, "1g.5gb@0", "2g.10gb@2", "3g.20gb@4")))
	rec := place(t, c, pod("a", share("c", 8000, 0)))
	if d := rec.Containers[0].Devices[0]; d.MIG == nil || d.MIG.Profile != "2g.10gb" {
		t.Errorf("8000 MiB got %+v", d)
	}
	rec = place(t, c, pod("b", whole("c", 1)))
	if d := rec.Containers[0].Devices[0]; d.MIG == nil || d.MIG.Profile != "1g.5gb" || d.Exclusive {
		t.Errorf("nvidia.com/gpu: 1 got %+v", d)
	}
	checkInvariants(t, c)
}

// TestMIGRefusesCeiling: a share with a memory ceiling gets no MIG
// instance or device (their memory is fixed), on a dynamic or a static
// (single) MIG GPU, with a reason naming the ceiling; without the ceiling
// the same share fits.
func TestMIGRefusesCeiling(t *testing.T) {
	for _, inv := range []*api.NodeInventory{
		migInventory(1, api.SharingMIGDynamic, api.MIGStrategyNone),
		migInventory(1, api.SharingMIG, api.MIGStrategySingle, "1g.5gb@0", "2g.10gb@2", "3g.20gb@4"),
	} {
		c := NewCluster()
		c.UpsertNode(mustNode(t, "n", inv))
		ceil := share("c", 4000, 10)
		ceil.CeilingMiB = 6000
		r := fitOn(t, c, c.Node("n"), pod("ceiling", ceil))
		if r.Kind != ReasonMIG || !strings.Contains(r.String(), "memory ceiling (6000 MiB) cannot be granted") {
			t.Errorf("%s: a ceiling on a MIG GPU: %v", inv.GPUs[0].Sharing, r)
		}
		if r := fitOn(t, c, c.Node("n"), pod("plain", share("c", 4000, 10))); !r.OK() {
			t.Errorf("%s: without the ceiling: %v", inv.GPUs[0].Sharing, r)
		}
	}
}

// TestDynamicMIG is the acceptance sequence in the core: seven 1g pods
// fill an A100's seven slices, a 3g pod then does not fit with a reason
// naming the blocking instances, releasing four frees slices 0-3 and the
// 3g pod fits; the records rebuild the same state.
func TestDynamicMIG(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", migInventory(1, api.SharingMIGDynamic, api.MIGStrategyNone)))
	recs := map[string]*api.PodAllocation{}
	for i := range 7 {
		name := fmt.Sprintf("small-%d", i)
		recs[name] = place(t, c, pod(name, share("c", 4000, 10)))
		d := recs[name].Containers[0].Devices[0]
		if d.MIG == nil || d.MIG.Profile != "1g.5gb" || d.MIG.Device != "" {
			t.Fatalf("%s: %+v", name, d)
		}
	}
	checkInvariants(t, c)
	big := pod("big", share("c", 18000, 30))
	r := fitOn(t, c, c.Node("n"), big)
	if r.Kind != ReasonMIG || !strings.Contains(r.String(), "3g.20gb") || !strings.Contains(r.String(), "1g.5gb@0") {
		t.Fatalf("3g on a full GPU: %v", r)
	}
	if r := fitOn(t, c, c.Node("n"), migPod("named", "3g.20gb")); r.Kind != ReasonMIG || !strings.Contains(r.String(), "instances 1g.5gb@") {
		t.Errorf("3g by name: %v", r)
	}
	freed := 0
	for name, rec := range recs {
		if rec.Containers[0].Devices[0].MIG.Start < 4 {
			c.Release(name)
			delete(recs, name)
			freed++
		}
	}
	if freed != 4 {
		t.Fatalf("freed %d instances on slices 0-3", freed)
	}
	rec := place(t, c, big)
	if d := rec.Containers[0].Devices[0]; d.MIG.Profile != "3g.20gb" || d.MIG.Start != 0 {
		t.Errorf("3g after freeing: %+v", d.MIG)
	}
	recs["big"] = rec
	checkInvariants(t, c)
	// The records alone rebuild the same state (the scheduler's restart).
	inv := migInventory(1, api.SharingMIGDynamic, api.MIGStrategyNone)
	if err := CheckRecords(map[string]*api.NodeInventory{"n": inv}, recs); err != nil {
		t.Error(err)
	}
	recs["dup"] = recs["big"]
	if err := CheckRecords(map[string]*api.NodeInventory{"n": inv}, recs); err == nil || !strings.Contains(err.Error(), "MIG instance 3g.20gb@0 held by") {
		t.Errorf("a MIG instance held twice: %v", err)
	}
}

// TestDynamicMIGInventoryInstances: instances the inventory lists that no
// record holds (not yet destroyed after their pod left) still block.
func TestDynamicMIGInventoryInstances(t *testing.T) {
	c := NewCluster()
	inv := migInventory(1, api.SharingMIGDynamic, api.MIGStrategyNone, "3g.20gb@0", "3g.20gb@4")
	inv.GPUs[0].MaxShares = 7
	c.UpsertNode(mustNode(t, "n", inv))
	if r := fitOn(t, c, c.Node("n"), pod("p", share("c", 4000, 0))); r.Kind != ReasonMIG || !strings.Contains(r.String(), "3g.20gb@0, 3g.20gb@4") {
		t.Errorf("%v", r)
	}
}

// TestReplicaSlots: on MPS and time-slicing GPUs a container that asks no
// share gets one replica: 1/replicas of memory and compute.
func TestReplicaSlots(t *testing.T) {
	for _, mode := range []api.SharingMode{api.SharingMPS, api.SharingTimeSlicing} {
		c := NewCluster()
		inv := inventory(1, "A100", 40000, 4)
		inv.GPUs[0].Sharing = mode
		c.UpsertNode(mustNode(t, "n", inv))
		for i := range 4 {
			rec := place(t, c, pod(fmt.Sprintf("p%d", i), whole("c", 1)))
			if d := rec.Containers[0].Devices[0]; d.Exclusive || d.MemoryMiB != 10000 || d.Cores != 25 {
				t.Errorf("%s: replica %+v", mode, d)
			}
		}
		if r := fitOn(t, c, c.Node("n"), pod("p5", whole("c", 1))); r.OK() {
			t.Errorf("%s: a fifth replica: %v", mode, r)
		}
		checkInvariants(t, c)
	}
}

// TestMPSOneGPUPerContainer: a container asking two GPUs is not placed on
// MPS GPUs (an MPS client connects to one control daemon), with a reason.
func TestMPSOneGPUPerContainer(t *testing.T) {
	c := NewCluster()
	inv := inventory(2, "A100", 40000, 10)
	for i := range inv.GPUs {
		inv.GPUs[i].Sharing = api.SharingMPS
	}
	c.UpsertNode(mustNode(t, "n", inv))
	r := fitOn(t, c, c.Node("n"), pod("two", Container{Name: "c", GPUs: 2, MemoryMiB: 1000}))
	if r.Kind != ReasonMPSOneGPU || !strings.Contains(r.String(), "an MPS client uses one GPU") {
		t.Errorf("two MPS GPUs: %v", r)
	}
	if r := fitOn(t, c, c.Node("n"), pod("one", share("c", 1000, 10))); !r.OK() {
		t.Errorf("one MPS GPU: %v", r)
	}
}

// TestMIGShareMiB: what a share is given as a MIG device: in mig-dynamic
// mode the instance sized to it; with the single strategy the largest
// device of the layout that satisfies it; nothing on GPUs that give
// shares no MIG device (not in a MIG mode, the mixed strategy).
func TestMIGShareMiB(t *testing.T) {
	g := api.GPU{UUID: "GPU-a", Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, SMCount: 108, Sharing: api.SharingMIGDynamic}
	for _, tc := range []struct {
		mem, pct int64
		cores    int
		want     int64
	}{{1024, 0, 0, 4864}, {1024, 0, 60, 40192}, {0, 25, 0, 19968}, {30000, 0, 0, 40192}} {
		if got, ok := MIGShareMiB(g, api.MIGStrategyNone, tc.mem, tc.pct, tc.cores); !ok || got != tc.want {
			t.Errorf("dynamic %+v: %d %v, want %d", tc, got, ok, tc.want)
		}
	}
	if _, ok := MIGShareMiB(g, api.MIGStrategyNone, 50000, 0, 0); ok {
		t.Error("a share no profile satisfies")
	}
	static := g
	static.Sharing = api.SharingMIG
	static.MIG.Devices = []api.MIGDevice{{UUID: "MIG-1", Profile: "1g.5gb", MemoryMiB: 4864, SMCount: 14}, {UUID: "MIG-2", Profile: "1g.5gb", Start: 1, MemoryMiB: 4864, SMCount: 14}}
	if got, ok := MIGShareMiB(static, api.MIGStrategySingle, 1024, 0, 10); !ok || got != 4864 {
		t.Errorf("single: %d %v", got, ok)
	}
	if _, ok := MIGShareMiB(static, api.MIGStrategySingle, 1024, 0, 50); ok {
		t.Error("single: cores no device has")
	}
	if _, ok := MIGShareMiB(static, api.MIGStrategyMixed, 1024, 0, 10); ok {
		t.Error("mixed gives shares no MIG device")
	}
	shared := g
	shared.Sharing = api.SharingShared
	if _, ok := MIGShareMiB(shared, api.MIGStrategyNone, 1024, 0, 10); ok {
		t.Error("a shared GPU")
	}
}
