package webhook

// The GPU memory quota for DRA claims (docs/operations.md, "Quotas"):
// Kubernetes' ResourceQuota counts a claim's devices per DeviceClass
// (<class>.deviceclass.resource.k8s.io/devices) but not the capacity a
// claim consumes, so a 20 GiB share and a whole 80 GB GPU both count 1.
// Tessera charges a pod's claims where it charges its device-plugin GPUs:
// on pod CREATE the webhook resolves every claim the pod names (its
// ResourceClaimTemplate, or the ResourceClaim it names) and writes the
// memory they may hold on the container that uses them as the
// tessera.io/gpu-memory request ResourceQuota counts. So the charge is
// exact, refused with Kubernetes' own message and safe under concurrent
// creations, as for device-plugin pods.
//
// The dodges: a claim that asks no memory takes GPUs whole and is
// charged the largest GPU; a memory request above api.MaxGPUMemoryMiB per
// GPU is refused (its charge wrapped around) and charges saturate
// (kubeobj.AddMiB, MulMiB); a claim or template missing at admission in
// a namespace with a GPU memory quota refuses the pod (its charge is
// unknown); and in such a namespace the claims created after the pod
// (generated from a template replaced since, or a named claim deleted
// and created again bigger) are checked on their CREATE against what
// their pods were charged for claims, not for device-plugin GPUs
// (reviewClaim).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// PodClaimNameAnnotation is the annotation Kubernetes' resourceclaim
// controller writes on a claim it generates from a pod's template: the
// pod's name of the claim (spec.resourceClaims[].name).
const PodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name"

// ClaimReader reads what the DRA quota charge needs, live from the API
// server (a cache could miss a template created just before its pod).
type ClaimReader interface {
	Template(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimTemplate, error)
	Claim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
	// Pods are the namespace's pods.
	Pods(ctx context.Context, namespace string) ([]corev1.Pod, error)
	// MemoryQuota reports whether a ResourceQuota of the namespace caps
	// requests.tessera.io/gpu-memory.
	MemoryQuota(ctx context.Context, namespace string) (bool, error)
}

// ClientClaims is the ClaimReader of a client.
type ClientClaims struct{ Client kubernetes.Interface }

func (c ClientClaims) Template(ctx context.Context, ns, name string) (*resourceapi.ResourceClaimTemplate, error) {
	return c.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c ClientClaims) Claim(ctx context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
	return c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c ClientClaims) Pods(ctx context.Context, ns string) ([]corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func (c ClientClaims) MemoryQuota(ctx context.Context, ns string) (bool, error) {
	l, err := c.Client.CoreV1().ResourceQuotas(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	for _, q := range l.Items {
		for _, name := range []corev1.ResourceName{quotaRequest, QuotaMemoryResource} {
			if _, ok := q.Spec.Hard[name]; ok {
				return true, nil
			}
		}
	}
	return false, nil
}

// quotaRequest is the quota's name of the charge.
const quotaRequest = corev1.ResourceName("requests." + QuotaMemoryResource)

// claimTimeout bounds the API reads of one review (the API server waits
// 5 s for the webhook).
const claimTimeout = 3 * time.Second

func (p *Admission) largest() int64 {
	if p.LargestGPUMiB != nil {
		return p.LargestGPUMiB()
	}
	return 0
}

// podClaimCharges resolves the memory each of the pod's claims may hold
// through Tessera's classes, in MiB, by spec.resourceClaims index.
// override, when set, is the claim to use for the pod claim it names
// (the claim being created). missing names what could not be read. A
// claim or template asking more memory per GPU than any GPU has is an
// error naming it, the field, the value and the limit.
func (p *Admission) podClaimCharges(ctx context.Context, pod *corev1.Pod, override *resourceapi.ResourceClaim, overrideFor string) (charges []int64, missing []string, err error) {
	largest := p.largest()
	for _, pc := range pod.Spec.ResourceClaims {
		var spec *resourceapi.ResourceClaimSpec
		var what string // the object the spec is in
		specPath := field.NewPath("spec")
		switch {
		case override != nil && pc.Name == overrideFor:
			spec = &override.Spec
			what = "ResourceClaim " + pod.Namespace + "/" + claimName(override)
		case pc.ResourceClaimName != nil:
			c, err := p.Claims.Claim(ctx, pod.Namespace, *pc.ResourceClaimName)
			if apierrors.IsNotFound(err) {
				missing = append(missing, "ResourceClaim "+*pc.ResourceClaimName)
				charges = append(charges, 0)
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("reading ResourceClaim %s/%s: %w", pod.Namespace, *pc.ResourceClaimName, err)
			}
			spec = &c.Spec
			what = "ResourceClaim " + pod.Namespace + "/" + c.Name
		case pc.ResourceClaimTemplateName != nil:
			var generated string
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					generated = *st.ResourceClaimName
				}
			}
			if generated != "" {
				if c, err := p.Claims.Claim(ctx, pod.Namespace, generated); err == nil {
					spec = &c.Spec
					what = "ResourceClaim " + pod.Namespace + "/" + c.Name
					break
				}
			}
			t, err := p.Claims.Template(ctx, pod.Namespace, *pc.ResourceClaimTemplateName)
			if apierrors.IsNotFound(err) {
				missing = append(missing, "ResourceClaimTemplate "+*pc.ResourceClaimTemplateName)
				charges = append(charges, 0)
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("reading ResourceClaimTemplate %s/%s: %w", pod.Namespace, *pc.ResourceClaimTemplateName, err)
			}
			spec = &t.Spec.Spec
			what = "ResourceClaimTemplate " + pod.Namespace + "/" + t.Name
			specPath = specPath.Child("spec")
		}
		var mib int64
		if spec != nil {
			if mib, err = kubeobj.ClaimChargeMiB(*spec, specPath, largest); err != nil {
				return nil, nil, fmt.Errorf("spec.resourceClaims[%s]: %s: %w", pc.Name, what, err)
			}
		}
		charges = append(charges, mib)
	}
	return charges, missing, nil
}

