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
	// DeviceListStrategy is how the cluster's node agents pass GPUs to the
	// container runtime ("" is envvar). Under envvar a pod's environment
	// selects devices: the webhook refuses the device-selecting variables
	// in pods that hold GPUs and in pods that hold none, and keeps
	// envFrom's invisible keys from setting them (isolation.go). Under
	// cdi-cri and volume-mounts the runtime must ignore the environment of
	// unprivileged containers (docs/security.md), and the webhook admits
	// them.
	DeviceListStrategy api.DeviceListStrategy
	// UnprefixedEnvFrom says when a GPU pod may import variables through
	// envFrom without a prefix ("" is EnvFromAuto: where the environment
	// selects no device).
	UnprefixedEnvFrom EnvFromRule
	// AllowUnprefixedEnvFrom is UnprefixedEnvFrom EnvFromAllow (the
	// webhook's earlier flag, kept).
	AllowUnprefixedEnvFrom bool
	// Audit turns isolation findings (the settings under which a pod's
	// GPU share cannot be held: isolation.go) into admission warnings, an
	// event and a metric instead of refusals, so a platform team can roll
	// the webhook out on a live cluster first. Requests the scheduler
	// cannot honour and record writes are refused either way.
	Audit bool
	// Report, if set, is told of every isolation finding of an admitted
	// or refused pod (audit.go: the metric and, in audit mode, the
	// event).
	Report func(pod *corev1.Pod, findings field.ErrorList, audited bool)
	// MIGShareMiB returns the most memory a share asking memMiB (or
	// memPercent of a GPU) and cores percent is given as a MIG device on
	// any node of the cluster, 0 when no node gives shares MIG devices
	// (quota.go); nil: none.
	MIGShareMiB func(memMiB, memPercent int64, cores int) int64
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

// Validate checks a pod that names GPU resources, and, where the pod's
// environment selects devices, a pod that holds none (deviceEnvFindings).
// Fractional GPU counts below 1 pass (the mutation converts them);
// everything else must be what the scheduler can place. In audit mode
// the isolation findings are not among the errors (check returns them
// apart).
func (p *Admission) Validate(pod *corev1.Pod) field.ErrorList {
	errs, findings := p.check(pod, false)
	if p.Audit {
		return errs
	}
	return append(errs, findings...)
}

// check returns what is wrong with a pod: errs, refused whatever the mode
// (requests the scheduler cannot honour), and the isolation findings
// (isolation.go), refused unless in audit mode. claimGPU says the pod
// holds GPUs through ResourceClaims (the caller read them: draquota.go).
func (p *Admission) check(pod *corev1.Pod, claimGPU bool) (errs, findings field.ErrorList) {
	names := kubeobj.RequestsGPU(pod, p.Names)
	asks := names && p.asksGPU(pod)
	if names {
		if asks && pod.Spec.NodeName != "" {
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
	}
	switch {
	case asks || claimGPU:
		findings = append(p.injectionErrors(pod), p.isolationErrors(pod)...)
	default:
		findings = p.deviceEnvFindings(pod)
	}
	if claimGPU {
		if _, ok := pod.Annotations[api.AnnotationPreload]; ok {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "annotations").Key(api.AnnotationPreload),
				"declared preloads are written by the device plugin, which does not serve ResourceClaims; set LD_PRELOAD in the container's env instead"))
		}
	}
	if len(errs) > 0 || !asks {
		return errs, findings
	}
	// Anything else the placement core would refuse (GPU counts, limits
	// on containers), in its words.
	if _, err := podrequest.FromPod(pod, p.Names); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("spec"), "", err.Error()))
	}
	return errs, findings
}

// asksGPU reports whether some container of the pod asks for a GPU once
// its resources are defaulted: a count of 0 alone (nvidia.com/gpu: 0)
// asks for none. A container whose resources do not read asks (its error
// is reported).
func (p *Admission) asksGPU(pod *corev1.Pod) bool {
	for _, ref := range containers(pod) {
		r, err := kubeobj.ReadResources(ref.c, p.Names)
		if err != nil {
			return true
		}
		if !r.Any() {
			continue
		}
		d, err := kubeobj.Defaulted(ref.c.Name, r, p.Names)
		if err != nil || d.GPUMilli > 0 {
			return true
		}
	}
	return false
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
// requests and limits. A container that names GPU resources but asks for
// none (nvidia.com/gpu: 0) has them removed: a kubelet whose device
// plugin offers no device of the resource (a MIG or DRA node) would
// reject it for good ("no healthy devices present"). It reports whether
// anything changed. The pod must be valid (Validate).
func (p *Admission) Mutate(pod *corev1.Pod) (*corev1.Pod, bool, error) {
	out, changed, _, err := p.mutate(pod, false)
	return out, changed, err
}

// mutate is Mutate, with the warnings to return to the client; claimGPU
// says the pod holds GPUs through ResourceClaims.
func (p *Admission) mutate(pod *corev1.Pod, claimGPU bool) (*corev1.Pod, bool, []string, error) {
	out := pod.DeepCopy()
	changed := false
	var warnings []string
	asks := p.asksGPU(out)
	if kubeobj.RequestsGPU(out, p.Names) {
		if asks && (out.Spec.SchedulerName == "" || out.Spec.SchedulerName == corev1.DefaultSchedulerName) {
			out.Spec.SchedulerName = p.SchedulerName
			changed = true
		}
		c, w, err := p.mutateResources(out, true)
		if err != nil {
			return nil, false, nil, err
		}
		changed = changed || c
		warnings = append(warnings, w...)
	}
	if !asks && !claimGPU {
		if w := p.voidDeviceEnv(out); len(w) > 0 {
			changed = true
			warnings = append(warnings, w...)
		}
	}
	claims, err := p.mutateClaims(out) // draquota.go
	if err != nil {
		return nil, false, nil, err
	}
	return out, changed || claims, warnings, nil
}

// mutateResources defaults the GPU resources of every container of pod
// (as writeResources writes them) and removes those of a container that
// asks for no GPU; charge also writes the GPU memory quota charge
// (quota.go; pod templates carry none: their pods are charged).
func (p *Admission) mutateResources(pod *corev1.Pod, charge bool) (bool, []string, error) {
	changed := false
	var warnings []string
	for _, ref := range containers(pod) {
		r, err := kubeobj.ReadResources(ref.c, p.Names)
		if err != nil {
			return false, nil, err
		}
		if !r.Any() {
			continue
		}
		d, err := kubeobj.Defaulted(ref.c.Name, r, p.Names)
		if err != nil {
			return false, nil, err
		}
		if d.GPUMilli == 0 {
			if p.stripGPUResources(ref.c) {
				changed = true
				warnings = append(warnings, fmt.Sprintf("tessera: %s: removed GPU resources of 0: the container asks for no GPU", ref.path.Child("resources")))
			}
			continue
		}
		if p.writeResources(ref.c, d) {
			changed = true
		}
		if charge && p.writeQuotaCharge(ref.c, d) { // quota.go
			changed = true
		}
	}
	return changed, warnings, nil
}

// stripGPUResources removes every GPU resource (p.gpuNamesOf) from c's
// requests and limits.
func (p *Admission) stripGPUResources(c *corev1.Container) bool {
	changed := false
	for _, n := range p.gpuNamesOf(c) {
		for _, list := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			if _, ok := list[corev1.ResourceName(n)]; ok {
				delete(list, corev1.ResourceName(n))
				changed = true
			}
		}
	}
	return changed
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
