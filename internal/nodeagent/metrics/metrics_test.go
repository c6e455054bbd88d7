package metrics

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/limiterstate"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
)

// gather collects c through a pedantic registry (which checks that every
// series matches its description) and returns the series of each family
// as "label=value,...": value.
func gather(t *testing.T, c *Collector) map[string]map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, f := range fams {
		m := map[string]float64{}
		for _, s := range f.Metric {
			var l []string
			for _, p := range s.Label {
				if p.GetValue() != "" && p.GetName() != "device" && p.GetName() != "modelName" && p.GetName() != "Hostname" {
					l = append(l, p.GetName()+"="+p.GetValue())
				}
			}
			sort.Strings(l)
			m[strings.Join(l, ",")] = metricValue(s)
		}
		out[f.GetName()] = m
	}
	return out
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return -1
}

func writeState(t *testing.T, path string, s *limiterstate.Snapshot) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, limiterstate.Encode(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func inventory() *api.NodeInventory {
	return &api.NodeInventory{GPUs: []api.GPU{
		{UUID: gpuA, Index: 0, Model: "A100", MemoryMiB: 40960, Health: api.Healthy},
		{UUID: gpuB, Index: 1, Model: "A100", MemoryMiB: 40960, Health: api.Healthy},
	}}
}

// Device-plugin containers: the throttle and refusal counters of a
// version-4 state file, per GPU of the container; 0 for a container that
// has no file yet (no CUDA call); none for a container whose file is
// version 3 (absent, not zero) or unreadable.
func TestContainerCounters(t *testing.T) {
	root := t.TempDir()
	dirs := statedir.Dirs{Root: root}
	pods := []*v1.Pod{
		fixtures.MakePod().Namespace("ml").Name("v4").Node("n1").UID("uid-v4").Phase(v1.PodRunning).
			GPUContainer("main", api.DeviceGrant{UUID: gpuA, MemoryMiB: 4096, Cores: 30}, api.DeviceGrant{UUID: gpuB, MemoryMiB: 4096, Cores: 30}).Obj(),
		fixtures.MakePod().Namespace("ml").Name("v3").Node("n1").UID("uid-v3").Phase(v1.PodRunning).
			GPUContainer("main", api.DeviceGrant{UUID: gpuA, MemoryMiB: 2048, Cores: 20}).Obj(),
		fixtures.MakePod().Namespace("ml").Name("fresh").Node("n1").UID("uid-fresh").Phase(v1.PodRunning).
			GPUContainer("main", api.DeviceGrant{UUID: gpuA, MemoryMiB: 1024, Cores: 10}).Obj(),
		fixtures.MakePod().Namespace("ml").Name("garbage").Node("n1").UID("uid-garbage").Phase(v1.PodRunning).
			GPUContainer("main", api.DeviceGrant{UUID: gpuA, MemoryMiB: 1024, Cores: 10}).Obj(),
	}
	v4 := &limiterstate.Snapshot{Version: limiterstate.Version}
	v4.Devices[0] = limiterstate.Device{Limit: 4096 << 20, Used: 1 << 30, SMLimit: 30, ThrottledNs: 2_500_000_000, RefusedAllocations: 3}
	v4.Devices[1] = limiterstate.Device{Limit: 4096 << 20, SMLimit: 30, RefusedAllocations: 1}
	writeState(t, filepath.Join(dirs.StateDir("uid-v4", "main"), statedir.LimiterStateFile), v4)
	v3 := &limiterstate.Snapshot{Version: limiterstate.VersionV3}
	v3.Devices[0] = limiterstate.Device{Limit: 2048 << 20, Used: 1 << 20, SMLimit: 20}
	writeState(t, filepath.Join(dirs.StateDir("uid-v3", "main"), statedir.LimiterStateFile), v3)
	if err := os.MkdirAll(dirs.StateDir("uid-garbage", "main"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs.StateDir("uid-garbage", "main"), statedir.LimiterStateFile), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}

	c := New(Source{Node: "n1", Inventory: inventory, Pods: func() ([]*v1.Pod, error) { return pods, nil }, State: dirs},
		ktesting.NewLogger(t, ktesting.NewConfig()))
	got := gather(t, c)

	wantThrottled := map[string]float64{
		"UUID=" + gpuA + ",container=main,gpu=0,namespace=ml,pod=v4":    2.5,
		"UUID=" + gpuB + ",container=main,gpu=1,namespace=ml,pod=v4":    0,
		"UUID=" + gpuA + ",container=main,gpu=0,namespace=ml,pod=fresh": 0,
	}
	wantRefused := map[string]float64{
		"UUID=" + gpuA + ",container=main,gpu=0,namespace=ml,pod=v4":    3,
		"UUID=" + gpuB + ",container=main,gpu=1,namespace=ml,pod=v4":    1,
		"UUID=" + gpuA + ",container=main,gpu=0,namespace=ml,pod=fresh": 0,
	}
	check(t, got, "tessera_container_throttled_seconds_total", wantThrottled)
	check(t, got, "tessera_container_allocations_refused_total", wantRefused)
	// the version-3 container keeps its other series
	if v := got["tessera_container_memory_used_bytes"]["UUID="+gpuA+",container=main,gpu=0,namespace=ml,pod=v3"]; v != 1<<20 {
		t.Errorf("v3 container: memory used %v, want 1 MiB", v)
	}
	if n := got["tessera_node_agent_state_read_errors_total"][""]; n != 1 {
		t.Errorf("read errors %v, want 1 (the garbage file; version 3 is read)", n)
	}
}

// DRA: a claim's series carry its name in `claim`, for every container
// that uses it (a template's claim named in the pod's status, a shared
// claim in two pods, a request named by the container, the
// extended-resource mapping), read from the claim request's state file.
func TestClaimSeries(t *testing.T) {
	root := t.TempDir()
	stateOf := func(claim, req string) string { return filepath.Join(root, claim, req, "state", "cache") }
	quarter := &limiterstate.Snapshot{Version: limiterstate.Version}
	quarter.Devices[0] = limiterstate.Device{Limit: 10240 << 20, Used: 2 << 30, SMLimit: 25, ThrottledNs: 1e9, RefusedAllocations: 2}
	writeState(t, stateOf("tmpl", "gpu"), quarter)
	shared := &limiterstate.Snapshot{Version: limiterstate.Version}
	shared.Devices[0] = limiterstate.Device{Limit: 5120 << 20, SMLimit: 50, RefusedAllocations: 7}
	writeState(t, stateOf("shared", "gpu"), shared)
	claims := []Claim{
		{Namespace: "dra", Name: "pod-a-gpu-x7k2", Requests: []ClaimRequest{{Request: "gpu", StateFile: stateOf("tmpl", "gpu"),
			Devices: []ClaimDevice{{UUID: gpuA, MemoryMiB: 10240, Cores: 25}}}}},
		{Namespace: "dra", Name: "shared", Requests: []ClaimRequest{
			{Request: "gpu/small", StateFile: stateOf("shared", "gpu"), Devices: []ClaimDevice{{UUID: gpuB, MemoryMiB: 5120, Cores: 50}}},
			{Request: "other", StateFile: "", Devices: []ClaimDevice{{UUID: gpuA, Whole: true}}},
		}},
		{Namespace: "dra", Name: "ext-claim", Requests: []ClaimRequest{{Request: "container-0-request-0", Devices: []ClaimDevice{{UUID: gpuB, Whole: true}}}}},
		{Namespace: "elsewhere", Name: "shared", Requests: []ClaimRequest{{Request: "gpu", Devices: []ClaimDevice{{UUID: gpuA, MemoryMiB: 1024, Cores: 5}}}}},
		{Namespace: "dra", Name: "monitor", Requests: []ClaimRequest{{Request: "gpu", Devices: []ClaimDevice{{UUID: gpuA, Admin: true}}}}},
	}
	tmplName, sharedName := "pod-a-gpu-x7k2", "shared"
	podA := fixtures.MakePod().Namespace("dra").Name("pod-a").UID("a").Phase(v1.PodRunning).Obj()
	podA.Spec.Containers = []v1.Container{
		{Name: "ctr0", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}},
		{Name: "ctr1", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}},
		{Name: "nogpu"},
	}
	tmpl := "quarter"
	podA.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}
	podA.Status.ResourceClaimStatuses = []v1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &tmplName}}
	sharer := func(name string) *v1.Pod {
		p := fixtures.MakePod().Namespace("dra").Name(name).UID(name).Phase(v1.PodRunning).Obj()
		// share-1 names the request and the whole claim (the request
		// once, and the other request); share-2 only the request
		cr := []v1.ResourceClaim{{Name: "g", Request: "gpu"}}
		if name == "share-1" {
			cr = append(cr, v1.ResourceClaim{Name: "g"})
		}
		p.Spec.Containers = []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Claims: cr}}}
		p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "g", ResourceClaimName: &sharedName}}
		return p
	}
	podExt := fixtures.MakePod().Namespace("dra").Name("ext").UID("ext").Phase(v1.PodRunning).Obj()
	podExt.Spec.Containers = []v1.Container{{Name: "main"}}
	podExt.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{ResourceClaimName: "ext-claim",
		RequestMappings: []v1.ContainerExtendedResourceRequest{{ContainerName: "main", ResourceName: "nvidia.com/gpu", RequestName: "container-0-request-0"}}}
	done := sharer("done")
	done.Status.Phase = v1.PodSucceeded
	pods := []*v1.Pod{podA, sharer("share-1"), sharer("share-2"), podExt, done}

	c := New(Source{Node: "n1", Inventory: inventory, Pods: func() ([]*v1.Pod, error) { return pods, nil },
		Claims: func() []Claim { return claims }}, ktesting.NewLogger(t, ktesting.NewConfig()))
	got := gather(t, c)

	a := "UUID=" + gpuA + ",claim=pod-a-gpu-x7k2,"
	b := "UUID=" + gpuB + ",claim=shared,"
	// per GPU, each claim once (the other namespace's claim too: the node
	// serves it; the admin claim consumes nothing): A holds the template's
	// claim, elsewhere/shared and the shared claim's whole request "other",
	// B the shared claim's "gpu" and the extended-resource whole GPU
	check(t, got, "tessera_gpu_memory_allocated_bytes", map[string]float64{
		"UUID=" + gpuA + ",gpu=0": (10240 + 1024 + 40960) << 20,
		"UUID=" + gpuB + ",gpu=1": (5120 + 40960) << 20,
	})
	check(t, got, "tessera_gpu_cores_allocated_percent", map[string]float64{
		"UUID=" + gpuA + ",gpu=0": 130,
		"UUID=" + gpuB + ",gpu=1": 150,
	})
	check(t, got, "tessera_gpu_shares_allocated", map[string]float64{
		"UUID=" + gpuA + ",gpu=0": 2,
		"UUID=" + gpuB + ",gpu=1": 1,
	})
	check(t, got, "tessera_container_memory_limit_bytes", map[string]float64{
		"UUID=" + gpuA + ",claim=shared,container=main,gpu=0,namespace=dra,pod=share-1": 40960 << 20,
		a + "container=ctr0,gpu=0,namespace=dra,pod=pod-a":                              10240 << 20,
		a + "container=ctr1,gpu=0,namespace=dra,pod=pod-a":                              10240 << 20,
		b + "container=main,gpu=1,namespace=dra,pod=share-1":                            5120 << 20,
		b + "container=main,gpu=1,namespace=dra,pod=share-2":                            5120 << 20,
		"UUID=" + gpuB + ",claim=ext-claim,container=main,gpu=1,namespace=dra,pod=ext":  40960 << 20,
	})
	check(t, got, "tessera_container_sm_share_percent", map[string]float64{
		"UUID=" + gpuA + ",claim=shared,container=main,gpu=0,namespace=dra,pod=share-1": 100,
		a + "container=ctr0,gpu=0,namespace=dra,pod=pod-a":                              25,
		a + "container=ctr1,gpu=0,namespace=dra,pod=pod-a":                              25,
		b + "container=main,gpu=1,namespace=dra,pod=share-1":                            50,
		b + "container=main,gpu=1,namespace=dra,pod=share-2":                            50,
		"UUID=" + gpuB + ",claim=ext-claim,container=main,gpu=1,namespace=dra,pod=ext":  100,
	})
	check(t, got, "tessera_container_memory_used_bytes", map[string]float64{
		"UUID=" + gpuA + ",claim=shared,container=main,gpu=0,namespace=dra,pod=share-1": 0,
		a + "container=ctr0,gpu=0,namespace=dra,pod=pod-a":                              2 << 30,
		a + "container=ctr1,gpu=0,namespace=dra,pod=pod-a":                              2 << 30,
		b + "container=main,gpu=1,namespace=dra,pod=share-1":                            0,
		b + "container=main,gpu=1,namespace=dra,pod=share-2":                            0,
		"UUID=" + gpuB + ",claim=ext-claim,container=main,gpu=1,namespace=dra,pod=ext":  0,
	})
	// the extended-resource claim's whole GPU runs no limiter: 0
	check(t, got, "tessera_container_throttled_seconds_total", map[string]float64{
		"UUID=" + gpuA + ",claim=shared,container=main,gpu=0,namespace=dra,pod=share-1": 0,
		a + "container=ctr0,gpu=0,namespace=dra,pod=pod-a":                              1,
		a + "container=ctr1,gpu=0,namespace=dra,pod=pod-a":                              1,
		b + "container=main,gpu=1,namespace=dra,pod=share-1":                            0,
		b + "container=main,gpu=1,namespace=dra,pod=share-2":                            0,
		"UUID=" + gpuB + ",claim=ext-claim,container=main,gpu=1,namespace=dra,pod=ext":  0,
	})
	check(t, got, "tessera_container_allocations_refused_total", map[string]float64{
		"UUID=" + gpuA + ",claim=shared,container=main,gpu=0,namespace=dra,pod=share-1": 0,
		a + "container=ctr0,gpu=0,namespace=dra,pod=pod-a":                              2,
		a + "container=ctr1,gpu=0,namespace=dra,pod=pod-a":                              2,
		b + "container=main,gpu=1,namespace=dra,pod=share-1":                            7,
		b + "container=main,gpu=1,namespace=dra,pod=share-2":                            7,
		"UUID=" + gpuB + ",claim=ext-claim,container=main,gpu=1,namespace=dra,pod=ext":  0,
	})
}

