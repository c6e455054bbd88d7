package webhook

// Pods that ask for Volcano's vGPU resources (volcano.sh/vgpu-*), placed by
// Volcano's scheduler on nodes whose Tessera node agent speaks Volcano's
// protocol (docs/volcano.md). The webhook does not route or mutate them
// (Volcano places them); it holds them to the same environment, mount and
// isolation rules as Tessera's GPU pods, and refuses the requests Volcano
// would grant a share for that the kubelet never asks the node about (so
// the container would run without its limit).

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/volcano"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ValidateVolcano checks a pod that asks for Volcano's vGPU resources:
// every refusal, isolation findings included (what audit mode would only
// report).
func (p *Admission) ValidateVolcano(pod *corev1.Pod) field.ErrorList {
	errs, findings := p.checkVolcano(pod)
	return append(errs, findings...)
}

// checkVolcano checks a pod that asks for Volcano's vGPU resources: errs
// are its requests the node could not serve with a limit; findings are
// the environment, mount and isolation rules of GPU pods.
func (p *Admission) checkVolcano(pod *corev1.Pod) (errs, findings field.ErrorList) {
	if !volcano.RequestsVGPU(pod) {
		return nil, nil
	}
	if kubeobj.RequestsGPU(pod, p.Names) {
		errs = append(errs, field.Forbidden(field.NewPath("spec"),
			fmt.Sprintf("asks for both Volcano's vGPU resources (volcano.sh/vgpu-*) and %s's; a pod is placed by one of Volcano and %s", p.Names.Prefix, p.SchedulerName)))
	}
	if pod.Spec.NodeName != "" {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "nodeName"),
			fmt.Sprintf("preset to %q on a pod that asks for Volcano's vGPU resources; such pods must be placed by Volcano's scheduler, whose annotations the node holds every share to (the node refuses a share without them)", pod.Spec.NodeName)))
	}
	spec := field.NewPath("spec")
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		for _, n := range api.VolcanoResources() {
			if _, ok := c.Resources.Limits[corev1.ResourceName(n)]; ok {
				errs = append(errs, field.Forbidden(spec.Child("initContainers").Index(i).Child("resources", "limits").Key(n),
					"Volcano allocates vGPUs to app containers only; an init container asking for one would never get it"))
			}
		}
	}
	for i := range pod.Spec.Containers {
		errs = append(errs, validateVolcanoContainer(&pod.Spec.Containers[i], spec.Child("containers").Index(i))...)
	}
	findings = append(p.injectionErrors(pod), p.isolationErrors(pod)...)
	return errs, findings
}

// validateVolcanoContainer checks one app container's vGPU resources:
// limits equal requests, whole bounded values (kubeobj), a GPU count
// wherever memory or cores are asked (Volcano gives a memory-only
// container one GPU, but the kubelet asks the node about vgpu-number
// only, so that container would run unlimited), and memory given one way
// and not 0 (Volcano reads 0 as the whole GPU).
func validateVolcanoContainer(c *corev1.Container, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	res := path.Child("resources")
	lim := res.Child("limits")
	asks := false
	for _, n := range api.VolcanoResources() {
		name := corev1.ResourceName(n)
		l, hasLim := c.Resources.Limits[name]
		r, hasReq := c.Resources.Requests[name]
		if !hasLim && !hasReq {
			continue
		}
		asks = true
		switch {
		case !hasLim:
			errs = append(errs, field.Required(lim.Key(n), fmt.Sprintf("vGPU resources need a limit equal to the request (request is %s)", qstr(r))))
		case hasReq && r.Cmp(l) != 0:
			errs = append(errs, field.Invalid(res.Child("requests").Key(n), qstr(r), fmt.Sprintf("must equal the limit %s", qstr(l))))
		}
	}
	if !asks || len(errs) > 0 {
		return errs
	}
	r, err := kubeobj.ReadResources(c, api.VolcanoResourceNames)
	if err != nil {
		return append(errs, resourceError(lim, err))
	}
	switch {
	case !r.HasGPU:
		errs = append(errs, field.Required(lim.Key(api.VolcanoVGPUNumber),
			fmt.Sprintf("container %q asks for vGPU memory or cores without %s: Volcano would give it one GPU, but the kubelet asks the node about %s only, so the container would run without its limit; add %s: 1",
				c.Name, api.VolcanoVGPUNumber, api.VolcanoVGPUNumber, api.VolcanoVGPUNumber)))
	case r.GPUMilli%1000 != 0:
		errs = append(errs, field.Invalid(lim.Key(api.VolcanoVGPUNumber), qstr(c.Resources.Limits[api.VolcanoVGPUNumber]), "must be a whole number of GPUs"))
	case r.GPUMilli == 0 && (r.HasMemory || r.HasPercent || r.HasCores):
		errs = append(errs, field.Invalid(lim.Key(api.VolcanoVGPUNumber), 0, "is 0 while the container asks for vGPU memory or cores"))
	}
	if r.HasMemory && r.HasPercent {
		errs = append(errs, field.Invalid(lim.Key(api.VolcanoVGPUMemoryPercentage), r.MemoryPercent,
			fmt.Sprintf("must not be set together with %s=%d (Volcano would use the percentage); give the memory one way", api.VolcanoVGPUMemory, r.MemoryMiB)))
	}
	if r.HasMemory && r.MemoryMiB == 0 {
		errs = append(errs, field.Invalid(lim.Key(api.VolcanoVGPUMemory), 0, "a GPU share needs memory: Volcano reads 0 as the whole GPU; leave it out to ask for the whole GPU"))
	}
	if r.HasPercent && r.MemoryPercent == 0 {
		errs = append(errs, field.Invalid(lim.Key(api.VolcanoVGPUMemoryPercentage), 0, "a GPU share needs memory"))
	}
	return errs
}

// reviewVolcanoClaims admits a pod that Volcano's scheduler places and
// that holds GPUs through Tessera's ResourceClaims, without the GPU
// memory charge mutateClaims writes on other such pods: Volcano counts
// every resource a pod asks against its nodes, and no node has
// tessera.io/gpu-memory, so the charge would keep the pod from ever being
// placed. In a namespace whose ResourceQuota limits that charge the pod
// is refused instead (it would hold GPU memory the quota never sees);
// Volcano's own queues quota claims (docs/volcano.md).
func (p *Admission) reviewVolcanoClaims(pod *corev1.Pod) *admissionv1.AdmissionResponse {
	if p.Claims == nil || len(pod.Spec.ResourceClaims) == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	charges, _, err := p.podClaimCharges(ctx, pod, nil, "")
	if err != nil {
		return deny(http.StatusUnprocessableEntity, err.Error())
	}
	var total int64
	for _, c := range charges {
		total = kubeobj.AddMiB(total, c)
	}
	if total == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	quota, err := p.Claims.MemoryQuota(ctx, pod.Namespace)
	if err != nil {
		return deny(http.StatusInternalServerError, fmt.Sprintf("reading the ResourceQuotas of namespace %s: %v", pod.Namespace, err))
	}
	if quota {
		return deny(http.StatusForbidden, fmt.Sprintf("spec.schedulerName: %q with Tessera's ResourceClaims in namespace %s, whose ResourceQuota limits %s: Volcano's scheduler counts that charge against its nodes, so it cannot be written on the pod; place the pod with %s, or quota Volcano's pods with a Queue",
			pod.Spec.SchedulerName, pod.Namespace, QuotaMemoryResource, p.SchedulerName))
	}
	return &admissionv1.AdmissionResponse{Allowed: true}
}
