// Package kubeobj is the one reader of what Tessera keeps in Kubernetes
// objects: a pod's key, the GPU resources its containers ask for (and the
// defaults that complete them), its allocation record, and a node's GPU
// inventory. It depends only on the Kubernetes API types and pkg/api, so
// every component reads objects alike: the node agent's device plugin
// without linking the placement core, the scheduler and the webhook
// through podrequest, which turns what this package reads into a
// placement request.
package kubeobj

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

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
	// CeilingMiB is the memory ceiling per GPU (nvidia.com/gpumem-ceiling):
	// the most the container may use above its guarantee, MemoryMiB.
	CeilingMiB int64
	// Set reports which of the five were present at all.
	HasGPU, HasMemory, HasPercent, HasCores, HasCeiling bool
	// CountName is the resource the GPU count was read from: the GPU
	// resource, its shared rename (nvidia.com/gpu.shared) or a MIG
	// profile's (nvidia.com/mig-1g.5gb); empty when none was given.
	CountName string
	// MIGProfile is the profile of a MIG resource ("1g.5gb").
	MIGProfile string
}

// Any reports whether the container names any GPU resource.
func (r Resources) Any() bool {
	return r.HasGPU || r.HasMemory || r.HasPercent || r.HasCores || r.HasCeiling
}

// quantity is a container's value of a resource: its limit (the value the
// kubelet enforces), else its request.
func quantity(c *corev1.Container, name string) (resource.Quantity, bool) {
	if q, ok := c.Resources.Limits[corev1.ResourceName(name)]; ok {
		return q, true
	}
	q, ok := c.Resources.Requests[corev1.ResourceName(name)]
	return q, ok
}

// ResourceError is a container's GPU resource that Tessera refuses: the
// container, the resource's full name, its value as written and why. Its
// text names all four; the webhook turns it into a field error on the
// resource.
type ResourceError struct {
	Container string
	Resource  string
	Value     string
	Reason    string
}

func (e *ResourceError) Error() string {
	return fmt.Sprintf("container %q: %s is %s, %s", e.Container, e.Resource, e.Value, e.Reason)
}

// The most each GPU resource may ask. A quantity is compared with its
// bound before it is converted to an integer, so no value wraps: 2^64 +
// 1000 MiB is refused, not read as 1000 MiB.
var (
	maxGPUCount = resource.NewQuantity(api.MaxGPUsPerNode, resource.DecimalSI)
	maxMemory   = resource.NewQuantity(api.MaxGPUMemoryMiB, resource.DecimalSI)
	maxPercent  = resource.NewQuantity(100, resource.DecimalSI)
)

// bounded returns q as an integer (whole is false: in thousandths) after
// checking it is within [0, limit] and, when whole, a whole number. Every
// refusal names the unit (what), and a value written with a suffix gets
// its conversion (unitHint): GPU quantities are plain numbers.
func bounded(c *corev1.Container, name string, q resource.Quantity, limit *resource.Quantity, whole bool, what string) (int64, error) {
	fail := func(reason string) (int64, error) {
		return 0, &ResourceError{Container: c.Name, Resource: name, Value: q.String(), Reason: reason + unitHint(name, q, what)}
	}
	if q.Sign() < 0 {
		return fail(fmt.Sprintf("must not be negative (%s)", what))
	}
	if q.Cmp(*limit) > 0 {
		return fail(fmt.Sprintf("must be between 0 and %s (%s)", limit.String(), what))
	}
	if !whole {
		return q.MilliValue(), nil
	}
	if q.MilliValue()%1000 != 0 {
		return fail(fmt.Sprintf("must be a whole number (%s)", what))
	}
	return q.Value(), nil
}

