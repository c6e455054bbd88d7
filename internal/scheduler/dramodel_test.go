package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// The model holds a node's GPUs from its Tessera slice (a tainted device
// unhealthy) and their usage from the claims' allocated state: consumed
// capacity on shared GPUs adds up, a device allocated exclusively is
// used whole, and a GPU whose claims are gone is free again.
func TestDRAModelUsage(t *testing.T) {
	m := newDRAModel(api.DefaultGPUPolicy)
	slice := draSlice(t, draNode("dra-0", 3))
	slice.Spec.Devices[2].Taints = []resourceapi.DeviceTaint{{Key: api.TaintUnhealthy, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	m.onSlice(klog.Background(), slice.Name, slice)
	other := slice.DeepCopy()
	other.Name, other.Spec.Driver = "other", "gpu.example.com"
	m.onSlice(klog.Background(), other.Name, other) // another driver's: ignored
	n := m.cluster.Node("dra-0")
	if n == nil || len(n.GPUs) != 3 {
		t.Fatalf("model of dra-0: %+v, want 3 GPUs", n)
	}
	if !n.GPUs[0].Healthy || n.GPUs[2].Healthy {
		t.Errorf("health of the GPUs: %v %v %v, want the tainted gpu-2 unhealthy", n.GPUs[0].Healthy, n.GPUs[1].Healthy, n.GPUs[2].Healthy)
	}
	if n.GPUs[0].MemoryMiB != 81559 || n.GPUs[0].MaxShares != 10 || n.GPUs[0].Sharing != api.SharingShared {
		t.Errorf("gpu-0 in the model: %d MiB, %d shares, %s; want 81559 MiB, 10 shares, shared", n.GPUs[0].MemoryMiB, n.GPUs[0].MaxShares, n.GPUs[0].Sharing)
	}
	share := func(memory string) structured.ConsumedCapacity {
		mem, cores, one := resource.MustParse(memory), resource.MustParse("25"), resource.MustParse("1")
		return structured.ConsumedCapacity{api.CapacityMemory: &mem, api.CapacityCores: &cores, api.CapacityShares: &one}
	}
	alloc := &structured.AllocatedState{
		AllocatedDevices: sets.New(structured.MakeDeviceID(api.DRADriverName, "dra-0", dra.DeviceName(1))),
		AggregatedCapacity: structured.ConsumedCapacityCollection{
			structured.MakeDeviceID(api.DRADriverName, "dra-0", dra.DeviceName(0)): share("20Gi"),
			structured.MakeDeviceID("gpu.example.com", "dra-0", dra.DeviceName(0)): share("40Gi"),
		},
	}
	v := n.Version
	m.refresh(alloc)
	if got, want := n.GPUs[0].Used, (placement.Usage{MemoryMiB: 20480, Cores: 25, Shares: 1}); got != want {
		t.Errorf("gpu-0 used %+v, want %+v (20 Gi, 25 %%, one share)", got, want)
	}
	if got := n.GPUs[1].Used; got.Exclusive != 1 || got.MemoryMiB != n.GPUs[1].MemoryCap {
		t.Errorf("gpu-1, allocated exclusively, used %+v, want whole", got)
	}
	if n.Version == v {
		t.Error("node version unchanged by a new usage: the memo would keep stale verdicts")
	}
	v = n.Version
	m.refresh(alloc)
	if n.Version != v {
		t.Error("node version changed by the same usage")
	}
	m.refresh(&structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()})
	if !n.GPUs[0].Idle() || !n.GPUs[1].Idle() {
		t.Errorf("GPUs still used after their claims went: %+v %+v", n.GPUs[0].Used, n.GPUs[1].Used)
	}
	m.onSlice(klog.Background(), slice.Name, nil)
	if m.cluster.Node("dra-0") != nil {
		t.Error("dra-0 still in the model after its slice was deleted")
	}
}

// Which claims the core narrows: Tessera's class with a count and
// capacity memory and cores; not another class, firstAvailable,
// adminAccess, selectors, other capacities or an allocated claim.
func TestDRARequest(t *testing.T) {
	pod := claimPod("p", "c", nil)
	for _, tc := range []struct {
		name   string
		mutate func(c *resourceapi.ResourceClaim)
		want   *placement.Container
		why    string
		result string // the metric's label
	}{
		{name: "share", want: &placement.Container{Name: "gpu", GPUs: 1, MemoryMiB: 10240, Cores: 25}},
		{name: "two whole GPUs", mutate: func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.Capacity, c.Spec.Devices.Requests[0].Exactly.Count = nil, 2
		}, want: &placement.Container{Name: "gpu", GPUs: 2}},
		{name: "cores only holds the GPU whole", mutate: func(c *resourceapi.ResourceClaim) {
			delete(c.Spec.Devices.Requests[0].Exactly.Capacity.Requests, api.CapacityMemory)
		}, want: &placement.Container{Name: "gpu", GPUs: 1}},
		{name: "memory rounded up to a MiB", mutate: func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.Capacity.Requests[api.CapacityMemory] = resource.MustParse("1000000000")
		}, want: &placement.Container{Name: "gpu", GPUs: 1, MemoryMiB: 954, Cores: 25}},
		{name: "another class", mutate: func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.DeviceClassName = "gpu.example.com"
		}, why: "DeviceClass gpu.example.com", result: "deviceClass"},
		{name: "firstAvailable", mutate: func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].FirstAvailable = []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: api.DeviceClassGPU}}
			c.Spec.Devices.Requests[0].Exactly = nil
		}, why: "firstAvailable", result: "firstAvailable"},
		{name: "adminAccess", mutate: func(c *resourceapi.ResourceClaim) { c.Spec.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true) }, why: "adminAccess", result: "adminAccess"},
		{name: "selector", mutate: func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}}
		}, why: "selectors", result: "selectors"},
		{name: "all devices", mutate: func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
		}, why: "allocationMode All", result: "allocationMode"},
		{name: "the mirror capacity", mutate: func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.Capacity.Requests[api.CapacityNVIDIAMemory] = resource.MustParse("0")
		}, why: "capacity " + api.CapacityNVIDIAMemory, result: "capacity"},
		{name: "allocated (shared with another pod)", mutate: func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation = &resourceapi.AllocationResult{}
		}, why: "already allocated", result: "allocated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := shareClaim("c")
			if tc.mutate != nil {
				tc.mutate(c)
			}
			req, result, why := draRequest(pod, claimsOf{c.Name: c})
			if tc.want == nil {
				if req != nil || !strings.Contains(why, tc.why) || result != tc.result {
					t.Fatalf("narrowed %+v (%q, %q), want not narrowed because of %q (%s)", req, why, result, tc.why, tc.result)
				}
				return
			}
			if req == nil || len(req.Containers) != 1 || req.Containers[0] != *tc.want {
				t.Fatalf("request %+v (%s), want one container %+v", req, why, *tc.want)
			}
		})
	}
}

