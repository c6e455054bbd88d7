package kubeobj

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

func container(limits, requests map[string]string) *corev1.Container {
	c := &corev1.Container{Name: "c"}
	list := func(m map[string]string) corev1.ResourceList {
		if m == nil {
			return nil
		}
		l := corev1.ResourceList{}
		for k, v := range m {
			l[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		return l
	}
	c.Resources.Limits, c.Resources.Requests = list(limits), list(requests)
	return c
}

func TestReadResources(t *testing.T) {
	c := container(map[string]string{names.GPU: "0.5", names.Memory: "1000"}, map[string]string{names.Memory: "2000", names.Cores: "30"})
	r, err := ReadResources(c, names)
	if err != nil {
		t.Fatal(err)
	}
	// The limit wins over the request; a resource with only a request
	// counts by its request.
	want := Resources{GPUMilli: 500, MemoryMiB: 1000, Cores: 30, HasGPU: true, HasMemory: true, HasCores: true, CountName: names.GPU}
	if r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
	for _, tc := range []struct {
		limits map[string]string
		want   string
	}{
		{map[string]string{names.GPU: "-1"}, `container "c": nvidia.com/gpu is -1, must not be negative (GPUs per node)`},
		{map[string]string{names.Memory: "1.5"}, `container "c": nvidia.com/gpumem is 1500m, must be a whole number (MiB per GPU); the suffix m means thousandths: 1500m is 1.5 MiB. nvidia.com/gpumem counts MiB per GPU without a suffix`},
		{map[string]string{names.Cores: "-3"}, `container "c": nvidia.com/gpucores is -3, must not be negative (percent of the GPU's compute)`},
	} {
		if _, err := ReadResources(container(tc.limits, nil), names); err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.limits, err, tc.want)
		}
	}
}

// Devices is what the kubelet allocates: the count, never a fraction, and
// the same reading of limits and requests as ReadResources.
func TestDevices(t *testing.T) {
	for _, tc := range []struct {
		c    *corev1.Container
		want int64
	}{
		{container(map[string]string{names.GPU: "2"}, nil), 2},
		{container(nil, map[string]string{names.GPU: "3"}), 3},
		{container(map[string]string{names.GPU: "0.5"}, nil), 1},
		{container(map[string]string{names.Memory: "1000"}, nil), 0},
		{container(nil, nil), 0},
	} {
		if got, err := Devices(tc.c, names.GPU); err != nil || got != tc.want {
			t.Errorf("%v: %d, %v; want %d", tc.c.Resources, got, err, tc.want)
		}
	}
	if _, err := Devices(container(map[string]string{names.GPU: "-1"}, nil), names.GPU); err == nil {
		t.Error("a negative count was read as a count")
	}
}

func TestDefaulted(t *testing.T) {
	r, err := Defaulted("c", Resources{GPUMilli: 250, HasGPU: true}, names)
	if err != nil || r.GPUMilli != 1000 || r.MemoryPercent != 25 || r.Cores != 25 {
		t.Errorf("a quarter GPU: %+v, %v", r, err)
	}
	if r, _ := Defaulted("c", Resources{MemoryMiB: 10, HasMemory: true}, names); r.GPUMilli != 1000 {
		t.Errorf("memory alone: %+v, want one GPU", r)
	}
	if r, _ := Defaulted("c", Resources{GPUMilli: 2000, HasGPU: true}, names); r.MemoryPercent != 100 {
		t.Errorf("count alone: %+v, want all the memory", r)
	}
	if _, err := Defaulted("c", Resources{GPUMilli: 1500, HasGPU: true}, names); err == nil || !strings.Contains(err.Error(), "1500m") {
		t.Errorf("1.5 GPUs: %v", err)
	}
}

func TestRecord(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	if Key(p) != "ns/p" {
		t.Errorf("key %q", Key(p))
	}
	if _, err := Record(p); !errors.Is(err, ErrNoRecord) {
		t.Errorf("no annotation: %v", err)
	}
	rec := &api.PodAllocation{APIVersion: api.AllocationAPIVersion, Kind: api.AllocationKind, Node: "n",
		Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: "GPU-1", MemoryMiB: 1, Cores: 1}}}}}
	b, err := api.EncodeAllocation(rec)
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations = map[string]string{api.AnnotationAllocation: string(b)}
	if got, err := Record(p); err != nil || got.Node != "n" {
		t.Errorf("record: %+v, %v", got, err)
	}
	p.Annotations[api.AnnotationAllocation] = "{"
	if _, err := Record(p); err == nil || errors.Is(err, ErrNoRecord) {
		t.Errorf("a broken record: %v", err)
	}
}

