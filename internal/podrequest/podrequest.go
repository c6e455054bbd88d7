// Package podrequest turns a Pod into a placement.Request: the GPU
// resources and annotations kubeobj reads, with kubeobj's defaults, and the
// pod's effective CPU and memory requests. The scheduler plugin and the
// webhook both call it, so what the webhook admits is exactly what the
// scheduler places.
package podrequest

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Container converts one container's defaulted resources (kubeobj.Defaulted)
// into the core's container request.
func Container(name string, r kubeobj.Resources) placement.Container {
	return placement.Container{
		Name:          name,
		GPUs:          int(r.GPUMilli / 1000),
		MemoryMiB:     r.MemoryMiB,
		MemoryPercent: int(r.MemoryPercent),
		Cores:         int(r.Cores),
		CeilingMiB:    r.CeilingMiB,
		MIGProfile:    r.MIGProfile,
	}
}

// FromPod returns the pod's placement request: per container (init
// containers included) the GPU count, memory and cores with the defaults of
// kubeobj.Defaulted applied, the pod-wide selectors and policies from its
// annotations (HAMi keys accepted), and its effective CPU and memory
// requests. The request is validated; errors name the container, the
// field, the value and the limit.
func FromPod(pod *corev1.Pod, names api.ResourceNames) (*placement.Request, error) {
	key := kubeobj.Key(pod)
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
		r, err := kubeobj.ReadResources(c, names)
		if err != nil {
			return placement.Container{}, fmt.Errorf("pod %s: %w", key, err)
		}
		if r, err = kubeobj.Defaulted(c.Name, r, names); err != nil {
			return placement.Container{}, fmt.Errorf("pod %s: %w", key, err)
		}
		return Container(c.Name, r), nil
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		pc, err := convert(c)
		if err != nil {
			return nil, err
		}
		if kubeobj.IsSidecar(c) {
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
		if kubeobj.IsSidecar(c) {
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
