package dra

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// testGPUs are n mock GPUs of 80 GiB (81920 MiB, as go-nvml's mock H100).
func testGPUs(n int, sharing api.SharingMode) []GPU {
	var out []GPU
	for i := range n {
		out = append(out, GPU{GPU: api.GPU{
			UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), Index: i, Model: "NVIDIA H100 80GB HBM3",
			MemoryMiB: 81920, SMCount: 132, ComputeCapability: "9.0", NUMANode: i / 4, PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x10+i),
			MIG: api.MIG{Capable: true}, Health: api.Healthy, Sharing: sharing, MaxShares: 10,
		}, Architecture: "Hopper", Brand: "Nvidia"})
	}
	return out
}

var testSystem = System{DriverVersion: "550.54.15", CUDAVersion: 12040}

// testClasses are the classes deploy/dra ships.
var testClasses = func() map[string]*resourceapi.DeviceClass {
	out := map[string]*resourceapi.DeviceClass{}
	for _, doc := range [][]byte{deploy.DRADeviceClasses, deploy.DRACompatDeviceClasses} {
		for _, part := range strings.Split(string(doc), "\n---\n") {
			var c resourceapi.DeviceClass
			if err := yaml.UnmarshalStrict([]byte(part), &c); err != nil {
				panic(err)
			}
			out[c.Name] = &c
		}
	}
	return out
}()

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}
func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, name)
}

// cluster allocates claims one after another as kube-scheduler's
// DynamicResources plugin does, with the real structured allocator and the
// state of the claims allocated before.
type cluster struct {
	t      *testing.T
	node   *corev1.Node
	slices []*resourceapi.ResourceSlice
	state  structured.AllocatedState
	cache  *cel.Cache
	n      int
}

func newCluster(t *testing.T, gpus []GPU) *cluster {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "node-a-gpu.tessera.io"},
		Spec: resourceapi.ResourceSliceSpec{Driver: api.DRADriverName, NodeName: ptr.To("node-a"),
			Pool: resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 1}, Devices: Devices(gpus, testSystem)}}
	return &cluster{t: t, node: node, slices: []*resourceapi.ResourceSlice{slice},
		state: structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity: structured.NewConsumedCapacityCollection()},
		cache: cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})}
}

// allocate allocates one claim; nil when it does not fit.
func (c *cluster) allocate(claim *resourceapi.ResourceClaim) *resourceapi.AllocationResult {
	c.t.Helper()
	features := structured.Features{ConsumableCapacity: true, DeviceTaints: true, PrioritizedList: true, AdminAccess: true}
	a, err := structured.NewAllocator(context.Background(), features, c.state, classLister(testClasses), c.slices, c.cache)
	if err != nil {
		c.t.Fatal(err)
	}
	res, err := a.Allocate(context.Background(), c.node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		c.t.Fatalf("allocating %s: %v", claim.Name, err)
	}
	if len(res) == 0 {
		return nil
	}
	r := &res[0]
	for _, d := range r.Devices.Results {
		id := structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
		if d.ShareID == nil {
			c.state.AllocatedDevices.Insert(id)
			continue
		}
		c.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, d.ShareID))
		c.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, d.ConsumedCapacity))
	}
	claim.Status.Allocation = r
	return r
}

// claim is a one-request claim of the class with these capacity requests
// and selectors.
func (c *cluster) claim(class string, count int64, capacity map[string]string, selectors ...string) *resourceapi.ResourceClaim {
	c.n++
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	if len(capacity) > 0 {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			req.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", c.n), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", c.n))},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}},
	}
}

func consumed(r resourceapi.DeviceRequestAllocationResult, name string) string {
	q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(name)]
	if !ok {
		return "-"
	}
	return q.String()
}

// The acceptance case: four claims of 20Gi and 25 % cores share one 80 GB
// GPU, a fifth lands on another; each consumed exactly what it asked.
func TestCapacitySharing(t *testing.T) {
	c := newCluster(t, testGPUs(2, api.SharingShared))
	for i := range 5 {
		r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "20Gi", "cores": "25"}))
		if r == nil {
			t.Fatalf("claim %d not allocated", i)
		}
		d := r.Devices.Results[0]
		want := "gpu-0"
		if i == 4 {
			want = "gpu-1"
		}
		if d.Device != want || d.ShareID == nil || consumed(d, "memory") != "20Gi" || consumed(d, "cores") != "25" || consumed(d, "shares") != "1" || consumed(d, api.CapacityNVIDIAMemory) != "0" {
			t.Errorf("claim %d: device %s share %v consumed memory %s cores %s shares %s nvidia %s; want %s, 20Gi, 25, 1, 0",
				i, d.Device, d.ShareID, consumed(d, "memory"), consumed(d, "cores"), consumed(d, "shares"), consumed(d, api.CapacityNVIDIAMemory), want)
		}
	}
}

