package recordcheck

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

const memMiB = 40960

// placed places pod on a fresh 8-GPU node with the placement core and
// returns its record, as the scheduler writes it.
func placed(t *testing.T, pod *corev1.Pod) *api.PodAllocation {
	t.Helper()
	return placedOn(t, pod, fixtures.Inventory("n1", 8, "A100", memMiB, 10))
}

func placedOn(t *testing.T, pod *corev1.Pod, inv *api.NodeInventory) *api.PodAllocation {
	t.Helper()
	c := placement.NewCluster()
	n, err := placement.NewNode("n1", placement.Unlimited, placement.Unlimited, inv)
	if err != nil {
		t.Fatal(err)
	}
	c.UpsertNode(n)
	req, err := podrequest.FromPod(pod, names)
	if err != nil {
		t.Fatal(err)
	}
	cr, err := c.Compile(req)
	if err != nil {
		t.Fatal(err)
	}
	var s placement.Scratch
	var p placement.Placement
	if r := cr.Fit(c.Node("n1"), nil, &s, &p); !r.OK() {
		t.Fatalf("does not fit: %v", r)
	}
	rec, err := c.Assign(cr, &p)
	if err != nil {
		t.Fatal(err)
	}
	rec.PodUID = string(pod.UID)
	return rec
}

func memory(string) (GPU, bool) { return GPU{MemoryMiB: memMiB}, true }

// TestScheduledRecordsMatch: every record the placement core writes for a
// pod matches that pod, with and without the GPUs' memory known.
func TestScheduledRecordsMatch(t *testing.T) {
	pods := []*corev1.Pod{
		fixtures.MakePod().Name("frac").Container("c", map[string]string{names.GPU: "0.3"}).Obj(),
		fixtures.MakePod().Name("mib").Container("c", map[string]string{names.Memory: "10000", names.Cores: "30"}).Obj(),
		fixtures.MakePod().Name("pct").Container("c", map[string]string{names.GPU: "2", names.MemoryPercentage: "25"}).Obj(),
		fixtures.MakePod().Name("whole").Container("c", map[string]string{names.GPU: "1"}).Obj(),
		fixtures.MakePod().Name("cores100").Container("c", map[string]string{names.Memory: "1000", names.Cores: "100"}).Obj(),
		fixtures.MakePod().Name("multi").InitContainer("init", map[string]string{names.Memory: "2000"}).
			Sidecar("side", map[string]string{names.Memory: "1000", names.Cores: "5"}).
			Container("a", map[string]string{names.Memory: "4000", names.Cores: "10"}).
			Container("nogpu", map[string]string{"cpu": "1"}).
			Container("b", map[string]string{names.GPU: "2", names.Memory: "3000"}).Obj(),
	}
	for i, p := range pods {
		p.UID = fixtures.MakePod().UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)).Obj().UID
		rec := placed(t, p)
		if err := MatchPod(p, rec, names, memory); err != nil {
			t.Errorf("%s: %v\nrecord %+v", p.Name, err, rec)
		}
		if err := MatchPod(p, rec, names, nil); err != nil {
			t.Errorf("%s without GPU memory: %v", p.Name, err)
		}
	}
}

