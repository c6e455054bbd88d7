//go:build integration

package main

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// sliceDevices are the devices the node agent publishes for inv's GPUs
// (docs/dra.md, "What a GPU looks like in the slice"), with the
// attributes and capacities the views read. The node agent's builder
// (internal/nodeagent/dra.Devices) links NVML, which this binary does
// not.
func sliceDevices(inv *api.NodeInventory) []resourceapi.Device {
	var out []resourceapi.Device
	for _, g := range inv.GPUs {
		sharing := "shared"
		if g.Sharing == api.SharingExclusive {
			sharing = "exclusive"
		}
		d := resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", g.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				api.AttrType: {StringValue: ptr.To(api.AttrTypeGPU)}, api.AttrUUID: {StringValue: ptr.To(g.UUID)},
				api.AttrIndex: {IntValue: ptr.To(int64(g.Index))}, api.AttrProductName: {StringValue: ptr.To(g.Model)},
				api.AttrSharing: {StringValue: ptr.To(sharing)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				api.CapacityMemory: {Value: *resource.NewQuantity(g.MemoryMiB<<20, resource.BinarySI)},
				api.CapacityCores:  {Value: *resource.NewQuantity(api.MaxCores, resource.DecimalSI)},
				api.CapacityShares: {Value: *resource.NewQuantity(int64(g.MaxShares), resource.DecimalSI)},
			},
		}
		if sharing == "shared" {
			d.AllowMultipleAllocations = ptr.To(true)
		}
		out = append(out, d)
	}
	return out
}

// draWorkload adds TestGolden's DRA part (docs/dra.md): node gpu-d
// (2× A100 40 GB in mode dra, 4 shares, with its inventory) and node
// gpu-e (1× H100 80 GB known only from its ResourceSlice), both
// publishing the node agent's devices (dra.Devices), and in namespace
// dra, with allocations as the scheduler writes them:
//   - pod pair: a ResourceClaimTemplate (8 GiB, 20% cores) shared by its
//     two containers (claim pair-gpu on gpu-d's GPU 0);
//   - pods reader-1 and reader-2: one pre-created claim shared-gpu
//     (class gpu.nvidia.com, 16 GiB) on gpu-d's GPU 0;
//   - pod frac: a fractional claim with a CEL selector (10 GiB, 50%) on
//     gpu-d's GPU 1;
//   - pod whole-dra: a claim asking no capacity, gpu-e's GPU whole;
//   - pod waiting (pending): a template asking 32 GiB, more than any
//     GPU has free; pod lost (pending): its template does not exist;
//     pod queued (pending): 12 GiB and 40% fit both GPUs of gpu-d.
func draWorkload(ctx context.Context, t *testing.T, c kubernetes.Interface, names api.ResourceNames) {
	t.Helper()
	d := fixtures.Inventory("gpu-d", 2, "NVIDIA A100-SXM4-40GB", 40960, 4)
	d.Mode = api.ModeDRA
	if _, err := c.CoreV1().Nodes().Create(ctx, fixtures.Node("gpu-d", d, names), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-e"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e := fixtures.Inventory("gpu-e", 1, "NVIDIA H100 80GB HBM3", 81559, 1)
	e.GPUs[0].Sharing = api.SharingExclusive
	for node, inv := range map[string]*api.NodeInventory{"gpu-d": d, "gpu-e": e} {
		slice := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: node + "-" + api.DRADriverName},
			Spec: resourceapi.ResourceSliceSpec{Driver: api.DRADriverName, NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: sliceDevices(inv)},
		}
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ns := "dra"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := func(class string, mem, cores string, selector string) resourceapi.ResourceClaimSpec {
		req := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
		if mem != "" {
			req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem)}}
			if cores != "" {
				req.Capacity.Requests[api.CapacityCores] = resource.MustParse(cores)
			}
		}
		if selector != "" {
			req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
		}
		return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}
	}
	for name, s := range map[string]resourceapi.ResourceClaimSpec{
		"two-containers": spec(api.DeviceClassGPU, "8Gi", "20", ""),
		"large":          spec(api.DeviceClassGPU, "32Gi", "", ""),
		"small":          spec(api.DeviceClassNVIDIA, "12Gi", "40", ""),
	} {
		tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: s}}
		if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// pod creates a pod whose containers use the pod claim "gpu" (from
	// template tpl, or naming claim).
	pod := func(name, node, tpl, claim string, containers ...string) *corev1.Pod {
		pc := corev1.PodResourceClaim{Name: "gpu"}
		if tpl != "" {
			pc.ResourceClaimTemplateName = ptr.To(tpl)
		} else {
			pc.ResourceClaimName = ptr.To(claim)
		}
		p := fixtures.MakePod().Namespace(ns).Name(name).Node(node).Obj()
		p.Spec.Containers = nil
		for _, ct := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: ct, Image: "cuda",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}})
		}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{pc}
		got, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if tpl != "" && node != "" {
			got.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(name + "-gpu")}}
		}
		if node != "" {
			got.Status.Phase = corev1.PodRunning
		}
		if got, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	// claim creates an allocated claim on node's device (mem "": whole)
	// reserved for pods.
	share := 0
	claim := func(name string, s resourceapi.ResourceClaimSpec, node, device, mem, cores string, pods ...*corev1.Pod) {
		cl, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: s}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		res := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: api.DRADriverName, Pool: node, Device: device}
		if mem != "" {
			share++
			res.ShareID = ptr.To(types.UID("00000000-0000-4000-8000-00000000000" + string(rune('0'+share))))
			res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem),
				api.CapacityCores: resource.MustParse(cores), api.CapacityShares: resource.MustParse("1")}
		}
		cl.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{res}}}
		for _, p := range pods {
			cl.Status.ReservedFor = append(cl.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
		}
		if _, err := c.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pair := pod("pair", "gpu-d", "two-containers", "", "a", "b")
	claim("pair-gpu", spec(api.DeviceClassGPU, "8Gi", "20", ""), "gpu-d", "gpu-0", "8Gi", "20", pair)
	r1 := pod("reader-1", "gpu-d", "", "shared-gpu", "main")
	r2 := pod("reader-2", "gpu-d", "", "shared-gpu", "main")
	claim("shared-gpu", spec(api.DeviceClassNVIDIA, "16Gi", "", ""), "gpu-d", "gpu-0", "16Gi", "0", r1, r2)
	frac := pod("frac", "gpu-d", "", "frac-gpu", "main")
	claim("frac-gpu", spec(api.DeviceClassGPU, "10Gi", "50", `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("16Gi")) >= 0`), "gpu-d", "gpu-1", "10Gi", "50", frac)
	whole := pod("whole-dra", "gpu-e", "", "whole-gpu", "main")
	claim("whole-gpu", spec(api.DeviceClassGPU, "", "", ""), "gpu-e", "gpu-0", "", "", whole)
	pod("waiting", "", "large", "", "main")
	pod("lost", "", "nope", "", "main")
	pod("queued", "", "small", "", "main")
}