// What a claim consumes when it does not ask: nothing asked is the whole
// GPU; memory alone takes no cores (no guarantee); cores alone hold the
// memory whole (the shipped admission policy refuses it).
func TestCapacityDefaults(t *testing.T) {
	c := newCluster(t, testGPUs(3, api.SharingShared))
	whole := c.allocate(c.claim(api.DeviceClassGPU, 1, nil)).Devices.Results[0]
	if whole.Device != "gpu-0" || consumed(whole, "memory") != "80Gi" || consumed(whole, "cores") != "0" {
		t.Errorf("no capacity asked: %s memory %s cores %s, want gpu-0 80Gi 0", whole.Device, consumed(whole, "memory"), consumed(whole, "cores"))
	}
	// gpu-0 is full: a small share goes to gpu-1.
	mem := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "10Gi"})).Devices.Results[0]
	if mem.Device != "gpu-1" || consumed(mem, "memory") != "10Gi" || consumed(mem, "cores") != "0" {
		t.Errorf("memory only: %s memory %s cores %s, want gpu-1 10Gi 0", mem.Device, consumed(mem, "memory"), consumed(mem, "cores"))
	}
	// Ten memory-only shares fit beside it (cores are not consumed) until
	// the GPU's share count (10) is reached.
	for i := range 9 {
		r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"}))
		if r == nil || r.Devices.Results[0].Device != "gpu-1" {
			t.Fatalf("memory-only share %d: %+v", i, r)
		}
	}
	if r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"})); r == nil || r.Devices.Results[0].Device != "gpu-2" {
		t.Errorf("an 11th share went to %+v, want gpu-2 (10 shares per GPU)", r)
	}
	cores := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"cores": "10"}))
	if cores != nil {
		t.Errorf("cores only: allocated %+v, but no GPU has all its memory free", cores.Devices.Results)
	}
	// Memory is rounded up to whole MiB.
	c2 := newCluster(t, testGPUs(1, api.SharingShared))
	odd := c2.allocate(c2.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1000000"})).Devices.Results[0]
	if consumed(odd, "memory") != "1Mi" {
		t.Errorf("1000000 bytes consumed %s, want 1Mi", consumed(odd, "memory"))
	}
}

// The guides' claims: class gpu.nvidia.com with the CEL memory selector,
// and nvidia-gpu; a request for gpu.nvidia.com/memory (the mirror) is
// never allocated; a claim asking more memory than any GPU has is not.
func TestGuidesSelectors(t *testing.T) {
	c := newCluster(t, testGPUs(2, api.SharingShared))
	sel := `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("16Gi")) >= 0`
	if r := c.allocate(c.claim(api.DeviceClassNVIDIA, 1, nil, sel)); r == nil {
		t.Error("the guides' CEL memory selector matched no GPU")
	}
	if r := c.allocate(c.claim(api.DeviceClassNVIDIAGPU, 1, nil)); r == nil || r.Devices.Results[0].Device != "gpu-1" {
		t.Errorf("nvidia-gpu class: %+v", r)
	}
	c = newCluster(t, testGPUs(2, api.SharingShared))
	if r := c.allocate(c.claim(api.DeviceClassNVIDIA, 1, nil, `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("100Gi")) >= 0`)); r != nil {
		t.Errorf("a 100Gi selector matched %+v", r.Devices.Results)
	}
	if r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{api.CapacityNVIDIAMemory: "10Gi"})); r != nil {
		t.Errorf("a request for the mirror capacity was allocated: %+v", r.Devices.Results)
	}
	if r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "81Gi"})); r != nil {
		t.Errorf("81Gi on an 80Gi GPU was allocated: %+v", r.Devices.Results)
	}
	for _, s := range []string{
		`device.attributes["gpu.tessera.io"].productName == "NVIDIA H100 80GB HBM3"`,
		`device.attributes["gpu.tessera.io"].architecture == "Hopper"`,
		`device.attributes["gpu.tessera.io"].computeCapability.compareTo(semver("9.0.0")) >= 0`,
		`device.attributes["gpu.nvidia.com"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))`,
		`device.attributes["gpu.tessera.io"].driverVersion.compareTo(semver("550.0.0")) >= 0`,
		`device.attributes["gpu.tessera.io"].migCapable`,
		`device.attributes["gpu.tessera.io"].sharing == "shared"`,
		`device.attributes["gpu.tessera.io"].index == 1`,
		`device.attributes["resource.kubernetes.io"].pciBusID == "0000:11:00.0"`,
	} {
		c := newCluster(t, testGPUs(2, api.SharingShared))
		if r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"}, s)); r == nil {
			t.Errorf("selector %s matched no GPU", s)
		}
	}
}