// mutateClaims adds the charge of the pod's claims to the containers
// that use them (the first app container that names a claim carries it;
// a claim no app container names, the first app container), on top of
// what writeQuotaCharge wrote for device-plugin resources, and sends a
// pod that holds GPUs through Tessera's claims to Tessera's scheduler
// when it names the default one or none: its profile ignores the charge
// (kube-scheduler's default profile would find no node with
// tessera.io/gpu-memory) and runs the DynamicResources plugin. It
// reports whether the pod changed.
func (p *Admission) mutateClaims(pod *corev1.Pod) (bool, error) {
	if len(pod.Spec.ResourceClaims) == 0 || p.Claims == nil || len(pod.Spec.Containers) == 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	charges, missing, err := p.podClaimCharges(ctx, pod, nil, "")
	if err != nil {
		return false, err
	}
	if len(missing) > 0 {
		quota, err := p.Claims.MemoryQuota(ctx, pod.Namespace)
		if err != nil {
			return false, fmt.Errorf("reading the ResourceQuotas of namespace %s: %w", pod.Namespace, err)
		}
		if quota {
			return false, fmt.Errorf("spec.resourceClaims: %s not found in namespace %s, which has a ResourceQuota on %s: create it before the pod, so that the GPU memory it may hold is charged", missing[0], pod.Namespace, quotaRequest)
		}
	}
	changed := false
	var total int64
	for _, c := range charges {
		total = kubeobj.AddMiB(total, c)
	}
	if total > 0 && (pod.Spec.SchedulerName == "" || pod.Spec.SchedulerName == corev1.DefaultSchedulerName) && p.SchedulerName != "" {
		pod.Spec.SchedulerName = p.SchedulerName
		changed = true
	}
	add := make([]int64, len(pod.Spec.Containers))
	for i, pc := range pod.Spec.ResourceClaims {
		if charges[i] == 0 {
			continue
		}
		at := 0
	find:
		for ci, c := range pod.Spec.Containers {
			for _, rc := range c.Resources.Claims {
				if rc.Name == pc.Name {
					at = ci
					break find
				}
			}
		}
		add[at] = kubeobj.AddMiB(add[at], charges[i])
	}
	for ci, mib := range add {
		if mib == 0 {
			continue
		}
		p.addClaimCharge(&pod.Spec.Containers[ci], mib)
		changed = true
	}
	// The claims are held from before the first init container starts:
	// ResourceQuota counts a pod as the larger of its app containers' sum
	// and each init container's request (plus the sidecars started before
	// it), so an init container with device-plugin GPUs is charged the
	// claims too, or it would hold them and its GPUs while the pod is
	// charged only the larger. A sidecar (restartPolicy Always) is counted
	// with the app containers, which carry the claims.
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if total == 0 || (c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways) {
			continue
		}
		if r, err := kubeobj.ReadResources(c, p.Names); err == nil && r.Any() {
			p.addClaimCharge(c, total)
			changed = true
		}
	}
	return changed, nil
}

