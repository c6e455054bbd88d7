//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draQuotaEnv is an env with two 40 GB GPU nodes the webhook has seen
// (the largest GPU is 40960 MiB) and namespace ns with a GPU memory
// quota of hard.
func draQuotaEnv(t *testing.T, ns, hard string) *env {
	e := newEnv(t)
	e.addNodes("a100", 2, 2, "NVIDIA A100-SXM4-40GB", 40960)
	testenv.WaitFor(t, "webhook to see the inventories", 30*time.Second, func() bool {
		p := fixtures.MakePod().Namespace(gpuNS).Name("probe40").Container("main", map[string]string{names.Memory: "40960"}).Obj()
		_, err := e.cp.Client.CoreV1().Pods(gpuNS).Create(context.Background(), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})
	e.quota(ns, "gpu-memory", hard)
	return e
}

func (e *env) template(ns, name string, spec resourceapi.ResourceClaimSpec) {
	e.t.Helper()
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
	if _, err := e.cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(context.Background(), tpl, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) claim(ns, name string, spec resourceapi.ResourceClaimSpec) error {
	_, err := e.cp.Client.ResourceV1().ResourceClaims(ns).Create(context.Background(), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}, metav1.CreateOptions{})
	return err
}

// draPod is a pod whose containers all use the pod claim "gpu", from
// template tpl or naming claim.
func draPod(ns, name, tpl, claim string, containers ...string) *corev1.Pod {
	pc := corev1.PodResourceClaim{Name: "gpu"}
	if tpl != "" {
		pc.ResourceClaimTemplateName = ptr.To(tpl)
	} else {
		pc.ResourceClaimName = ptr.To(claim)
	}
	p := fixtures.MakePod().Namespace(ns).Name(name).Obj()
	p.Spec.Containers = nil
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "cuda",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}})
	}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{pc}
	return p
}

// charged is the GPU memory quota charge of each container of p.
func charged(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.Containers {
		q, ok := c.Resources.Requests[webhook.QuotaMemoryResource]
		if !ok {
			out = append(out, "-")
			continue
		}
		out = append(out, q.String())
	}
	return out
}

// TestDRAGPUMemoryQuota: a 40 GiB GPU memory quota admits two pods whose
// ResourceClaimTemplates ask 20 GiB and refuses a third with Kubernetes'
// message naming the quota, the used and the asked amounts. A template
// shared by two containers of a pod is charged once.
func TestDRAGPUMemoryQuota(t *testing.T) {
	const ns = "dra-a"
	e := draQuotaEnv(t, ns, "40Gi")
	e.template(ns, "half", fixtures.ClaimSpec(api.DeviceClassGPU, "20Gi"))
	one, err := e.create(draPod(ns, "one", "half", "", "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(charged(one), " "); got != "20Gi -" {
		t.Errorf("pod one (template shared by containers a and b) charged %q, want \"20Gi -\"", got)
	}
	two, err := e.create(draPod(ns, "two", "half", "", "main"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(charged(two), " "); got != "20Gi" {
		t.Errorf("pod two charged %q, want 20Gi", got)
	}
	_, err = e.create(draPod(ns, "three", "half", "", "main"))
	if err == nil {
		t.Fatal("a third 20 GiB DRA pod was admitted over the 40 GiB quota")
	}
	for _, want := range []string{"exceeded quota: gpu-memory", "requested: requests.tessera.io/gpu-memory=20Gi", "used: requests.tessera.io/gpu-memory=40Gi", "limited: requests.tessera.io/gpu-memory=40Gi"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err.Error(), want)
		}
	}
}

// TestDRAGPUMemoryQuotaConcurrent: 50 pods whose templates ask 3 GiB,
// created at once against a 40 GiB quota: exactly 13 are admitted.
func TestDRAGPUMemoryQuotaConcurrent(t *testing.T) {
	const ns = "dra-b"
	e := draQuotaEnv(t, ns, "40Gi")
	e.template(ns, "small", fixtures.ClaimSpec(api.DeviceClassNVIDIA, "3Gi"))
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, refused := 0, 0
	var other []error
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.create(draPod(ns, fmt.Sprintf("p%02d", i), "small", "", "main"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case strings.Contains(err.Error(), "exceeded quota"):
				refused++
			default:
				other = append(other, err)
			}
		}()
	}
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("unexpected errors: %v", other)
	}
	if admitted != 13 || refused != 37 {
		t.Errorf("admitted %d, refused %d; want 13 and 37 (40 GiB / 3 GiB)", admitted, refused)
	}
	q, err := e.cp.Client.CoreV1().ResourceQuotas(ns).Get(context.Background(), "gpu-memory", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := q.Status.Used[corev1.ResourceName("requests."+webhook.QuotaMemoryResource)]
	if used.Cmp(resource.MustParse("39Gi")) != 0 {
		t.Errorf("quota used %s, want 39Gi (13 × 3 GiB)", used.String())
	}
	t.Logf("50 concurrent DRA creations: %d admitted (%s of 40Gi), %d refused", admitted, used.String(), refused)
}

