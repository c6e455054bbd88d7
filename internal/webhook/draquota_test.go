package webhook

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// fakeClaims is a ClaimReader over objects in memory, by "ns/name".
type fakeClaims struct {
	templates map[string]*resourceapi.ResourceClaimTemplate
	claims    map[string]*resourceapi.ResourceClaim
	pods      []corev1.Pod
	quota     map[string]bool
}

func newFakeClaims() *fakeClaims {
	return &fakeClaims{templates: map[string]*resourceapi.ResourceClaimTemplate{}, claims: map[string]*resourceapi.ResourceClaim{}, quota: map[string]bool{}}
}

func (f *fakeClaims) Template(_ context.Context, ns, name string) (*resourceapi.ResourceClaimTemplate, error) {
	if t, ok := f.templates[ns+"/"+name]; ok {
		return t, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaimtemplates"), name)
}

func (f *fakeClaims) Claim(_ context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
	if c, ok := f.claims[ns+"/"+name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
}

func (f *fakeClaims) Pods(_ context.Context, ns string) ([]corev1.Pod, error) {
	var out []corev1.Pod
	for _, p := range f.pods {
		if p.Namespace == ns {
			out = append(out, p)
		}
	}
	return out, nil
}

func (f *fakeClaims) MemoryQuota(_ context.Context, ns string) (bool, error) { return f.quota[ns], nil }

func (f *fakeClaims) template(ns, name string, spec resourceapi.ResourceClaimSpec) {
	f.templates[ns+"/"+name] = &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
}

func claimAdmission(f *fakeClaims) *Admission {
	p := testAdmission()
	p.Claims = f
	return p
}

// memSpec asks count GPUs of Tessera's class with mem each ("": the GPUs
// whole).
func memSpec(count int64, mem string) resourceapi.ResourceClaimSpec {
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: api.DeviceClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	if mem != "" {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem)}}
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}
}

// prioritized is a claim spec whose request "gpu" is a prioritized list
// of the alternatives' (single) requests.
func prioritized(alts ...resourceapi.ResourceClaimSpec) resourceapi.ResourceClaimSpec {
	r := resourceapi.DeviceRequest{Name: "gpu"}
	for i, a := range alts {
		e := a.Devices.Requests[0].Exactly
		r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: string(rune('a' + i)), DeviceClassName: e.DeviceClassName,
			AllocationMode: e.AllocationMode, Count: e.Count, Capacity: e.Capacity})
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}}}
}

// withTemplateClaim makes p's container main use pod claim "gpu" from
// template tpl.
func withTemplateClaim(p *corev1.Pod, ns, tpl string) *corev1.Pod {
	p.Namespace = ns
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(tpl)}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	return p
}

// claimsPod is a pod without device-plugin resources whose container
// main uses pod claim "gpu" from template tpl.
func claimsPod(ns, tpl string) *corev1.Pod { return withTemplateClaim(pod(nil), ns, tpl) }

// generatedClaim is the claim the resourceclaim controller generates for
// pod claim "gpu" of owner.
func generatedClaim(owner *corev1.Pod, spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: owner.Namespace, Name: owner.Name + "-gpu-x7k2",
		Annotations:     map[string]string{PodClaimNameAnnotation: "gpu"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, Controller: ptr.To(true)}}},
		Spec: spec}
}

// reviewClaimCreate sends the claim's CREATE through the validating
// webhook's review.
func reviewClaimCreate(t *testing.T, p *Admission, c *resourceapi.ResourceClaim) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return p.review(&admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaim"},
		Operation: admissionv1.Create, Namespace: c.Namespace, Name: c.Name, Object: runtime.RawExtension{Raw: raw}}, false)
}

func chargeOf(c *corev1.Container) string {
	q, ok := c.Resources.Requests[QuotaMemoryResource]
	if !ok {
		return "-"
	}
	return q.String()
}

func wantDenied(t *testing.T, what string, r *admissionv1.AdmissionResponse, want ...string) {
	t.Helper()
	if r.Allowed {
		t.Errorf("%s: allowed, want a refusal saying %q", what, want)
		return
	}
	for _, w := range want {
		if !strings.Contains(r.Result.Message, w) {
			t.Errorf("%s: refusal %q does not say %q", what, r.Result.Message, w)
		}
	}
}