// A multi-GPU claim gets distinct GPUs, also when shares would fit on one.
func TestMultiGPUClaimDistinct(t *testing.T) {
	c := newCluster(t, testGPUs(4, api.SharingShared))
	r := c.allocate(c.claim(api.DeviceClassGPU, 3, map[string]string{"memory": "1Gi", "cores": "10"}))
	if r == nil {
		t.Fatal("not allocated")
	}
	seen := map[string]bool{}
	for _, d := range r.Devices.Results {
		if seen[d.Device] {
			t.Errorf("device %s given twice to one request: %+v", d.Device, r.Devices.Results)
		}
		seen[d.Device] = true
	}
}

// An unhealthy GPU stays in the slice, tainted NoSchedule: no new claim
// gets it.
func TestUnhealthyTainted(t *testing.T) {
	gpus := testGPUs(2, api.SharingShared)
	gpus[0].Health, gpus[0].HealthReason = api.Unhealthy, "XID 79"
	devs := Devices(gpus, testSystem)
	if len(devs) != 2 || len(devs[0].Taints) != 1 || devs[0].Taints[0].Value != "XID-79" || devs[0].Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("devices %+v", devs)
	}
	c := newCluster(t, gpus)
	for i := range 2 {
		r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"}))
		if r == nil || r.Devices.Results[0].Device != "gpu-1" {
			t.Errorf("claim %d: %+v, want gpu-1", i, r)
		}
	}
}

// Exclusive GPUs are allocated whole, one claim each.
func TestExclusive(t *testing.T) {
	c := newCluster(t, testGPUs(2, api.SharingExclusive))
	for i, want := range []string{"gpu-0", "gpu-1"} {
		r := c.allocate(c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"}))
		if r == nil || r.Devices.Results[0].Device != want || r.Devices.Results[0].ShareID != nil {
			t.Errorf("claim %d: %+v, want %s whole", i, r, want)
		}
	}
	if r := c.allocate(c.claim(api.DeviceClassGPU, 1, nil)); r != nil {
		t.Errorf("a third claim on two exclusive GPUs: %+v", r.Devices.Results)
	}
}

func TestDeviceAttributes(t *testing.T) {
	d := Devices(testGPUs(1, api.SharingShared), testSystem)[0]
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Errorf("%d attributes and capacities, the limit is %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	want := map[string]string{
		"uuid": "GPU-00000000-0000-0000-0000-000000000000", "productName": "NVIDIA H100 80GB HBM3", "architecture": "Hopper",
		"computeCapability": "9.0.0", "driverVersion": "550.54.15", "cudaDriverVersion": "12.4.0", "pcieBusID": "00000000:10:00.0",
		"sharing": "shared", "gpu.nvidia.com/uuid": "GPU-00000000-0000-0000-0000-000000000000", "gpu.nvidia.com/cudaComputeCapability": "9.0.0",
		"resource.kubernetes.io/pciBusID": "0000:10:00.0", "index": "0", "numaNode": "0", "migCapable": "true", "type": "gpu",
	}
	for k, v := range want {
		a, ok := d.Attributes[resourceapi.QualifiedName(k)]
		if !ok {
			t.Errorf("attribute %s missing", k)
			continue
		}
		got := ""
		switch {
		case a.StringValue != nil:
			got = *a.StringValue
		case a.VersionValue != nil:
			got = *a.VersionValue
		case a.IntValue != nil:
			got = fmt.Sprint(*a.IntValue)
		case a.BoolValue != nil:
			got = fmt.Sprint(*a.BoolValue)
		}
		if got != v {
			t.Errorf("attribute %s = %q, want %q", k, got, v)
		}
	}
	for _, v := range []struct{ in, out string }{{"8.0", "8.0.0"}, {"535.129.03", "535.129.3"}, {"550.54.15", "550.54.15"}, {"x", ""}, {"1.2.3.4", ""}, {"", ""}} {
		if got, _ := semver(v.in); got != v.out {
			t.Errorf("semver(%q) = %q, want %q", v.in, got, v.out)
		}
	}
	if v := taintValue(strings.Repeat("a b", 40)); len(v) > 63 || strings.ContainsAny(v, " ") {
		t.Errorf("taint value %q", v)
	}
}