type claimsOf map[string]*resourceapi.ResourceClaim

func (c claimsOf) Get(_, name string) (*resourceapi.ResourceClaim, error) {
	if cl, ok := c[name]; ok {
		return cl, nil
	}
	return nil, fmt.Errorf("claim %s not found", name)
}

// draCluster is n DRA nodes of 2 GPUs each, with their slices, and the
// DeviceClasses, in kube-scheduler running the shipped profile.
func draCluster(t *testing.T, nodes []*corev1.Node, extra ...runtime.Object) *testScheduler {
	t.Helper()
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n, draSlice(t, n))
	}
	ts := newTestScheduler(t, nil, append(objs, extra...)...)
	if err := dra.ApplyManifests(ts.ctx, ts.client, deploy.DRADeviceClasses); err != nil {
		t.Fatal(err)
	}
	return ts
}

func (ts *testScheduler) createClaim(c *resourceapi.ResourceClaim) {
	ts.t.Helper()
	if _, err := ts.client.ResourceV1().ResourceClaims(c.Namespace).Create(ts.ctx, c, metav1.CreateOptions{}); err != nil {
		ts.t.Fatal(err)
	}
	testenv.WaitFor(ts.t, "claim "+c.Name+" seen by the scheduler", 10*time.Second, func() bool {
		_, err := ts.plugin.handle.SharedDRAManager().ResourceClaims().Get(c.Namespace, c.Name)
		return err == nil
	})
}