// unitHint explains a quantity written with a suffix where Tessera counts
// plain numbers: for memory in MiB, the suffix read as bytes and the MiB
// to write ("4Gi is 4294967296 MiB here; for 4Gi of memory write 4096");
// for a milli suffix, that m means thousandths. "" for a plain number.
func unitHint(name string, q resource.Quantity, what string) string {
	s := q.String()
	suffix := strings.TrimLeft(s, "+-0123456789.")
	switch suffix {
	case "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei":
	default:
		return "" // an exponent (1e3): a plain number
	}
	if suffix == "" {
		return ""
	}
	unit, _, _ := strings.Cut(what, " ")
	if suffix == "m" {
		return fmt.Sprintf("; the suffix m means thousandths: %s is %s %s. %s counts %s without a suffix", s, strings.TrimRight(strings.TrimRight(decimalString(q), "0"), "."), unit, name, what)
	}
	if unit != "MiB" {
		return fmt.Sprintf("; %s counts %s as a plain number, without a suffix such as %s", name, what, suffix)
	}
	bytes, ok := q.AsInt64()
	mib := "more than " + strconv.FormatInt(api.MaxGPUMemoryMiB, 10)
	if ok && bytes >= 0 {
		mib = strconv.FormatInt((bytes+(1<<20)-1)>>20, 10)
	}
	return fmt.Sprintf("; %s counts MiB as a plain number, so %s means %s MiB here. For %s of memory write %s", name, s, decimalString(q), s, mib)
}

// decimalString is q as a plain decimal number.
func decimalString(q resource.Quantity) string {
	return q.AsDec().String()
}

// gpuMilli is the container's count of the GPU resource in thousandths.
func gpuMilli(c *corev1.Container, name string) (milli int64, has bool, err error) {
	q, ok := quantity(c, name)
	if !ok {
		return 0, false, nil
	}
	milli, err = bounded(c, name, q, maxGPUCount, false, "GPUs per node")
	return milli, true, err
}

// ReadResources returns a container's GPU resources from its limits,
// falling back to requests for a resource that has no limit. Values other
// than the GPU count must be whole numbers. Every value is checked against
// its bound before conversion (a *ResourceError names the resource, the
// value and the bound): at most api.MaxGPUsPerNode GPUs,
// api.MaxGPUMemoryMiB MiB (memory and its ceiling), 100 percent of memory
// or cores.
func ReadResources(c *corev1.Container, names api.ResourceNames) (Resources, error) {
	var r Resources
	var err error
	if r.CountName, err = countName(c, names); err != nil {
		return r, err
	}
	if r.CountName != "" {
		if r.GPUMilli, r.HasGPU, err = gpuMilli(c, r.CountName); err != nil {
			return r, err
		}
		r.MIGProfile, _ = names.MIGProfileOf(r.CountName)
	}
	read := func(name string, limit *resource.Quantity, what string, has *bool, v *int64) error {
		q, ok := quantity(c, name)
		if !ok {
			return nil
		}
		*has = true
		*v, err = bounded(c, name, q, limit, true, what)
		return err
	}
	if err := read(names.Memory, maxMemory, "MiB per GPU", &r.HasMemory, &r.MemoryMiB); err != nil {
		return r, err
	}
	if err := read(names.MemoryPercentage, maxPercent, "percent of the GPU's memory", &r.HasPercent, &r.MemoryPercent); err != nil {
		return r, err
	}
	if err := read(names.Cores, maxPercent, "percent of the GPU's compute", &r.HasCores, &r.Cores); err != nil {
		return r, err
	}
	if err := read(names.MemoryCeiling, maxMemory, "MiB per GPU", &r.HasCeiling, &r.CeilingMiB); err != nil {
		return r, err
	}
	return r, nil
}

// countName is the one device-count resource the container names (the
// GPU resource, its shared rename or a MIG profile's); two are an error.
func countName(c *corev1.Container, names api.ResourceNames) (string, error) {
	found := ""
	for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for n := range rl {
			name := string(n)
			if !names.IsCountResource(name) || name == found {
				continue
			}
			if found != "" {
				a, b := min(found, name), max(found, name)
				return "", fmt.Errorf("container %q: asks for both %s and %s; a container asks for one kind of GPU device", c.Name, a, b)
			}
			found = name
		}
	}
	return found, nil
}