// TestClaimChargeHugeRefused: a prioritized list whose first alternative
// asks 4 GPUs of 4611686018435776k bytes (2^42+8 MiB each, 2^44+32 MiB in
// all, whose bytes wrapped around to a charge of 32 MiB) and whose second takes 8 GPUs whole is
// refused, naming the field, the value and the limit, in a pod's
// template and in a claim, with or without a quota; a sane prioritized
// list is charged its costliest alternative.
func TestClaimChargeHugeRefused(t *testing.T) {
	f := newFakeClaims()
	f.quota["team"] = true
	p := claimAdmission(f)
	huge := prioritized(memSpec(4, "4611686018435776k"), memSpec(8, ""))
	for _, ns := range []string{"team", "free"} {
		f.template(ns, "huge", huge)
		_, err := p.mutateClaims(claimsPod(ns, "huge"))
		if err == nil {
			t.Errorf("namespace %s: a pod whose template asks 4611686018435776k per GPU was admitted", ns)
			continue
		}
		for _, w := range []string{"spec.resourceClaims[gpu]: ResourceClaimTemplate " + ns + "/huge: spec.spec.devices.requests[0].firstAvailable[0].capacity.requests[memory]",
			"4611686018435776k", "at most 16777216 MiB (16Ti) per GPU"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("namespace %s: %q does not say %q", ns, err, w)
			}
		}
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "big"}, Spec: huge}
	wantDenied(t, "a claim asking 4611686018435776k per GPU", reviewClaimCreate(t, p, c),
		"ResourceClaim team/big: spec.devices.requests[0].firstAvailable[0].capacity.requests[memory]", "4611686018435776k", "16777216 MiB")

	// 1 GPU of 80 GiB, else 8 GPUs whole (8 × the largest GPU, 40 GiB).
	f.template("team", "either", prioritized(memSpec(1, "80Gi"), memSpec(8, "")))
	out := claimsPod("team", "either")
	if _, err := p.mutateClaims(out); err != nil {
		t.Fatal(err)
	}
	if got := chargeOf(&out.Spec.Containers[0]); got != "320Gi" {
		t.Errorf("prioritized list (80Gi, else 8 whole GPUs): charged %s, want 320Gi (the costliest)", got)
	}
}

