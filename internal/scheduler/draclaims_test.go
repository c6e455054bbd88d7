package scheduler

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draSlice is the ResourceSlice the node agent publishes for a node in
// mode dra (dra.Devices on its inventory).
func draSlice(t testing.TB, node *corev1.Node) *resourceapi.ResourceSlice {
	t.Helper()
	inv, err := kubeobj.Inventory(node)
	if err != nil {
		t.Fatal(err)
	}
	gpus := make([]dra.GPU, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		gpus = append(gpus, dra.GPU{GPU: g})
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node.Name + "-" + api.DRADriverName},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   api.DRADriverName,
			Pool:     resourceapi.ResourcePool{Name: node.Name, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node.Name),
			Devices:  dra.Devices(gpus, dra.System{}),
		},
	}
}

// shareClaim asks one GPU's 10 Gi of memory and 25 % of its cores.
func shareClaim(name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name, UID: types.UID("uid-claim-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: api.DeviceClassGPU,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount, // the API server's default
				Count:           1,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					api.CapacityMemory: resource.MustParse("10Gi"),
					api.CapacityCores:  resource.MustParse("25"),
				}},
			},
		}}}},
	}
}

func claimPod(name, claim string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{
			SchedulerName:  api.SchedulerName,
			Containers:     []corev1.Container{{Name: "main", Image: "pause", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}},
		},
	}
}

// heldShare is a share claim already allocated on the first GPU of the
// node (pool).
func heldShare(pool string) *resourceapi.ResourceClaim {
	held := shareClaim("held")
	held.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: api.DRADriverName, Pool: pool, Device: dra.DeviceName(0), ShareID: ptr.To(types.UID("share-held")),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			api.CapacityMemory: resource.MustParse("10Gi"), api.CapacityCores: resource.MustParse("25"),
			api.CapacityShares: resource.MustParse("1"), api.CapacityNVIDIAMemory: resource.MustParse("0"),
		},
	}}}}
	return held
}

// Pods whose claims DynamicResources allocates on DRA nodes are ranked by
// the node policy: binpack sends them to the node whose GPUs claims
// already use (one of four otherwise equal nodes), a pod asking spread
// to an empty one; both for claims the core narrows and for claims it
// does not (a CEL selector: ranked in PreScore among the nodes that fit).
func TestDRAClaimsPacked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim func(name string) *resourceapi.ResourceClaim
	}{
		{"narrowed", shareClaim},
		{"not narrowed", func(name string) *resourceapi.ResourceClaim {
			c := shareClaim(name)
			c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.capacity["gpu.tessera.io"].memory.compareTo(quantity("16Gi")) >= 0`}}}
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []*corev1.Node
			for i := range 4 {
				nodes = append(nodes, draNode(fmt.Sprintf("dra-%d", i), 2))
			}
			ts := draCluster(t, nodes, heldShare("dra-2"))
			for i := range 3 {
				c := tc.claim(fmt.Sprintf("c%d", i))
				ts.createClaim(c)
				if node, msg := ts.schedule(claimPod(fmt.Sprintf("p%d", i), c.Name, nil)); node != "dra-2" {
					t.Fatalf("pod p%d with a share claim placed on %q (%s), want dra-2, whose GPU claims already use", i, node, msg)
				}
			}
			// dra-2 is the fullest; a pod asking spread goes elsewhere.
			c := tc.claim("spread")
			ts.createClaim(c)
			if node, msg := ts.schedule(claimPod("spread", c.Name, map[string]string{api.AnnotationNodePolicy: string(api.NodeSpread)})); node == "" || node == "dra-2" {
				t.Fatalf("pod asking node policy spread placed on %q (%s), want an empty node", node, msg)
			}
		})
	}
}

// BenchmarkDRANarrowing measures the plugin's own work for one pod with a
// share claim (10 Gi, 25 % of the cores) on 5,000 DRA nodes × 8 GPUs:
// reading the claims' allocated state into the model (refresh) and the
// search for the candidates (through the model's memo). Each timed pod
// is allocated (untimed) on the first GPU with room of its best
// candidate, as the allocator would, so the state grows to b.N claims
// packed as the cluster fills.
//
//	go test -run '^$' -bench DRANarrowing -benchtime 2000x -cpu 1 ./internal/scheduler/
func BenchmarkDRANarrowing(b *testing.B) {
	p, err := newPlugin(api.ClusterConfig{}, policies.All())
	if err != nil {
		b.Fatal(err)
	}
	for i := range 5000 {
		s := draSlice(b, draNode(fmt.Sprintf("dra-%04d", i), 8))
		p.dra.onSlice(klog.Background(), s.Name, s)
	}
	alloc := &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AggregatedCapacity: structured.ConsumedCapacityCollection{}}
	req, _, why := draRequest(claimPod("p", "c", nil), claimsOf{"c": shareClaim("c")})
	if req == nil {
		b.Fatal(why)
	}
	ctx := context.Background()
	share := shareClaim("c").Spec.Devices.Requests[0].Exactly.Capacity.Requests
	one := resource.MustParse("1")
	for b.Loop() {
		p.dra.mu.Lock()
		p.dra.refresh(alloc)
		cr, err := p.dra.cluster.Compile(req)
		if err != nil {
			b.Fatal(err)
		}
		pol := placement.Prepare(cr, placement.Binpack{})
		top := p.search(ctx, &cycleState{cr: cr, pol: pol, ranker: placement.RankerFor(cr, pol)}, p.dra.cluster.Nodes(), p.dra.memo, nil)
		p.dra.mu.Unlock()
		if len(top) == 0 {
			b.Fatal("no candidate")
		}
		b.StopTimer()
		n := p.dra.cluster.Node(top[0].name)
		for g := range n.GPUs {
			if n.GPUs[g].FreeCores() >= 25 {
				id := structured.MakeDeviceID(api.DRADriverName, n.Name, dra.DeviceName(g))
				c := alloc.AggregatedCapacity[id]
				if c == nil {
					c = structured.ConsumedCapacity{}
					alloc.AggregatedCapacity[id] = c
				}
				for k, q := range share {
					add := q.DeepCopy()
					if c[k] != nil {
						add.Add(*c[k])
					}
					c[k] = &add
				}
				add := one.DeepCopy()
				if c[api.CapacityShares] != nil {
					add.Add(*c[api.CapacityShares])
				}
				c[api.CapacityShares] = &add
				break
			}
		}
		b.StartTimer()
	}
}