// Devices is how many devices of the GPU resource gpu (e.g.
// "nvidia.com/gpu") the kubelet allocates to the container: its count,
// rounded up as the kubelet rounds, 0 when it names none. By the time a
// pod reaches a kubelet the count is whole (the webhook rewrites
// fractions, the API server accepts no others).
func Devices(c *corev1.Container, gpu string) (int64, error) {
	milli, _, err := gpuMilli(c, gpu)
	if err != nil {
		return 0, err
	}
	return (milli + 999) / 1000, nil
}

// Defaulted returns r with the defaults filled in, the rules the webhook
// writes into the spec and the scheduler applies when it did not run:
//   - a fractional count f below 1 (nvidia.com/gpu: 0.5) becomes one GPU
//     with f of its memory (as a percentage) and f of its cores;
//   - memory or cores without a count means one GPU;
//   - a count without memory means the whole memory of each GPU (100 %).
//
// It fails for fractional counts above 1 and for fractions combined with
// explicit memory or cores, which have no single meaning, and for zeros
// that would otherwise be read as something else: a memory of 0 (MiB or
// percent) is refused rather than taken as "the whole GPU", a count of 0
// with memory or cores is refused, and cores of 0 alone ask for nothing
// and are refused. A count of 0 with nothing else is "no GPU".
func Defaulted(container string, r Resources, names api.ResourceNames) (Resources, error) {
	if r.MIGProfile != "" {
		// A MIG device: its profile fixes memory and compute.
		switch {
		case r.HasMemory || r.HasPercent || r.HasCores || r.HasCeiling:
			return r, fmt.Errorf("container %q: %s together with %s, %s, %s or %s; a MIG profile fixes memory and compute", container, r.CountName, names.Memory, names.MemoryPercentage, names.Cores, names.MemoryCeiling)
		case r.GPUMilli%1000 != 0:
			return r, fmt.Errorf("container %q: %s is %s; MIG devices are whole", container, r.CountName, milliString(r.GPUMilli))
		}
		return r, nil
	}
	zero := func(name, reason string) (Resources, error) {
		return r, &ResourceError{Container: container, Resource: name, Value: "0", Reason: reason}
	}
	switch {
	case r.HasMemory && r.MemoryMiB == 0:
		return zero(names.Memory, fmt.Sprintf("a GPU share needs memory: omit %s for the whole GPU's memory, or remove the GPU resources for no GPU", names.Memory))
	case r.HasPercent && r.MemoryPercent == 0:
		return zero(names.MemoryPercentage, fmt.Sprintf("a GPU share needs memory: omit %s for the whole GPU's memory, or remove the GPU resources for no GPU", names.MemoryPercentage))
	case r.HasGPU && r.GPUMilli == 0 && (r.MemoryMiB > 0 || r.MemoryPercent > 0 || r.Cores > 0):
		return zero(names.GPU, fmt.Sprintf("but %s, %s or %s asks for a share of a GPU; set the count, or remove the GPU resources for no GPU", names.Memory, names.MemoryPercentage, names.Cores))
	case r.HasCores && r.Cores == 0 && !r.HasGPU && !r.HasMemory && !r.HasPercent:
		return zero(names.Cores, fmt.Sprintf("alone it asks for no GPU; give %s or %s with it, or remove it", names.GPU, names.Memory))
	}
	if r.HasCeiling {
		var err error
		if r, err = ceiling(container, r, names); err != nil {
			return r, err
		}
	}
	if r.GPUMilli%1000 != 0 {
		if r.GPUMilli > 1000 {
			return r, &ResourceError{Container: container, Resource: names.GPU, Value: milliString(r.GPUMilli),
				Reason: fmt.Sprintf("a fractional GPU count must be below 1 (use whole GPUs, or one GPU with %s)", names.Memory)}
		}
		if r.HasMemory || r.HasPercent || r.HasCores {
			return r, &ResourceError{Container: container, Resource: names.GPU, Value: milliString(r.GPUMilli),
				Reason: fmt.Sprintf("a fraction together with %s, %s or %s has no single meaning; give either a fraction or explicit memory and cores", names.Memory, names.MemoryPercentage, names.Cores)}
		}
		pct := max(r.GPUMilli/10, 1) // thousandths to percent, at least 1 %
		r.GPUMilli, r.MemoryPercent, r.Cores = 1000, pct, pct
		r.HasPercent, r.HasCores = true, true
		return r, nil
	}
	if r.GPUMilli == 0 && (r.MemoryMiB > 0 || r.MemoryPercent > 0 || r.Cores > 0) {
		r.GPUMilli, r.HasGPU = 1000, true
	}
	if r.HasGPU && r.CountName == "" {
		r.CountName = names.GPU
	}
	if r.GPUMilli > 0 && r.MemoryMiB == 0 && r.MemoryPercent == 0 {
		r.MemoryPercent, r.HasPercent = 100, true
	}
	return r, nil
}