// One behaviour for the inventory annotation: absent is no inventory,
// unreadable is an error naming the node and the annotation, and either
// way no GPUs.
func TestInventory(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}
	if inv, err := Inventory(n); inv != nil || err != nil {
		t.Errorf("no annotation: %v, %v", inv, err)
	}
	inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: 1,
		GPUs: []api.GPU{{UUID: "GPU-1", Model: "A100", MemoryMiB: 40960, Health: api.Healthy, Sharing: api.SharingShared, MaxShares: 4}}}
	b, err := api.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	n.Annotations = map[string]string{api.AnnotationInventory: string(b)}
	if got, err := Inventory(n); err != nil || len(got.GPUs) != 1 {
		t.Errorf("inventory: %+v, %v", got, err)
	}
	n.Annotations[api.AnnotationInventory] = `{"apiVersion":"tessera.io/v0","kind":"NodeGPUInventory"}`
	got, err := Inventory(n)
	if got != nil || err == nil || !strings.Contains(err.Error(), "node gpu-1: annotation "+api.AnnotationInventory) || !strings.Contains(err.Error(), "tessera.io/v0") {
		t.Errorf("unreadable: %+v, %v", got, err)
	}
}

func TestRequestsGPU(t *testing.T) {
	n := api.MustResourceNames("tessera.io")
	p := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{*container(map[string]string{"tessera.io/gpucores": "1"}, nil)}}}
	if !RequestsGPU(p, n) || RequestsGPU(p, names) {
		t.Error("RequestsGPU must see init containers under the configured prefix only")
	}
}

// TestQuantityBounds: every quantity is compared with its bound before it
// is converted, so no value wraps (trust issue, finding 8: gpumem
// 18446744073709552616 ran with 1000 MiB, nvidia.com/gpu
// 9223372036854775808 became 0).
func TestQuantityBounds(t *testing.T) {
	for _, tc := range []struct {
		limits map[string]string
		want   string
	}{
		{map[string]string{names.Memory: "18446744073709552616"}, `container "c": nvidia.com/gpumem is 18446744073709552616, must be between 0 and 16777216 (MiB per GPU)`},
		{map[string]string{names.GPU: "9223372036854775808"}, `container "c": nvidia.com/gpu is 9223372036854775808, must be between 0 and 64 (GPUs per node)`},
		{map[string]string{names.GPU: "65"}, `nvidia.com/gpu is 65, must be between 0 and 64`},
		{map[string]string{names.Memory: "1e30"}, `nvidia.com/gpumem is 1e30, must be between 0 and 16777216`},
		{map[string]string{names.Cores: "101"}, `nvidia.com/gpucores is 101, must be between 0 and 100 (percent of the GPU's compute)`},
		{map[string]string{names.Cores: "18446744073709551716"}, `nvidia.com/gpucores is 18446744073709551716, must be between 0 and 100`},
		{map[string]string{names.MemoryPercentage: "4294967396"}, `nvidia.com/gpumem-percentage is 4294967396, must be between 0 and 100 (percent of the GPU's memory)`},
	} {
		_, err := ReadResources(container(tc.limits, nil), names)
		var re *ResourceError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &re) {
			t.Errorf("%v: %v, want %q", tc.limits, err, tc.want)
		}
	}
	// The bounds themselves are accepted.
	if r, err := ReadResources(container(map[string]string{names.GPU: "64", names.Memory: "16777216", names.Cores: "100"}, nil), names); err != nil || r.GPUMilli != 64000 || r.MemoryMiB != 16777216 {
		t.Errorf("at the bounds: %+v, %v", r, err)
	}
}