// addClaimCharge sets c's tessera.io/gpu-memory request and limit to mib
// plus its device-plugin charge (written by writeQuotaCharge just
// before); any other value there is the pod's own, not Tessera's, and is
// replaced. Summed in MiB, saturating: writeQuotaCharge writes whole MiB.
func (p *Admission) addClaimCharge(c *corev1.Container, mib int64) {
	if r, err := kubeobj.ReadResources(c, p.Names); err == nil && r.Any() {
		mib = kubeobj.AddMiB(mib, quantityMiB(c.Resources.Requests[QuotaMemoryResource]))
	}
	q := *resource.NewQuantity(mib<<20, resource.BinarySI)
	for _, list := range []*corev1.ResourceList{&c.Resources.Limits, &c.Resources.Requests} {
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		(*list)[QuotaMemoryResource] = q
	}
}

// quantityMiB is a charge in whole MiB (rounded down; a charge too large
// for an int64 of bytes reads as MaxChargeMiB, a negative one as 0).
func quantityMiB(q resource.Quantity) int64 {
	if q.Sign() <= 0 {
		return 0
	}
	b, ok := q.AsInt64()
	if !ok {
		return kubeobj.MaxChargeMiB
	}
	return b >> 20
}

// podClaimsChargeMiB is what the pod was charged for its claims at
// admission, in MiB: the tessera.io/gpu-memory requests of its app
// containers (immutable once admitted; mutateClaims puts the claims'
// charge there, and ResourceQuota counts their sum, while it counts init
// containers only by the largest) less what their device-plugin GPU
// resources are charged (pluginChargeMiB, the charge writeQuotaCharge
// wrote), so that a claim never uses the charge of the pod's other GPUs.
// With the largest GPU changed since admission the device-plugin part
// may differ from what was charged then: a larger largest GPU makes the
// check stricter, a smaller one leaves a whole or percentage GPU the
// smaller charge it can now hold at most.
func (p *Admission) podClaimsChargeMiB(pod *corev1.Pod) (claims, total, plugin int64, err error) {
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		total = kubeobj.AddMiB(total, quantityMiB(c.Resources.Requests[QuotaMemoryResource]))
		mib, err := p.pluginChargeMiB(c)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("pod %s/%s spec.containers[%d]: %w", pod.Namespace, pod.Name, i, err)
		}
		plugin = kubeobj.AddMiB(plugin, mib)
	}
	return max(total-plugin, 0), total, plugin, nil
}

