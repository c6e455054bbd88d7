// Package webhook is Tessera's mutating and validating admission webhook
// for Pods that request GPU resources. The mutation routes them to
// tessera-scheduler and writes the request defaults into the spec (so what
// the kubelet and the scheduler see agree); the validation rejects requests
// the scheduler could not honour, naming the field, the value and the limit.
package webhook

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Admission is what the webhook does to GPU pods: the rules it validates
// them by and the defaults it writes into them.
type Admission struct {
	Names api.ResourceNames
	// SchedulerName is where GPU pods are sent.
	SchedulerName string
	// LargestGPUMiB returns the memory of the largest GPU in the cluster's
	// inventories, or 0 when none is known (the check is then skipped).
	LargestGPUMiB func() int64
	// SchedulerUsers are the identities (request.userInfo.username) that
	// may set, change or remove allocation records; nil means
	// DefaultSchedulerUser. Everyone else's attempt is refused (records.go).
	SchedulerUsers []string
	// Trusted reports whether a namespace opted out of the isolation
	// checks (isolation.go); nil trusts none.
	Trusted func(namespace string) bool
	// AllowUnprefixedEnvFrom admits envFrom sources without a prefix in
	// GPU pods. Their keys are invisible at admission, so this is only
	// safe where the node agents select devices without the environment
	// (--device-list-strategy cdi-cri or volume-mounts, docs/security.md).
	AllowUnprefixedEnvFrom bool
	// ProtectedHostPaths are host paths a GPU pod may not mount, nor a
	// directory above them; nil means DefaultProtectedHostPaths.
	ProtectedHostPaths []string
	// Claims reads the pods' ResourceClaims and templates to charge them
	// to the GPU memory quota (draquota.go); nil charges no claim.
	Claims ClaimReader
}

// containerRef is one container of the pod with its field path.
type containerRef struct {
	c    *corev1.Container
	path *field.Path
}

func containers(pod *corev1.Pod) []containerRef {
	var out []containerRef
	spec := field.NewPath("spec")
	for i := range pod.Spec.InitContainers {
		out = append(out, containerRef{&pod.Spec.InitContainers[i], spec.Child("initContainers").Index(i)})
	}
	for i := range pod.Spec.Containers {
		out = append(out, containerRef{&pod.Spec.Containers[i], spec.Child("containers").Index(i)})
	}
	return out
}

// Validate checks a GPU pod. Fractional GPU counts below 1 pass (the
// mutation converts them); everything else must be what the scheduler
// can place. A pod without GPU resources is always valid.
func (p *Admission) Validate(pod *corev1.Pod) field.ErrorList {
	if !kubeobj.RequestsGPU(pod, p.Names) {
		return nil
	}
	var errs field.ErrorList
	if pod.Spec.NodeName != "" {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "nodeName"),
			fmt.Sprintf("preset to %q on a pod that requests GPU resources; such pods must be placed by %s, which records their GPU shares (the node refuses GPUs without a record)",
				pod.Spec.NodeName, p.SchedulerName)))
	}
	if _, err := api.ParsePodSelectors(pod.Annotations); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "annotations"), "", err.Error()))
	}
	largest := int64(0)
	if p.LargestGPUMiB != nil {
		largest = p.LargestGPUMiB()
	}
	for _, ref := range containers(pod) {
		errs = append(errs, p.validateContainer(ref, largest)...)
	}
	errs = append(errs, p.injectionErrors(pod)...)
	errs = append(errs, p.isolationErrors(pod)...)
	if len(errs) > 0 {
		return errs
	}
	// Anything else the placement core would refuse (GPU counts, limits
	// on containers), in its words.
	if _, err := podrequest.FromPod(pod, p.Names); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("spec"), "", err.Error()))
	}
	return errs
}

func (p *Admission) validateContainer(ref containerRef, largest int64) field.ErrorList {
	c, path := ref.c, ref.path
	var errs field.ErrorList
	res := path.Child("resources")
	gpuNames := p.gpuNamesOf(c)
	asks := false
	for _, n := range gpuNames {
		name := corev1.ResourceName(n)
		lim, hasLim := c.Resources.Limits[name]
		req, hasReq := c.Resources.Requests[name]
		if !hasLim && !hasReq {
			continue
		}
		asks = true
		switch {
		case !hasLim:
			errs = append(errs, field.Required(res.Child("limits").Key(n),
				fmt.Sprintf("GPU resources need a limit equal to the request (request is %s)", qstr(req))))
		case hasReq && req.Cmp(lim) != 0:
			errs = append(errs, field.Invalid(res.Child("requests").Key(n), qstr(req),
				fmt.Sprintf("must equal the limit %s: GPU resources cannot be overcommitted", qstr(lim))))
		}
	}
	if !asks {
		return nil
	}
	lim := res.Child("limits")
	r, err := kubeobj.ReadResources(c, p.Names)
	if err != nil {
		// kubeobj checks every value against its bound before it converts
		// it (negative, past the limit, not whole).
		return append(errs, resourceError(lim, err))
	}
	if r.HasMemory && r.HasPercent {
		errs = append(errs, field.Invalid(lim.Key(p.Names.MemoryPercentage), r.MemoryPercent,
			fmt.Sprintf("must not be set together with %s=%d; give the memory one way", p.Names.Memory, r.MemoryMiB)))
	}
	if r.HasMemory && largest > 0 && r.MemoryMiB > largest {
		errs = append(errs, field.Invalid(lim.Key(p.Names.Memory), r.MemoryMiB,
			fmt.Sprintf("exceeds the largest GPU in the cluster (%d MiB)", largest)))
	}
	errs = append(errs, p.ceilingErrors(lim, r, largest)...) // ceiling.go
	if _, err := kubeobj.Defaulted(c.Name, r, p.Names); err != nil {
		errs = append(errs, resourceError(lim, err))
	}
	return errs
}

