// Package podrequest turns a Pod into a placement.Request. It is the one
// place that reads GPU resources and placement annotations from a Pod: the
// scheduler plugin and the webhook both call it, so what the webhook admits
// is exactly what the scheduler places.
package podrequest

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Key is the pod's "namespace/name", the key records and the placement
// core use.
func Key(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// Resources are one container's GPU resources as written in its spec, each
// 0 when absent. GPUMilli is the GPU count in thousandths so that the
// fractional form (0.5) can be represented before the webhook rewrites it.
type Resources struct {
	GPUMilli      int64
	MemoryMiB     int64
	MemoryPercent int64
	Cores         int64
	// Set reports which of the four were present at all.
	HasGPU, HasMemory, HasPercent, HasCores bool
}

// Any reports whether the container names any GPU resource.
func (r Resources) Any() bool { return r.HasGPU || r.HasMemory || r.HasPercent || r.HasCores }

// ReadResources returns a container's GPU resources from its limits (the
// values the kubelet enforces), falling back to requests for a resource
// that has no limit. Values other than the GPU count must be whole numbers.
func ReadResources(c *corev1.Container, names api.ResourceNames) (Resources, error) {
	var r Resources
	get := func(name string) (resource.Quantity, bool) {
		if q, ok := c.Resources.Limits[corev1.ResourceName(name)]; ok {
			return q, true
		}
		q, ok := c.Resources.Requests[corev1.ResourceName(name)]
		return q, ok
	}
	whole := func(name string, q resource.Quantity) (int64, error) {
		if q.MilliValue()%1000 != 0 {
			return 0, fmt.Errorf("container %q: %s is %s, must be a whole number", c.Name, name, q.String())
		}
		if q.Sign() < 0 {
			return 0, fmt.Errorf("container %q: %s is %s, must not be negative", c.Name, name, q.String())
		}
		return q.Value(), nil
	}
	var err error
	if q, ok := get(names.GPU); ok {
		r.HasGPU = true
		if q.Sign() < 0 {
			return r, fmt.Errorf("container %q: %s is %s, must not be negative", c.Name, names.GPU, q.String())
		}
		r.GPUMilli = q.MilliValue()
	}
	if q, ok := get(names.Memory); ok {
		r.HasMemory = true
		if r.MemoryMiB, err = whole(names.Memory, q); err != nil {
			return r, err
		}
	}
	if q, ok := get(names.MemoryPercentage); ok {
		r.HasPercent = true
		if r.MemoryPercent, err = whole(names.MemoryPercentage, q); err != nil {
			return r, err
		}
	}
	if q, ok := get(names.Cores); ok {
		r.HasCores = true
		if r.Cores, err = whole(names.Cores, q); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Defaulted returns r with the defaults filled in, the rules the webhook
// writes into the spec and the scheduler applies when it did not run:
//   - a fractional count f below 1 (nvidia.com/gpu: 0.5) becomes one GPU
//     with f of its memory (as a percentage) and f of its cores;
//   - memory or cores without a count means one GPU;
//   - a count without memory means the whole memory of each GPU (100 %).
//
// It fails for fractional counts above 1 and for fractions combined with
// explicit memory or cores, which have no single meaning.
func Defaulted(container string, r Resources, names api.ResourceNames) (Resources, error) {
	if r.GPUMilli%1000 != 0 {
		if r.GPUMilli > 1000 {
			return r, fmt.Errorf("container %q: %s is %s; a fractional GPU count must be below 1 (use whole GPUs, or one GPU with %s)",
				container, names.GPU, milliString(r.GPUMilli), names.Memory)
		}
		if r.HasMemory || r.HasPercent || r.HasCores {
			return r, fmt.Errorf("container %q: %s is %s together with %s, %s or %s; give either a fraction or explicit memory and cores",
				container, names.GPU, milliString(r.GPUMilli), names.Memory, names.MemoryPercentage, names.Cores)
		}
		pct := max(r.GPUMilli/10, 1) // thousandths to percent, at least 1 %
		r.GPUMilli, r.MemoryPercent, r.Cores = 1000, pct, pct
		r.HasPercent, r.HasCores = true, true
		return r, nil
	}
	if r.GPUMilli == 0 && (r.MemoryMiB > 0 || r.MemoryPercent > 0 || r.Cores > 0) {
		r.GPUMilli, r.HasGPU = 1000, true
	}
	if r.GPUMilli > 0 && r.MemoryMiB == 0 && r.MemoryPercent == 0 {
		r.MemoryPercent, r.HasPercent = 100, true
	}
	return r, nil
}

func milliString(m int64) string { return resource.NewMilliQuantity(m, resource.DecimalSI).String() }

// Container converts defaulted resources into the core's container request.
func (r Resources) Container(name string) placement.Container {
	return placement.Container{
		Name:          name,
		GPUs:          int(r.GPUMilli / 1000),
		MemoryMiB:     r.MemoryMiB,
		MemoryPercent: int(r.MemoryPercent),
		Cores:         int(r.Cores),
	}
}

// IsSidecar reports whether an init container keeps running beside the app
// containers (restartPolicy Always); its GPU share then adds to theirs.
func IsSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// RequestsGPU reports whether any container of the pod names a GPU
// resource under names.
func RequestsGPU(pod *corev1.Pod, names api.ResourceNames) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, rl := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for n := range rl {
					if names.IsGPUResource(string(n)) {
						return true
					}
				}
			}
		}
	}
	return false
}

