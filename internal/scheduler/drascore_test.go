package scheduler

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draSlice is the ResourceSlice the node agent publishes for a node in
// mode dra (dra.Devices on its inventory).
func draSlice(t *testing.T, node *corev1.Node) *resourceapi.ResourceSlice {
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

// Pods whose claims DynamicResources allocates on DRA nodes are ranked by
// the node policy: binpack sends them to the node whose GPUs claims
// already use (one of four otherwise equal nodes), a pod asking spread
// to an empty one.
func TestDRAClaimsPacked(t *testing.T) {
	var objs []runtime.Object
	for i := range 4 {
		n := draNode(fmt.Sprintf("dra-%d", i), 2)
		objs = append(objs, n, draSlice(t, n))
	}
	// A claim already allocated on dra-2's first GPU.
	held := shareClaim("held")
	held.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: api.DRADriverName, Pool: "dra-2", Device: dra.DeviceName(0), ShareID: ptr.To(types.UID("share-held")),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			api.CapacityMemory: resource.MustParse("10Gi"), api.CapacityCores: resource.MustParse("25"),
			api.CapacityShares: resource.MustParse("1"), api.CapacityNVIDIAMemory: resource.MustParse("0"),
		},
	}}}}
	objs = append(objs, held)
	ts := newTestScheduler(t, nil, objs...)
	if err := dra.ApplyManifests(ts.ctx, ts.client, deploy.DRADeviceClasses); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c := shareClaim(fmt.Sprintf("c%d", i))
		if _, err := ts.client.ResourceV1().ResourceClaims(c.Namespace).Create(ts.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if node, msg := ts.schedule(claimPod(fmt.Sprintf("p%d", i), c.Name, nil)); node != "dra-2" {
			t.Fatalf("pod p%d with a share claim placed on %q (%s), want dra-2, whose GPU claims already use", i, node, msg)
		}
	}
	// dra-2 is the fullest; a pod asking spread goes elsewhere.
	c := shareClaim("spread")
	if _, err := ts.client.ResourceV1().ResourceClaims(c.Namespace).Create(ts.ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if node, msg := ts.schedule(claimPod("spread", c.Name, map[string]string{api.AnnotationNodePolicy: string(api.NodeSpread)})); node == "" || node == "dra-2" {
		t.Fatalf("pod asking node policy spread placed on %q (%s), want an empty node", node, msg)
	}
}