// gpuNamesOf lists the GPU resource names a container may carry: the four
// of All and every count resource (shared rename, MIG profiles) it names.
func (p *Admission) gpuNamesOf(c *corev1.Container) []string {
	out := p.Names.All()
	seen := map[string]bool{}
	for _, n := range out {
		seen[n] = true
	}
	for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for n := range rl {
			if s := string(n); !seen[s] && p.Names.IsCountResource(s) {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}

// resourceError is kubeobj's error on a container's GPU resource as a
// field error on that resource.
func resourceError(lim *field.Path, err error) *field.Error {
	var re *kubeobj.ResourceError
	if errors.As(err, &re) {
		return field.Invalid(lim.Key(re.Resource), re.Value, re.Reason)
	}
	return field.Invalid(lim, "", err.Error())
}

// qstr prints whole quantities as plain integers ("1000", not "1k").
func qstr(q resource.Quantity) string {
	if q.MilliValue()%1000 == 0 {
		return strconv.FormatInt(q.Value(), 10)
	}
	return q.String()
}

// Message renders errors the way the API server shows them to the user.
func Message(errs field.ErrorList) string {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Mutate returns the pod as it should be admitted: sent to the Tessera
// scheduler when it names the default scheduler or none, and with every
// GPU container's resources defaulted and written as equal integer
// requests and limits. It reports whether anything changed. The pod must
// be valid (Validate).
func (p *Admission) Mutate(pod *corev1.Pod) (*corev1.Pod, bool, error) {
	if !kubeobj.RequestsGPU(pod, p.Names) {
		return pod, false, nil
	}
	out := pod.DeepCopy()
	changed := false
	if out.Spec.SchedulerName == "" || out.Spec.SchedulerName == corev1.DefaultSchedulerName {
		out.Spec.SchedulerName = p.SchedulerName
		changed = true
	}
	for _, ref := range containers(out) {
		r, err := kubeobj.ReadResources(ref.c, p.Names)
		if err != nil {
			return nil, false, err
		}
		if !r.Any() {
			continue
		}
		d, err := kubeobj.Defaulted(ref.c.Name, r, p.Names)
		if err != nil {
			return nil, false, err
		}
		if p.writeResources(ref.c, d) {
			changed = true
		}
		if p.writeQuotaCharge(ref.c, d) { // quota.go
			changed = true
		}
	}
	claims, err := p.mutateClaims(out) // draquota.go
	if err != nil {
		return nil, false, err
	}
	return out, changed || claims, nil
}

// writeResources sets the GPU entries of c's requests and limits to d.
func (p *Admission) writeResources(c *corev1.Container, d kubeobj.Resources) bool {
	count := d.CountName
	if count == "" {
		count = p.Names.GPU
	}
	want := map[string]int64{count: d.GPUMilli / 1000}
	if d.MemoryMiB > 0 {
		want[p.Names.Memory] = d.MemoryMiB
	}
	if d.MemoryPercent > 0 {
		want[p.Names.MemoryPercentage] = d.MemoryPercent
	}
	if d.HasCores {
		want[p.Names.Cores] = d.Cores
	}
	if d.CeilingMiB > 0 {
		want[p.Names.MemoryCeiling] = d.CeilingMiB
	}
	changed := false
	for _, list := range []*corev1.ResourceList{&c.Resources.Limits, &c.Resources.Requests} {
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		names := p.Names.All()
		if count != p.Names.GPU {
			names = append(names, count)
		}
		for _, n := range names {
			name := corev1.ResourceName(n)
			v, ok := want[n]
			old, had := (*list)[name]
			if !ok {
				if had {
					delete(*list, name)
					changed = true
				}
				continue
			}
			q := *resource.NewQuantity(v, resource.DecimalSI)
			if !had || old.Cmp(q) != 0 || old.String() != q.String() {
				(*list)[name] = q
				changed = true
			}
		}
	}
	return changed
}