// FromPod returns the pod's placement request: per container (init
// containers included) the GPU count, memory and cores with the defaults of
// Defaulted applied, the pod-wide selectors and policies from its
// annotations (HAMi keys accepted), and its effective CPU and memory
// requests. The request is validated; errors name the container, the
// field, the value and the limit.
func FromPod(pod *corev1.Pod, names api.ResourceNames) (*placement.Request, error) {
	key := Key(pod)
	sel, err := api.ParsePodSelectors(pod.Annotations)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", key, err)
	}
	req := &placement.Request{
		Pod:           key,
		IncludeModels: sel.IncludeModels,
		ExcludeModels: sel.ExcludeModels,
		IncludeUUIDs:  sel.IncludeUUIDs,
		ExcludeUUIDs:  sel.ExcludeUUIDs,
		NUMABind:      sel.NUMABind,
		NodePolicy:    sel.NodePolicy,
		GPUPolicy:     sel.GPUPolicy,
	}
	convert := func(c *corev1.Container) (placement.Container, error) {
		r, err := ReadResources(c, names)
		if err != nil {
			return placement.Container{}, fmt.Errorf("pod %s: %w", key, err)
		}
		if r, err = Defaulted(c.Name, r, names); err != nil {
			return placement.Container{}, fmt.Errorf("pod %s: %w", key, err)
		}
		return r.Container(c.Name), nil
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		pc, err := convert(c)
		if err != nil {
			return nil, err
		}
		if IsSidecar(c) {
			// Sidecars run with the app containers, so they are charged
			// with them rather than one at a time before them.
			req.Containers = append(req.Containers, pc)
		} else {
			req.InitContainers = append(req.InitContainers, pc)
		}
	}
	for i := range pod.Spec.Containers {
		pc, err := convert(&pod.Spec.Containers[i])
		if err != nil {
			return nil, err
		}
		req.Containers = append(req.Containers, pc)
	}
	req.CPUMilli, req.MemoryMiB = EffectiveCPUMemory(pod)
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return req, nil
}

// EffectiveCPUMemory is the pod's CPU (millicores) and memory (MiB, rounded
// up) request by the Kubernetes rule: the larger of the app containers'
// sum (with sidecars) and the largest init container, plus overhead.
func EffectiveCPUMemory(pod *corev1.Pod) (cpuMilli, memMiB int64) {
	var appCPU, appMem, initCPU, initMem, sideCPU, sideMem int64
	for i := range pod.Spec.Containers {
		rq := pod.Spec.Containers[i].Resources.Requests
		appCPU += rq.Cpu().MilliValue()
		appMem += rq.Memory().Value()
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		rq := c.Resources.Requests
		if IsSidecar(c) {
			sideCPU += rq.Cpu().MilliValue()
			sideMem += rq.Memory().Value()
			continue
		}
		// An init container runs beside the sidecars started before it.
		initCPU = max(initCPU, sideCPU+rq.Cpu().MilliValue())
		initMem = max(initMem, sideMem+rq.Memory().Value())
	}
	cpu := max(appCPU+sideCPU, initCPU)
	mem := max(appMem+sideMem, initMem)
	if pod.Spec.Overhead != nil {
		cpu += pod.Spec.Overhead.Cpu().MilliValue()
		mem += pod.Spec.Overhead.Memory().Value()
	}
	return cpu, (mem + (1<<20 - 1)) >> 20
}