// A pod whose claim the core understands is narrowed to the node
// policy's best Candidates DRA nodes (binpack: the one whose GPU a claim
// already uses first), not handed to the allocator on every node.
func TestDRAClaimsNarrowed(t *testing.T) {
	var nodes []*corev1.Node
	for i := range Candidates + 4 {
		nodes = append(nodes, draNode(fmt.Sprintf("dra-%02d", i), 2))
	}
	ts := draCluster(t, nodes, heldShare("dra-17"))
	c := shareClaim("c")
	ts.createClaim(c)
	if node, msg := ts.schedule(claimPod("p", c.Name, nil)); node != "dra-17" {
		t.Fatalf("pod placed on %q (%s), want dra-17, whose GPU a claim already uses", node, msg)
	}
	// The next pod's PreFilter (the scheduler's snapshot of the nodes
	// now taken): 16 candidates, dra-17 first.
	c2 := shareClaim("c2")
	ts.createClaim(c2)
	cs := framework.NewCycleState()
	res, st := ts.plugin.PreFilter(context.Background(), cs, claimPod("p2", c2.Name, nil), nil)
	if st != nil {
		t.Fatalf("PreFilter of a share-claim pod: %v", st)
	}
	if res.AllNodes() || res.NodeNames.Len() != Candidates || !res.NodeNames.Has("dra-17") {
		t.Fatalf("candidates %v, want %d nodes with dra-17", res, Candidates)
	}
	if d := readDRACycle(cs); d == nil || d.scores["dra-17"] != 100 {
		t.Fatalf("DRA ranking %+v, want dra-17 first", d)
	}
	before, err := testutil.GetCounterMetricValue(claimPodsTotal.WithLabelValues("narrowed"))
	if err != nil {
		t.Fatal(err)
	}
	ts.plugin.PreFilter(context.Background(), framework.NewCycleState(), claimPod("p3", c2.Name, nil), nil)
	if after, _ := testutil.GetCounterMetricValue(claimPodsTotal.WithLabelValues("narrowed")); after != before+1 {
		t.Errorf("%s{result=narrowed} went from %v to %v for one narrowed pod", "tessera_scheduler_claim_pods_total", before, after)
	}
}

// A narrowed claim pod whose candidates all fail another plugin's Filter
// (here NodeResourcesFit: the candidates lack the CPU it asks) is retried
// at once over every node and bound where it fits.
func TestDRANarrowedRetriedOverAllNodes(t *testing.T) {
	var nodes []*corev1.Node
	for i := range Candidates {
		n := draNode(fmt.Sprintf("a-%02d", i), 1)
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourcePods: resource.MustParse("110")}
		nodes = append(nodes, n)
	}
	nodes = append(nodes, draNode("z-roomy", 1)) // sorts last among equals
	ts := draCluster(t, nodes)
	c := shareClaim("c")
	ts.createClaim(c)
	pod := claimPod("p", c.Name, nil)
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	ts.create(pod)
	if node := ts.waitBound(pod.Namespace, pod.Name); node != "z-roomy" {
		t.Fatalf("pod bound to %s, want z-roomy, the only node with its CPU", node)
	}
	if ev := ts.events("p", "FailedScheduling"); len(ev) != 1 || !strings.Contains(ev[0], NarrowedRetry) {
		t.Fatalf("FailedScheduling events %q, want one: the narrowed attempt's %q", ev, NarrowedRetry)
	}
}