func check(t *testing.T, got map[string]map[string]float64, name string, want map[string]float64) {
	t.Helper()
	g := got[name]
	for k, v := range want {
		if gv, ok := g[k]; !ok {
			t.Errorf("%s: no series {%s}", name, k)
		} else if gv != v {
			t.Errorf("%s{%s} = %v, want %v", name, k, gv, v)
		}
	}
	for k, v := range g {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected series {%s} = %v", name, k, v)
		}
	}
}

// A container that names two requests of a claim on one GPU (the DRA
// driver refuses to prepare that for it, but the claim may be prepared for
// another pod) must not break the scrape with duplicate series.
func TestClaimSeriesNoDuplicates(t *testing.T) {
	name := "two"
	claims := []Claim{{Namespace: "dra", Name: name, Requests: []ClaimRequest{
		{Request: "a", Devices: []ClaimDevice{{UUID: gpuA, MemoryMiB: 1024, Cores: 10}}},
		{Request: "b", Devices: []ClaimDevice{{UUID: gpuA, MemoryMiB: 2048, Cores: 10}}},
	}}}
	p := fixtures.MakePod().Namespace("dra").Name("p").UID("p").Phase(v1.PodPending).Obj()
	p.Spec.Containers = []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "g", Request: "a"}, {Name: "g", Request: "b"}}}}}
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "g", ResourceClaimName: &name}}
	c := New(Source{Node: "n1", Inventory: inventory, Pods: func() ([]*v1.Pod, error) { return []*v1.Pod{p}, nil },
		Claims: func() []Claim { return claims }}, ktesting.NewLogger(t, ktesting.NewConfig()))
	got := gather(t, c) // fails on a duplicate
	check(t, got, "tessera_container_memory_limit_bytes", map[string]float64{
		"UUID=" + gpuA + ",claim=two,container=main,gpu=0,namespace=dra,pod=p": 1024 << 20,
	})
}