// TestReviewClaimDevicePluginCharge: a pod with a 40 GiB device-plugin
// GPU and a 1 GiB template is charged 41 GiB; a claim generated for it
// that asks 40 GiB is refused (the 40 GiB were charged for the
// device-plugin GPU, not for claims), the 1 GiB one admitted.
func TestReviewClaimDevicePluginCharge(t *testing.T) {
	f := newFakeClaims()
	f.quota["team"] = true
	p := claimAdmission(f)
	f.template("team", "small", memSpec(1, "1Gi"))
	mixed := withTemplateClaim(pod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960"}), "team", "small")
	out, _, err := p.Mutate(mixed)
	if err != nil {
		t.Fatal(err)
	}
	if got := chargeOf(&out.Spec.Containers[0]); got != "41Gi" {
		t.Fatalf("pod with a 40960 MiB device-plugin GPU and a 1Gi claim charged %s, want 41Gi", got)
	}
	f.pods = []corev1.Pod{*out}
	wantDenied(t, "a 40Gi claim of a pod charged 40Gi for its device-plugin GPU and 1Gi for its claim",
		reviewClaimCreate(t, p, generatedClaim(out, memSpec(1, "40Gi"))),
		"may hold 40960 MiB", "charged 1024 MiB for its claims", "tessera.io/gpu-memory 41984 MiB on its app containers, less 40960 MiB for their device-plugin GPUs")
	if r := reviewClaimCreate(t, p, generatedClaim(out, memSpec(1, "1Gi"))); !r.Allowed {
		t.Errorf("the 1Gi claim the pod was charged for: refused: %s", r.Result.Message)
	}
}

// TestPluginChargeMatchesWritten: what the claim review subtracts for a
// container's device-plugin GPUs is what the mutation charged them, for
// every form (the review reads the mutated pod).
func TestPluginChargeMatchesWritten(t *testing.T) {
	p := testAdmission()
	for _, res := range []map[string]string{
		{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
		{"nvidia.com/gpumem": "8000"},
		{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"},
		{"nvidia.com/gpu": "1"},
		{"nvidia.com/gpu": "0.5"},
		{"nvidia.com/gpumem-percentage": "25"},
		{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"},
	} {
		out, _, err := p.Mutate(pod(res))
		if err != nil {
			t.Fatalf("%v: %v", res, err)
		}
		c := &out.Spec.Containers[0]
		got, err := p.pluginChargeMiB(c)
		written := quantityMiB(c.Resources.Requests[QuotaMemoryResource])
		if err != nil || got != written || written == 0 {
			t.Errorf("%v: pluginChargeMiB %d (%v), the mutation wrote %d MiB", res, got, err, written)
		}
	}
}

// TestReviewClaimWithoutQuota: in a namespace without a GPU memory quota
// a pod whose template does not exist yet is admitted uncharged, and the
// claim generated for it later is admitted too (it was refused, leaving
// the pod Pending for ever). Once the namespace has a quota, the same
// claim is checked against the pod's charge.
func TestReviewClaimWithoutQuota(t *testing.T) {
	f := newFakeClaims()
	p := claimAdmission(f)
	early := claimsPod("free", "later")
	early.Name = "early"
	if _, err := p.mutateClaims(early); err != nil {
		t.Fatalf("pod naming a missing template in a namespace without a quota: %v", err)
	}
	if got := chargeOf(&early.Spec.Containers[0]); got != "-" {
		t.Errorf("pod naming a missing template charged %s, want nothing", got)
	}
	f.pods = []corev1.Pod{*early}
	if r := reviewClaimCreate(t, p, generatedClaim(early, memSpec(1, "8Gi"))); !r.Allowed {
		t.Errorf("claim of a pod admitted before its template, no quota: refused: %s", r.Result.Message)
	}
	f.quota["free"] = true
	wantDenied(t, "the same claim once the namespace has a quota", reviewClaimCreate(t, p, generatedClaim(early, memSpec(1, "8Gi"))),
		"may hold 8192 MiB", "charged 0 MiB for its claims")
}

// TestClaimsChargedOnInitContainers: ResourceQuota counts a pod as the
// larger of its app containers' sum and each init container's request,
// while its claims are held from before the first init container: an
// init container with a 40 GiB device-plugin GPU and the pod's 10 GiB
// claim is charged 50 GiB (it was charged 40, the pod counted 40 while
// holding 50); a sidecar is counted with the app containers and keeps
// its own charge.
func TestClaimsChargedOnInitContainers(t *testing.T) {
	f := newFakeClaims()
	f.quota["team"] = true
	p := claimAdmission(f)
	f.template("team", "ten", memSpec(1, "10Gi"))
	gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("40960")}
	in := claimsPod("team", "ten")
	in.Spec.InitContainers = []corev1.Container{
		{Name: "sidecar", Image: "x", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{Limits: gpu.DeepCopy(), Requests: gpu.DeepCopy()}},
		{Name: "init", Image: "x", Resources: corev1.ResourceRequirements{Limits: gpu.DeepCopy(), Requests: gpu.DeepCopy(), Claims: []corev1.ResourceClaim{{Name: "gpu"}}}},
		{Name: "plain", Image: "x"},
	}
	out, _, err := p.Mutate(in)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{chargeOf(&out.Spec.InitContainers[0]), chargeOf(&out.Spec.InitContainers[1]), chargeOf(&out.Spec.InitContainers[2]), chargeOf(&out.Spec.Containers[0])}
	if want := []string{"40Gi", "50Gi", "-", "10Gi"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("charges (sidecar, init with a GPU, init without, app) %q, want %q", got, want)
	}
}

// TestReviewClaimIgnoresInitCharge: a charge on an init container counts
// in the quota only as the largest init request, not added to the app
// containers' sum, so it does not cover claims: a pod whose init
// container carries a 30 GiB charge it wrote itself and whose claim asks
// 10 GiB (counted 30 GiB) cannot get a 40 GiB claim.
func TestReviewClaimIgnoresInitCharge(t *testing.T) {
	f := newFakeClaims()
	f.quota["team"] = true
	p := claimAdmission(f)
	f.template("team", "ten", memSpec(1, "10Gi"))
	in := claimsPod("team", "ten")
	own := corev1.ResourceList{QuotaMemoryResource: resource.MustParse("30Gi")}
	in.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "x", Resources: corev1.ResourceRequirements{Limits: own.DeepCopy(), Requests: own.DeepCopy()}}}
	if _, err := p.mutateClaims(in); err != nil {
		t.Fatal(err)
	}
	f.pods = []corev1.Pod{*in}
	wantDenied(t, "a 40Gi claim of a pod counted 30Gi", reviewClaimCreate(t, p, generatedClaim(in, memSpec(1, "40Gi"))),
		"may hold 40960 MiB", "charged 10240 MiB for its claims")
	if r := reviewClaimCreate(t, p, generatedClaim(in, memSpec(1, "10Gi"))); !r.Allowed {
		t.Errorf("the 10Gi claim the pod was charged for: refused: %s", r.Result.Message)
	}
}