// TestDRAGPUMemoryQuotaDodges: what a tenant might try to hold GPU
// memory without paying for it is charged or refused.
func TestDRAGPUMemoryQuotaDodges(t *testing.T) {
	const ns = "dra-c"
	e := draQuotaEnv(t, ns, "200Gi")
	ctx := context.Background()

	// A claim that asks no memory takes a GPU whole: charged the largest
	// GPU (40 GiB), for each pod that names it.
	if err := e.claim(ns, "whole", fixtures.ClaimSpec(api.DeviceClassGPU, "")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"whole-1", "whole-2"} {
		p, err := e.create(draPod(ns, name, "", "whole", "main"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(charged(p), " "); got != "40Gi" {
			t.Errorf("pod %s naming a claim that asks no memory charged %q, want 40Gi", name, got)
		}
	}

	// A charge the pod writes itself is replaced by Tessera's.
	e.template(ns, "eight", fixtures.ClaimSpec(api.DeviceClassGPU, "8Gi"))
	p := draPod(ns, "self-charged", "eight", "", "main")
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{webhook.QuotaMemoryResource: resource.MustParse("0")}
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{webhook.QuotaMemoryResource: resource.MustParse("0")}
	got, err := e.create(p)
	if err != nil {
		t.Fatal(err)
	}
	if c := strings.Join(charged(got), " "); c != "8Gi" {
		t.Errorf("pod writing its own charge 0 charged %q, want 8Gi", c)
	}

	// A template that does not exist yet: refused in a namespace with a
	// GPU memory quota (its charge is unknown).
	_, err = e.create(draPod(ns, "early", "later", "", "main"))
	if err == nil || !strings.Contains(err.Error(), "ResourceClaimTemplate later not found") || !strings.Contains(err.Error(), "requests.tessera.io/gpu-memory") {
		t.Errorf("pod naming a missing template: %v, want a refusal naming the template and the quota", err)
	}

	// The template replaced after its pod was admitted: the claim the
	// resourceclaim controller generates from it is refused.
	e.template(ns, "swap", fixtures.ClaimSpec(api.DeviceClassGPU, "8Gi"))
	pod, err := e.create(draPod(ns, "swapper", "swap", "", "main"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cp.Client.ResourceV1().ResourceClaimTemplates(ns).Delete(ctx, "swap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.template(ns, "swap", fixtures.ClaimSpec(api.DeviceClassGPU, "32Gi"))
	generated := func(spec resourceapi.ResourceClaimSpec) error {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "swapper-gpu-",
			Annotations:     map[string]string{webhook.PodClaimNameAnnotation: "gpu"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
			Spec: spec}
		_, err := e.cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{})
		return err
	}
	err = generated(fixtures.ClaimSpec(api.DeviceClassGPU, "32Gi"))
	if err == nil || !strings.Contains(err.Error(), "32768 MiB") || !strings.Contains(err.Error(), "charged 8192 MiB") {
		t.Errorf("claim generated from a template replaced after admission: %v, want a refusal naming 32768 and 8192 MiB", err)
	}
	if err := generated(fixtures.ClaimSpec(api.DeviceClassGPU, "8Gi")); err != nil {
		t.Errorf("the claim its pod was charged for was refused: %v", err)
	}

	// A named claim deleted and created again bigger after its pod was
	// admitted: refused.
	if err := e.claim(ns, "named", fixtures.ClaimSpec(api.DeviceClassNVIDIAGPU, "8Gi")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create(draPod(ns, "namer", "", "named", "main")); err != nil {
		t.Fatal(err)
	}
	if err := e.cp.Client.ResourceV1().ResourceClaims(ns).Delete(ctx, "named", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = e.claim(ns, "named", fixtures.ClaimSpec(api.DeviceClassNVIDIAGPU, "40Gi"))
	if err == nil || !strings.Contains(err.Error(), "charged 8192 MiB") {
		t.Errorf("named claim recreated bigger: %v, want a refusal", err)
	}
	// A claim of another driver's class is none of Tessera's business.
	if err := e.claim(ns, "other", fixtures.ClaimSpec("other.example.com", "")); err != nil {
		t.Errorf("claim of another class: %v", err)
	}

	// A pod's device-plugin GPU charge does not cover its claims: a pod
	// with a 40 GiB device-plugin GPU and a 1 GiB template is charged
	// 41 GiB; its template replaced with a 40 GiB one, the generated
	// claim is refused (it passed as covered by the 41 GiB).
	e.template(ns, "mixed", fixtures.ClaimSpec(api.DeviceClassGPU, "1Gi"))
	mp := draPod(ns, "mixed", "mixed", "", "main")
	mp.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(names.GPU): resource.MustParse("1"), corev1.ResourceName(names.Memory): resource.MustParse("40960")}
	mixed, err := e.create(mp)
	if err != nil {
		t.Fatal(err)
	}
	if c := strings.Join(charged(mixed), " "); c != "41Gi" {
		t.Errorf("pod with a 40960 MiB device-plugin GPU and a 1Gi template charged %q, want 41Gi", c)
	}
	if err := e.cp.Client.ResourceV1().ResourceClaimTemplates(ns).Delete(ctx, "mixed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.template(ns, "mixed", fixtures.ClaimSpec(api.DeviceClassGPU, "40Gi"))
	err = generatedFor(ctx, e, mixed, fixtures.ClaimSpec(api.DeviceClassGPU, "40Gi"))
	if err == nil || !strings.Contains(err.Error(), "charged 1024 MiB for its claims") || !strings.Contains(err.Error(), "less 40960 MiB for their device-plugin GPUs") {
		t.Errorf("40Gi claim of a pod charged 40Gi for its device-plugin GPU and 1Gi for claims: %v, want a refusal", err)
	}
	if err := generatedFor(ctx, e, mixed, fixtures.ClaimSpec(api.DeviceClassGPU, "1Gi")); err != nil {
		t.Errorf("the 1Gi claim the mixed pod was charged for was refused: %v", err)
	}

	// A memory request beyond any GPU (4 × 2^42+8 MiB, whose bytes
	// wrapped to a 32 MiB charge), first in a prioritized list: refused
	// naming the field, the value and the limit.
	huge := fixtures.ClaimSpec(api.DeviceClassGPU, "4611686018435776k")
	alt := huge.Devices.Requests[0].Exactly
	huge.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "huge", DeviceClassName: alt.DeviceClassName, AllocationMode: alt.AllocationMode, Count: 4, Capacity: alt.Capacity},
		{Name: "eight", DeviceClassName: api.DeviceClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 8}}}
	err = e.claim(ns, "huge", huge)
	if err == nil || !strings.Contains(err.Error(), "spec.devices.requests[0].firstAvailable[0].capacity.requests[memory]") || !strings.Contains(err.Error(), "4611686018435776k") || !strings.Contains(err.Error(), "16777216 MiB") {
		t.Errorf("claim asking 4611686018435776k per GPU: %v, want a refusal naming the field, the value and the limit", err)
	}
	e.template(ns, "huge", huge)
	if _, err := e.create(draPod(ns, "huge", "huge", "", "main")); err == nil || !strings.Contains(err.Error(), "ResourceClaimTemplate dra-c/huge: spec.spec.devices.requests[0].firstAvailable[0].capacity.requests[memory]") {
		t.Errorf("pod whose template asks 4611686018435776k per GPU: %v, want a refusal naming the template and the field", err)
	}

	// An init container with a 40 GiB device-plugin GPU holds it with the
	// pod's 10 GiB claim: charged 50 GiB, so the quota counts the pod 50
	// GiB (it counted the larger of 40 and 10).
	used := func() resource.Quantity {
		q, err := e.cp.Client.CoreV1().ResourceQuotas(ns).Get(ctx, "gpu-memory", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return q.Status.Used[corev1.ResourceName("requests."+webhook.QuotaMemoryResource)]
	}
	e.template(ns, "ten", fixtures.ClaimSpec(api.DeviceClassGPU, "10Gi"))
	ip := draPod(ns, "initgpu", "ten", "", "main")
	ip.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "cuda", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}},
		Limits: corev1.ResourceList{corev1.ResourceName(names.GPU): resource.MustParse("1"), corev1.ResourceName(names.Memory): resource.MustParse("40960")}}}}
	before := used()
	withInit, err := e.create(ip)
	if err != nil {
		t.Fatal(err)
	}
	after := used()
	after.Sub(before)
	if q := withInit.Spec.InitContainers[0].Resources.Requests[webhook.QuotaMemoryResource]; q.String() != "50Gi" || after.String() != "50Gi" {
		t.Errorf("init container with a 40960 MiB GPU and a 10Gi claim charged %s, the quota counted the pod %s; want 50Gi and 50Gi", q.String(), after.String())
	}

	// In a namespace without a GPU memory quota, a pod admitted before
	// its template exists (uncharged) gets its claim (it was refused,
	// leaving the pod Pending for ever).
	early, err := e.create(draPod(gpuNS, "early", "later", "", "main"))
	if err != nil {
		t.Fatalf("pod naming a missing template in a namespace without a quota: %v", err)
	}
	e.template(gpuNS, "later", fixtures.ClaimSpec(api.DeviceClassGPU, "8Gi"))
	if err := generatedFor(ctx, e, early, fixtures.ClaimSpec(api.DeviceClassGPU, "8Gi")); err != nil {
		t.Errorf("claim of a pod admitted before its template, namespace without a quota: %v", err)
	}
}