// TestForgedRecordsDoNotMatch: each way the trust issue's attacker raised a
// grant is caught against the pod's own request.
func TestForgedRecordsDoNotMatch(t *testing.T) {
	p := fixtures.MakePod().Name("p").UID("00000000-0000-0000-0000-000000000001").
		Container("c", map[string]string{names.GPU: "0.1"}).Obj() // 10 % of a GPU
	good := placed(t, p)
	cases := map[string]struct {
		change func(r *api.PodAllocation)
		want   string
	}{
		"more memory (finding 1: 40960 MiB for 0.1)": {func(r *api.PodAllocation) { r.Containers[0].Devices[0].MemoryMiB = 40960 }, "grants 40960 MiB, the request asks 4096 MiB"},
		"unthrottled": {func(r *api.PodAllocation) { r.Containers[0].Devices[0].Cores = 0 }, "grants 0 percent of the cores, the request asks 10"},
		"whole GPU": {func(r *api.PodAllocation) {
			r.Containers[0].Devices[0].Exclusive, r.Containers[0].Devices[0].Cores = true, 100
		}, "exclusive=true"},
		"second GPU": {func(r *api.PodAllocation) {
			r.Containers[0].Devices = append(r.Containers[0].Devices, api.DeviceGrant{UUID: fixtures.GPUUUID("n1", 7), MemoryMiB: 4096, Cores: 10})
		}, "asks for 1 GPUs, the record grants 2"},
		"another container": {func(r *api.PodAllocation) {
			r.Containers = append(r.Containers, api.ContainerAllocation{Name: "x", Devices: r.Containers[0].Devices})
		}, `container "x", which asks for none`},
		"copied from another pod": {func(r *api.PodAllocation) { r.PodUID = "00000000-0000-0000-0000-000000000002" }, "written for pod UID 00000000-0000-0000-0000-000000000002"},
	}
	for name, tc := range cases {
		r := *good
		r.Containers = []api.ContainerAllocation{{Name: good.Containers[0].Name, Devices: append([]api.DeviceGrant(nil), good.Containers[0].Devices...)}}
		tc.change(&r)
		if err := MatchPod(p, &r, names, memory); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	// A CPU-only pod with a record (finding 4: the squatter).
	cpu := fixtures.MakePod().Name("squatter").UID("00000000-0000-0000-0000-000000000001").Container("c", map[string]string{"cpu": "1"}).Obj()
	if err := MatchPod(cpu, good, names, memory); err == nil || !strings.Contains(err.Error(), "which asks for none") {
		t.Errorf("CPU-only pod: %v", err)
	}
	// The record lacks a container the pod asks for.
	two := fixtures.MakePod().Name("p").UID("00000000-0000-0000-0000-000000000001").
		Container("c", map[string]string{names.GPU: "0.1"}).Container("d", map[string]string{names.GPU: "1"}).Obj()
	if err := MatchPod(two, good, names, memory); err == nil || !strings.Contains(err.Error(), `"d" asks for 1 GPUs, the record grants it none`) {
		t.Errorf("missing container: %v", err)
	}
}

// TestReplicas: on GPUs shared by replicas (MPS, time-slicing) a container
// asking for a whole GPU is granted one replica; the record matches when
// the checker knows the replicas (the agent's configuration, the
// scheduler's inventory) or nothing of the GPU, and a record granting the
// whole GPU or a bigger slot does not.
func TestReplicas(t *testing.T) {
	for _, mode := range []api.SharingMode{api.SharingMPS, api.SharingTimeSlicing} {
		inv := fixtures.Inventory("n1", 1, "A100", memMiB, 10)
		inv.GPUs[0].Sharing = mode
		p := fixtures.MakePod().Name("replica").UID("00000000-0000-0000-0000-000000000001").
			Container("c", map[string]string{names.GPU: "1"}).Obj()
		rec := placedOn(t, p, inv)
		if d := rec.Containers[0].Devices[0]; d.Exclusive || d.MemoryMiB != memMiB/10 || d.Cores != 10 {
			t.Fatalf("%s: the core grants %+v, want one replica of 10", mode, d)
		}
		replicas := func(string) (GPU, bool) { return GPU{MemoryMiB: memMiB, Replicas: 10}, true }
		if err := MatchPod(p, rec, names, replicas); err != nil {
			t.Errorf("%s: %v", mode, err)
		}
		if err := MatchPod(p, rec, names, nil); err != nil {
			t.Errorf("%s, GPU unknown: %v", mode, err)
		}
		if err := MatchPod(p, rec, names, memory); err == nil || !strings.Contains(err.Error(), "exclusive=false, the request is for exclusive=true") {
			t.Errorf("%s, GPU not replicated: %v", mode, err)
		}
		for name, change := range map[string]func(d *api.DeviceGrant){
			"whole":        func(d *api.DeviceGrant) { d.Exclusive, d.Cores, d.MemoryMiB = true, 100, memMiB },
			"bigger slot":  func(d *api.DeviceGrant) { d.MemoryMiB *= 2 },
			"more threads": func(d *api.DeviceGrant) { d.Cores = 50 },
		} {
			r := *rec
			r.Containers = []api.ContainerAllocation{{Name: "c", Devices: append([]api.DeviceGrant(nil), rec.Containers[0].Devices...)}}
			change(&r.Containers[0].Devices[0])
			if err := MatchPod(p, &r, names, replicas); err == nil {
				t.Errorf("%s: a forged %s record matches", mode, name)
			}
		}
	}
}

// TestCeilingRecords: a record carries exactly the ceiling its pod asks;
// one raised, added, dropped or past the GPU's memory does not match.
func TestCeilingRecords(t *testing.T) {
	p := fixtures.MakePod().Name("burst").UID("00000000-0000-0000-0000-000000000003").
		Container("c", map[string]string{names.Memory: "4096", names.MemoryCeiling: "12288", names.Cores: "20"}).Obj()
	good := placed(t, p)
	if d := good.Containers[0].Devices[0]; d.MemoryMiB != 4096 || d.CeilingMiB != 12288 {
		t.Fatalf("placed %+v", d)
	}
	if err := MatchPod(p, good, names, memory); err != nil {
		t.Fatalf("the scheduler's record: %v", err)
	}
	for name, tc := range map[string]struct {
		ceiling int64
		want    string
	}{
		"raised":        {20480, "grants a memory ceiling of 20480 MiB, the request asks 12288 MiB"},
		"dropped":       {0, "grants a memory ceiling of 0 MiB, the request asks 12288 MiB"},
		"past the GPU":  {memMiB + 1, "grants a memory ceiling of 40961 MiB"},
		"below request": {8192, "the request asks 12288"},
	} {
		r := *good
		r.Containers = []api.ContainerAllocation{{Name: "c", Devices: append([]api.DeviceGrant(nil), good.Containers[0].Devices...)}}
		r.Containers[0].Devices[0].CeilingMiB = tc.ceiling
		if err := MatchPod(p, &r, names, memory); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	plain := fixtures.MakePod().Name("plain").UID("00000000-0000-0000-0000-000000000004").
		Container("c", map[string]string{names.Memory: "4096"}).Obj()
	r := placed(t, plain)
	r.Containers[0].Devices[0].CeilingMiB = 8192
	if err := MatchPod(plain, r, names, memory); err == nil || !strings.Contains(err.Error(), "grants a memory ceiling of 8192 MiB, the request asks 0 MiB") {
		t.Errorf("a ceiling added to a pod that asked none: %v", err)
	}
}