// reviewClaim checks a ResourceClaim being created against the pods that
// will use it: the pod that owns it (a claim the resourceclaim controller
// generates from the pod's template) and every pod that names it. Each
// such pod's claims, this one included, must hold no more GPU memory
// than the pod was charged for its claims at admission (its charge less
// that of its device-plugin GPUs), or the claim is refused (a template
// replaced after its pod was admitted; a named claim deleted and created
// again bigger). A claim asking more memory per GPU than any GPU has is
// refused everywhere; in a namespace without a GPU memory quota nothing
// else is checked (mutateClaims admits pods there whose claims do not
// exist yet, uncharged).
func (p *Admission) reviewClaim(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create || req.SubResource != "" || p.Claims == nil {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(req.Object.Raw, &claim); err != nil {
		return deny(http.StatusBadRequest, fmt.Sprintf("decoding the ResourceClaim: %v", err))
	}
	if claim.Namespace == "" {
		claim.Namespace = req.Namespace
	}
	charge, err := kubeobj.ClaimChargeMiB(claim.Spec, field.NewPath("spec"), p.largest())
	if err != nil {
		return deny(http.StatusUnprocessableEntity, fmt.Sprintf("ResourceClaim %s/%s: %v", claim.Namespace, claimName(&claim), err))
	}
	if charge == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	quota, err := p.Claims.MemoryQuota(ctx, claim.Namespace)
	if err != nil {
		return deny(http.StatusInternalServerError, fmt.Sprintf("reading the ResourceQuotas of namespace %s: %v", claim.Namespace, err))
	}
	if !quota {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	pods, err := p.Claims.Pods(ctx, claim.Namespace)
	if err != nil {
		return deny(http.StatusInternalServerError, fmt.Sprintf("reading the pods of namespace %s: %v", claim.Namespace, err))
	}
	owner := ""
	for _, o := range claim.OwnerReferences {
		if o.Kind == "Pod" && o.APIVersion == "v1" && o.Controller != nil && *o.Controller {
			owner = o.Name
		}
	}
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		uses := ""
		for _, pc := range pod.Spec.ResourceClaims {
			switch {
			case pc.ResourceClaimName != nil && *pc.ResourceClaimName == claim.Name && claim.Name != "":
				uses = pc.Name
			case pc.ResourceClaimTemplateName != nil && pod.Name == owner && claim.Annotations[PodClaimNameAnnotation] == pc.Name:
				uses = pc.Name
			}
		}
		if uses == "" {
			continue
		}
		charges, _, err := p.podClaimCharges(ctx, pod, &claim, uses)
		if err != nil {
			return deny(http.StatusInternalServerError, err.Error())
		}
		var sum int64
		for _, c := range charges {
			sum = kubeobj.AddMiB(sum, c)
		}
		charged, total, plugin, err := p.podClaimsChargeMiB(pod)
		if err != nil {
			return deny(http.StatusInternalServerError, err.Error())
		}
		if sum > charged {
			return deny(http.StatusForbidden, fmt.Sprintf("ResourceClaim %s/%s may hold %d MiB of GPU memory with the other claims of pod %s, which was charged %d MiB for its claims at admission (%s %d MiB on its app containers, less %d MiB for their device-plugin GPUs): a claim may not ask more than its pod was charged; delete and recreate the pod to charge it anew",
				claim.Namespace, claimName(&claim), sum, pod.Name, charged, QuotaMemoryResource, total, plugin))
		}
	}
	return &admissionv1.AdmissionResponse{Allowed: true}
}

func claimName(c *resourceapi.ResourceClaim) string {
	if c.Name != "" {
		return c.Name
	}
	return c.GenerateName + "…"
}

// claimsHoldGPUs reports whether a pod holds GPUs through its
// ResourceClaims: a claim (or the template of one) asks for a device of
// a GPU class (api.DeviceClasses: Tessera's and NVIDIA's DRA drivers). A
// claim or template that does not exist yet counts as one: it may be
// created with a GPU class after the pod, and the pod would then have
// skipped the checks. Such pods are held to the rules of GPU pods
// (isolation.go). Without a ClaimReader no claim is read (false).
func (p *Admission) claimsHoldGPUs(pod *corev1.Pod) (bool, error) {
	if len(pod.Spec.ResourceClaims) == 0 || p.Claims == nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	for _, pc := range pod.Spec.ResourceClaims {
		var spec *resourceapi.ResourceClaimSpec
		switch {
		case pc.ResourceClaimName != nil:
			c, err := p.Claims.Claim(ctx, pod.Namespace, *pc.ResourceClaimName)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			if err != nil {
				return false, fmt.Errorf("reading ResourceClaim %s/%s: %w", pod.Namespace, *pc.ResourceClaimName, err)
			}
			spec = &c.Spec
		case pc.ResourceClaimTemplateName != nil:
			t, err := p.Claims.Template(ctx, pod.Namespace, *pc.ResourceClaimTemplateName)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			if err != nil {
				return false, fmt.Errorf("reading ResourceClaimTemplate %s/%s: %w", pod.Namespace, *pc.ResourceClaimTemplateName, err)
			}
			spec = &t.Spec.Spec
		default:
			continue
		}
		if kubeobj.ClaimNamesClass(*spec, api.DeviceClasses()) {
			return true, nil
		}
	}
	return false, nil
}