// TestZeroRequests: a zero is never read as something else (finding 8:
// gpumem 0 alone became an exclusive whole GPU). A count of 0 with nothing
// else is "no GPU".
func TestZeroRequests(t *testing.T) {
	read := func(limits map[string]string) (Resources, error) {
		r, err := ReadResources(container(limits, nil), names)
		if err != nil {
			return r, err
		}
		return Defaulted("c", r, names)
	}
	for _, tc := range []struct {
		limits map[string]string
		want   string
	}{
		{map[string]string{names.Memory: "0"}, `nvidia.com/gpumem is 0, a GPU share needs memory`},
		{map[string]string{names.GPU: "1", names.Memory: "0"}, `nvidia.com/gpumem is 0`},
		{map[string]string{names.MemoryPercentage: "0", names.Cores: "20"}, `nvidia.com/gpumem-percentage is 0`},
		{map[string]string{names.GPU: "0", names.Memory: "1024"}, `nvidia.com/gpu is 0, but`},
		{map[string]string{names.GPU: "0", names.Cores: "30"}, `nvidia.com/gpu is 0, but`},
		{map[string]string{names.Cores: "0"}, `nvidia.com/gpucores is 0, alone it asks for no GPU`},
	} {
		if _, err := read(tc.limits); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.limits, err, tc.want)
		}
	}
	if r, err := read(map[string]string{names.GPU: "0"}); err != nil || r.GPUMilli != 0 || r.MemoryPercent != 0 {
		t.Errorf("gpu 0 alone: %+v, %v; want no GPU", r, err)
	}
	if r, err := read(map[string]string{names.GPU: "1", names.Memory: "2048", names.Cores: "0"}); err != nil || r.Cores != 0 || r.MemoryMiB != 2048 {
		t.Errorf("cores 0 with memory (no compute share): %+v, %v", r, err)
	}
}

// TestCountResources: the shared rename and MIG profile resources count
// devices like the GPU resource; one kind per container.
func TestCountResources(t *testing.T) {
	r, err := ReadResources(container(map[string]string{"nvidia.com/mig-1g.5gb": "1"}, nil), names)
	if err != nil || r.CountName != "nvidia.com/mig-1g.5gb" || r.MIGProfile != "1g.5gb" || r.GPUMilli != 1000 {
		t.Errorf("MIG: %+v %v", r, err)
	}
	if d, err := Defaulted("c", r, names); err != nil || d != r {
		t.Errorf("a MIG request is not defaulted: %+v %v", d, err)
	}
	r.HasMemory, r.MemoryMiB = true, 1000
	if _, err := Defaulted("c", r, names); err == nil || !strings.Contains(err.Error(), "a MIG profile fixes memory and compute") {
		t.Errorf("MIG with gpumem: %v", err)
	}
	r, err = ReadResources(container(map[string]string{"nvidia.com/gpu.shared": "1"}, nil), names)
	if err != nil || r.CountName != "nvidia.com/gpu.shared" || r.MIGProfile != "" {
		t.Errorf("shared: %+v %v", r, err)
	}
	if d, _ := Defaulted("c", r, names); d.MemoryPercent != 100 || d.CountName != "nvidia.com/gpu.shared" {
		t.Errorf("shared defaulted: %+v", d)
	}
	_, err = ReadResources(container(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "1"}, nil), names)
	if err == nil || !strings.Contains(err.Error(), "asks for both nvidia.com/gpu and nvidia.com/mig-1g.5gb") {
		t.Errorf("two kinds: %v", err)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{*container(map[string]string{"nvidia.com/mig-2g.10gb": "1"}, nil)}}}
	if !RequestsGPU(pod, names) {
		t.Error("a MIG pod does not request a GPU")
	}
}