// ceiling checks a memory ceiling: it qualifies a guarantee given in MiB
// (the webhook and the scheduler check it against the GPUs, which the
// container's spec does not know) and lies at or above it; equal to the
// guarantee it asks nothing more and is dropped. A share of a GPU with
// all its compute is the whole GPU, which has nothing to borrow.
func ceiling(container string, r Resources, names api.ResourceNames) (Resources, error) {
	fail := func(reason string) (Resources, error) {
		return r, &ResourceError{Container: container, Resource: names.MemoryCeiling, Value: fmt.Sprint(r.CeilingMiB), Reason: reason}
	}
	switch {
	case !r.HasMemory:
		return fail(fmt.Sprintf("a ceiling needs the guarantee below it in MiB: set %s as well", names.Memory))
	case r.CeilingMiB < r.MemoryMiB:
		return fail(fmt.Sprintf("must be at least %s (%d MiB, the guarantee)", names.Memory, r.MemoryMiB))
	case r.HasCores && r.Cores == api.MaxCores:
		return fail(fmt.Sprintf("%s=100 asks the whole GPU, which has nothing to borrow; ask fewer cores, or drop the ceiling", names.Cores))
	case r.CeilingMiB == r.MemoryMiB:
		r.CeilingMiB, r.HasCeiling = 0, false
	}
	return r, nil
}

func milliString(m int64) string { return resource.NewMilliQuantity(m, resource.DecimalSI).String() }

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

// ErrNoRecord is returned by Record for a pod without the
// api.AnnotationAllocation annotation.
var ErrNoRecord = errors.New("no " + api.AnnotationAllocation + " annotation")

// Record decodes the pod's allocation record: ErrNoRecord when it has
// none, the decoder's error (naming what is wrong) when it does not
// decode.
func Record(pod *corev1.Pod) (*api.PodAllocation, error) {
	raw, ok := pod.Annotations[api.AnnotationAllocation]
	if !ok {
		return nil, ErrNoRecord
	}
	return api.DecodeAllocation([]byte(raw))
}

// Inventory decodes the node's GPU inventory annotation. A node without
// the annotation has no inventory (nil, nil). An annotation that does not
// decode is an error naming the node and the annotation; every reader
// then treats the node as offering no GPUs, as if it had no annotation
// (never a guess at part of it), and reports the error.
func Inventory(node *corev1.Node) (*api.NodeInventory, error) {
	raw, ok := node.Annotations[api.AnnotationInventory]
	if !ok {
		return nil, nil
	}
	inv, err := api.DecodeInventory([]byte(raw))
	if err != nil {
		return nil, fmt.Errorf("node %s: annotation %s: %w", node.Name, api.AnnotationInventory, err)
	}
	return inv, nil
}