// generatedFor creates the claim the resourceclaim controller generates
// for pod claim "gpu" of pod.
func generatedFor(ctx context.Context, e *env, pod *corev1.Pod, spec resourceapi.ResourceClaimSpec) error {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, GenerateName: pod.Name + "-gpu-",
		Annotations:     map[string]string{webhook.PodClaimNameAnnotation: "gpu"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		Spec: spec}
	_, err := e.cp.Client.ResourceV1().ResourceClaims(pod.Namespace).Create(ctx, c, metav1.CreateOptions{})
	return err
}

// TestDRAChargedPodScheduled: a pod whose claim is charged to the GPU
// memory quota is sent to Tessera's scheduler (kube-scheduler's default
// profile would find no node with tessera.io/gpu-memory), whose
// DynamicResources plugin allocates its claim on a DRA node's
// ResourceSlice and binds it: the charge places nothing.
func TestDRAChargedPodScheduled(t *testing.T) {
	const ns = "dra-d"
	e := draQuotaEnv(t, ns, "100Gi")
	ctx := context.Background()
	c := e.cp.Client
	inv := fixtures.Inventory("dra-00", 1, "NVIDIA A100-SXM4-40GB", 40960, 4)
	inv.Mode = api.ModeDRA
	if _, err := c.CoreV1().Nodes().Create(ctx, fixtures.Node("dra-00", inv, names), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: api.DeviceClassGPU},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + api.DRADriverName + `"`}}}}}
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "dra-00-gpu"},
		Spec: resourceapi.ResourceSliceSpec{Driver: api.DRADriverName, NodeName: ptr.To("dra-00"),
			Pool: resourceapi.ResourcePool{Name: "dra-00", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0",
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{api.AttrUUID: {StringValue: ptr.To(inv.GPUs[0].UUID)}},
				Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{api.CapacityMemory: {Value: resource.MustParse("40Gi")}}}}}}
	if _, err := c.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.claim(ns, "gpu", fixtures.ClaimSpec(api.DeviceClassGPU, "")); err != nil {
		t.Fatal(err)
	}
	stop := e.startScheduler()
	defer stop()
	p, err := e.create(draPod(ns, "user", "", "gpu", "main"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(charged(p), " "); got != "40Gi" || p.Spec.SchedulerName != api.SchedulerName {
		t.Fatalf("pod charged %q with scheduler %q, want 40Gi and %s", got, p.Spec.SchedulerName, api.SchedulerName)
	}
	testenv.WaitFor(t, "the DRA pod bound", 60*time.Second, func() bool {
		got, err := c.CoreV1().Pods(ns).Get(ctx, "user", metav1.GetOptions{})
		return err == nil && got.Spec.NodeName == "dra-00"
	})
	cl, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil || cl.Status.Allocation == nil || len(cl.Status.ReservedFor) != 1 {
		t.Fatalf("claim after binding: %v, %+v", err, cl.Status)
	}
}