// TestCeiling: a memory ceiling rides on a guarantee in MiB, at or above
// it (equal asks nothing more and is dropped), never on a whole GPU, a
// MIG device or a fraction; each refusal names the resource and why.
func TestCeiling(t *testing.T) {
	read := func(limits map[string]string) (Resources, error) {
		r, err := ReadResources(container(limits, nil), names)
		if err != nil {
			return r, err
		}
		return Defaulted("c", r, names)
	}
	r, err := read(map[string]string{names.Memory: "4096", names.MemoryCeiling: "12288", names.Cores: "30"})
	if err != nil || r.CeilingMiB != 12288 || !r.HasCeiling || r.MemoryMiB != 4096 || r.GPUMilli != 1000 {
		t.Errorf("guarantee and ceiling: %+v, %v", r, err)
	}
	r, err = read(map[string]string{names.Memory: "4096", names.MemoryCeiling: "4096"})
	if err != nil || r.CeilingMiB != 0 || r.HasCeiling {
		t.Errorf("a ceiling equal to the guarantee: %+v, %v; want it dropped", r, err)
	}
	for _, tc := range []struct {
		limits map[string]string
		want   string
	}{
		{map[string]string{names.MemoryCeiling: "8192"}, `container "c": nvidia.com/gpumem-ceiling is 8192, a ceiling needs the guarantee below it in MiB: set nvidia.com/gpumem as well`},
		{map[string]string{names.GPU: "1", names.MemoryCeiling: "8192"}, "set nvidia.com/gpumem as well"},
		{map[string]string{names.MemoryPercentage: "20", names.MemoryCeiling: "8192"}, "set nvidia.com/gpumem as well"},
		{map[string]string{names.Memory: "8192", names.MemoryCeiling: "4096"}, `container "c": nvidia.com/gpumem-ceiling is 4096, must be at least nvidia.com/gpumem (8192 MiB, the guarantee)`},
		{map[string]string{names.Memory: "4096", names.MemoryCeiling: "8192", names.Cores: "100"}, "nvidia.com/gpucores=100 asks the whole GPU, which has nothing to borrow"},
		{map[string]string{names.GPU: "0.5", names.MemoryCeiling: "8192"}, "set nvidia.com/gpumem as well"},
		{map[string]string{names.MIG("1g.5gb"): "1", names.MemoryCeiling: "8192"}, "a MIG profile fixes memory and compute"},
		{map[string]string{names.Memory: "4096", names.MemoryCeiling: "-1"}, "nvidia.com/gpumem-ceiling is -1, must not be negative"},
		{map[string]string{names.Memory: "4096", names.MemoryCeiling: "17000000"}, "nvidia.com/gpumem-ceiling is 17M, must be between 0 and 16777216 (MiB per GPU)"},
	} {
		if _, err := read(tc.limits); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.limits, err, tc.want)
		}
	}
	var re *ResourceError
	if _, err := read(map[string]string{names.Memory: "8192", names.MemoryCeiling: "4096"}); !errors.As(err, &re) || re.Resource != names.MemoryCeiling {
		t.Errorf("the error %v is not a ResourceError on %s", err, names.MemoryCeiling)
	}
}

// TestQuantityUnits: a GPU quantity written with a suffix is refused with
// its unit and the conversion (gpumem: 4Gi was refused with "must be
// between 0 and 16777216", which did not say how to write 4 GiB).
func TestQuantityUnits(t *testing.T) {
	for _, tc := range []struct {
		limits map[string]string
		want   []string
	}{
		{map[string]string{names.Memory: "4Gi"}, []string{"nvidia.com/gpumem is 4Gi", "between 0 and 16777216 (MiB per GPU)", "counts MiB as a plain number", "4Gi means 4294967296 MiB here", "For 4Gi of memory write 4096"}},
		{map[string]string{names.Memory: "20G"}, []string{"20G means 20000000000 MiB", "write 19074"}},
		{map[string]string{names.Memory: "1.5"}, []string{"must be a whole number (MiB per GPU)", "1500m is 1.5 MiB", "without a suffix"}},
		{map[string]string{names.Cores: "500m"}, []string{"must be a whole number (percent of the GPU's compute)", "500m is 0.5 percent"}},
		{map[string]string{names.MemoryPercentage: "1k"}, []string{"between 0 and 100 (percent of the GPU's memory)", "plain number, without a suffix such as k"}},
		{map[string]string{names.GPU: "-1"}, []string{"must not be negative (GPUs per node)"}},
	} {
		_, err := ReadResources(container(tc.limits, nil), names)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want it to mention %q", tc.limits, err, w)
			}
		}
	}
	// Plain numbers and exponents get no hint.
	_, err := ReadResources(container(map[string]string{names.Memory: "1e30"}, nil), names)
	if err == nil || strings.Contains(err.Error(), "plain number") {
		t.Errorf("1e30: %v", err)
	}
}
