package dra

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/api"
)

type testDriver struct {
	*Driver
	t      *testing.T
	dir    string
	client *fake.Clientset
	rec    *record.FakeRecorder
	gpus   []GPU
}

func newTestDriver(t *testing.T, dir string, gpus []GPU, objs ...runtime.Object) *testDriver {
	t.Helper()
	client := fake.NewClientset(objs...)
	rec := record.NewFakeRecorder(100)
	paths := deviceplugin.DefaultPaths()
	paths.PreloadHost = filepath.Join(dir, "ld.so.preload")
	d, err := New(Options{NodeName: "node-a", Client: client, Names: api.DefaultResourceNames, Paths: paths,
		ClaimRoot: filepath.Join(dir, "claims"), CDIDir: filepath.Join(dir, "cdi"), Recorder: rec}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetGPUs(context.Background(), gpus, testSystem); err != nil {
		t.Fatal(err)
	}
	return &testDriver{Driver: d, t: t, dir: dir, client: client, rec: rec, gpus: gpus}
}

func (d *testDriver) prepare(claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	d.t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		d.t.Fatal(err)
	}
	if len(res) != len(claims) {
		d.t.Fatalf("%d results for %d claims", len(res), len(claims))
	}
	return res
}

func (d *testDriver) unprepare(claims ...*resourceapi.ResourceClaim) {
	d.t.Helper()
	var objs []kubeletplugin.NamespacedObject
	for _, c := range claims {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
	}
	res, err := d.UnprepareResourceClaims(context.Background(), objs)
	if err != nil {
		d.t.Fatal(err)
	}
	for uid, err := range res {
		if err != nil {
			d.t.Errorf("unprepare %s: %v", uid, err)
		}
	}
}

// resolve injects the CDI devices into an empty OCI spec with the CDI
// library, as a container runtime does, and returns the container's
// environment and mounts (container path -> host path, "ro" marked).
func (d *testDriver) resolve(ids ...string) (env map[string]string, mounts map[string]string) {
	d.t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Join(d.dir, "cdi")), cdiapi.WithAutoRefresh(false))
	if err != nil {
		d.t.Fatal(err)
	}
	spec := &ociSpec{}
	if _, err := cache.InjectDevices(spec.oci(), ids...); err != nil {
		d.t.Fatalf("injecting %v: %v (spec errors %v)", ids, err, cache.GetErrors())
	}
	return spec.result()
}

func cdiIDs(r kubeletplugin.PrepareResult) []string {
	var out []string
	for _, dev := range r.Devices {
		out = append(out, dev.CDIDeviceIDs...)
	}
	return out
}

func readLimits(t *testing.T, hostPath string) limiterconf.Config {
	t.Helper()
	b, err := os.ReadFile(hostPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := limiterconf.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPrepareShares(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(2, api.SharingShared)
	c := newCluster(t, gpus)
	d := newTestDriver(t, dir, gpus)
	var claims []*resourceapi.ResourceClaim
	for range 5 {
		cl := c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "20Gi", "cores": "25"})
		c.allocate(cl)
		claims = append(claims, cl)
	}
	res := d.prepare(claims...)
	for i, cl := range claims {
		r := res[cl.UID]
		if r.Err != nil {
			t.Fatalf("claim %d: %v", i, r.Err)
		}
		ids := cdiIDs(r)
		if len(ids) != 1 || !strings.HasPrefix(ids[0], api.CDIKind+"="+string(cl.UID)) {
			t.Fatalf("claim %d: CDI devices %v", i, ids)
		}
		if r.Devices[0].ShareID == nil || string(*r.Devices[0].ShareID) != string(*cl.Status.Allocation.Devices.Results[0].ShareID) {
			t.Errorf("claim %d: share ID %v, allocation's %v", i, r.Devices[0].ShareID, cl.Status.Allocation.Devices.Results[0].ShareID)
		}
		env, mounts := d.resolve(ids...)
		gpu := gpus[0]
		if i == 4 {
			gpu = gpus[1]
		}
		if env[api.EnvVisibleDevices] != gpu.UUID {
			t.Errorf("claim %d: %s=%q, want %s", i, api.EnvVisibleDevices, env[api.EnvVisibleDevices], gpu.UUID)
		}
		conf := readLimits(t, strings.TrimSuffix(mounts[limiterconf.Path], " (ro)"))
		if len(conf.Devices) != 1 || conf.Devices[0].UUID != gpu.UUID || conf.Devices[0].MemoryMiB != 20480 || conf.Devices[0].SMPercent != 25 || conf.StatePath != "/tessera/state/cache" {
			t.Errorf("claim %d: limits %+v", i, conf)
		}
		for _, p := range []string{"/etc/ld.so.preload", limiterconf.Path, deviceplugin.DefaultPaths().LimiterContainer} {
			if !strings.HasSuffix(mounts[p], " (ro)") {
				t.Errorf("claim %d: %s mounted %q, want read-only", i, p, mounts[p])
			}
		}
		state := mounts["/tessera/state"]
		if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("claim %d: state dir %s: %v %v", i, state, fi, err)
		}
	}
	// Idempotent: the same answer again, nothing rewritten.
	again := d.prepare(claims[0])
	if !slices.Equal(cdiIDs(again[claims[0].UID]), cdiIDs(res[claims[0].UID])) {
		t.Errorf("second prepare answered %v, first %v", cdiIDs(again[claims[0].UID]), cdiIDs(res[claims[0].UID]))
	}
	// A restarted agent (new driver, same directories) knows them all.
	d2 := newTestDriver(t, dir, gpus)
	if got := len(d2.Prepared()); got != 5 {
		t.Fatalf("restarted driver knows %d claims, want 5", got)
	}
	if r := d2.prepare(claims[4]); !slices.Equal(cdiIDs(r[claims[4].UID]), cdiIDs(res[claims[4].UID])) {
		t.Errorf("after a restart prepare answered %v, before %v", cdiIDs(r[claims[4].UID]), cdiIDs(res[claims[4].UID]))
	}
	d2.unprepare(claims...)
	d2.unprepare(claims[0]) // again: nothing to do
	assertEmpty(t, dir)
}

// assertEmpty checks that no CDI spec and no claim directory is left.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	for _, sub := range []string{"cdi", "claims"} {
		entries, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range entries {
			if e.Name() != "checkpoint.json" {
				t.Errorf("left behind: %s/%s", sub, e.Name())
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "claims", "checkpoint.json"))
	if err == nil && strings.Contains(string(b), "uid-") {
		t.Errorf("checkpoint still holds claims: %s", b)
	}
}

// A claim for a whole GPU gets the GPU and no limiter; a multi-GPU
// request one CDI device listing its GPUs.
func TestPrepareWholeAndMultiGPU(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(4, api.SharingShared)
	c := newCluster(t, gpus)
	d := newTestDriver(t, dir, gpus)
	whole := c.claim(api.DeviceClassGPU, 1, nil)
	c.allocate(whole)
	multi := c.claim(api.DeviceClassGPU, 2, map[string]string{"memory": "8Gi", "cores": "50"})
	c.allocate(multi)
	res := d.prepare(whole, multi)
	env, mounts := d.resolve(cdiIDs(res[whole.UID])...)
	if env[api.EnvVisibleDevices] != gpus[0].UUID || len(mounts) != 0 {
		t.Errorf("whole GPU: env %v mounts %v", env, mounts)
	}
	ids := cdiIDs(res[multi.UID])
	if len(ids) != 1 || len(res[multi.UID].Devices) != 2 {
		t.Fatalf("multi-GPU: %d devices, CDI %v", len(res[multi.UID].Devices), ids)
	}
	env, mounts = d.resolve(ids...)
	if env[api.EnvVisibleDevices] != gpus[1].UUID+","+gpus[2].UUID {
		t.Errorf("multi-GPU: %s=%s", api.EnvVisibleDevices, env[api.EnvVisibleDevices])
	}
	conf := readLimits(t, strings.TrimSuffix(mounts[limiterconf.Path], " (ro)"))
	if len(conf.Devices) != 2 || conf.Devices[1].MemoryMiB != 8192 || conf.Devices[1].SMPercent != 50 {
		t.Errorf("multi-GPU limits %+v", conf)
	}
	d.unprepare(whole, multi)
	assertEmpty(t, dir)
}

// Prepare re-checks the allocation against the GPU: a scheduler that
// over-commits a GPU is refused, with an event, and nothing is written.
func TestPrepareRefusesOvercommit(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(1, api.SharingShared)
	d := newTestDriver(t, dir, gpus)
	share := func(name, mem, cores string) *resourceapi.ResourceClaim {
		cl := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
		cl.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: api.DRADriverName, Pool: "node-a", Device: "gpu-0", ShareID: ptr.To(types.UID("share-" + name)),
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(mem), "cores": resource.MustParse(cores)},
		}}}}
		return cl
	}
	a, b, c := share("a", "60Gi", "50"), share("b", "30Gi", "10"), share("c", "10Gi", "60")
	res := d.prepare(a, b, c)
	if res[a.UID].Err != nil {
		t.Fatal(res[a.UID].Err)
	}
	for _, x := range []struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		{b, "memory 30720 MiB allocated to this claim and 61440 MiB to claims default/a exceed its 81920 MiB"},
		{c, "cores 60 % allocated to this claim and 50 % to claims default/a exceed 100 %"},
	} {
		if err := res[x.c.UID].Err; err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("claim %s: %v, want %q", x.c.Name, err, x.want)
		}
	}
	events := drain(d.rec)
	if len(events) != 2 || !strings.Contains(events[0], ReasonPrepareFailed) {
		t.Errorf("events %q", events)
	}
	// A whole-GPU allocation beside a share is refused too.
	w := share("w", "1Gi", "0")
	w.Status.Allocation.Devices.Results[0].ShareID = nil
	if err := d.prepare(w)[w.UID].Err; err == nil || !strings.Contains(err.Error(), "allocated whole to this claim, but claims default/a already hold it") {
		t.Errorf("whole beside a share: %v", err)
	}
	d.unprepare(a)
	assertEmpty(t, dir)
}

func drain(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A malformed opaque configuration fails preparation naming the field;
// a configuration for NVIDIA's driver is refused naming it; a good one
// reaches the limits file.
func TestPrepareConfig(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(1, api.SharingShared)
	c := newCluster(t, gpus)
	d := newTestDriver(t, dir, gpus)
	withConfig := func(driver, params string, src resourceapi.AllocationConfigSource) *resourceapi.ResourceClaim {
		cl := c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi", "cores": "10"})
		c.allocate(cl)
		cl.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{
			{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "other.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"x":1}`)}}}},
			{Source: src, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}},
		}
		return cl
	}
	bad := withConfig(api.DRADriverName, `{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","elastic":"yes"}`, resourceapi.AllocationConfigSourceClaim)
	nv := withConfig(api.NVIDIADomain, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`, resourceapi.AllocationConfigSourceClaim)
	fromClass := withConfig(api.DRADriverName, `{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","turbo":true}`, resourceapi.AllocationConfigSourceClass)
	good := withConfig(api.DRADriverName, `{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","elastic":true,"contextReserveMiB":0}`, resourceapi.AllocationConfigSourceClaim)
	res := d.prepare(bad, nv, fromClass, good)
	for _, x := range []struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		{bad, "spec.devices.config[1].opaque.parameters.elastic: string is not a bool"},
		{nv, "spec.devices.config[1]: opaque configuration for driver gpu.nvidia.com (NVIDIA's DRA driver) applies to request \"gpu\""},
		{fromClass, "the DeviceClass's spec.config.opaque.parameters: unknown field \"turbo\""},
	} {
		if err := res[x.c.UID].Err; err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("claim %s: %v, want %q", x.c.Name, err, x.want)
		}
	}
	if err := res[good.UID].Err; err != nil {
		t.Fatal(err)
	}
	_, mounts := d.resolve(cdiIDs(res[good.UID])...)
	conf := readLimits(t, strings.TrimSuffix(mounts[limiterconf.Path], " (ro)"))
	if !conf.Elastic || conf.ContextReserveMiB == nil || *conf.ContextReserveMiB != 0 {
		t.Errorf("limits %+v", conf)
	}
	if got := len(d.Prepared()); got != 1 {
		t.Errorf("%d claims prepared, want 1", got)
	}
	d.unprepare(good)
	assertEmpty(t, dir)
}

// A container gets one request of the driver; a HAMi-style share that
// reached the node through the extended-resource mapping is refused.
func TestPrepareConsumers(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(2, api.SharingShared)
	c := newCluster(t, gpus)
	a := c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"})
	b := c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"})
	c.allocate(a)
	c.allocate(b)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "two", Namespace: "default", UID: "pod-two"},
		Spec: corev1.PodSpec{NodeName: "node-a",
			ResourceClaims: []corev1.PodResourceClaim{{Name: "x", ResourceClaimName: ptr.To(a.Name)}, {Name: "y", ResourceClaimName: ptr.To(b.Name)}},
			Containers:     []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "x"}, {Name: "y"}}}}}}}
	for _, cl := range []*resourceapi.ResourceClaim{a, b} {
		cl.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	}
	ext := c.claim(api.DeviceClassExtendedResource, 1, nil)
	c.allocate(ext)
	hami := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hami", Namespace: "default", UID: "pod-hami"},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("4096")}}}}},
		Status: corev1.PodStatus{ExtendedResourceClaimStatus: &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: ext.Name,
			RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: "main", ResourceName: "nvidia.com/gpu", RequestName: "gpu"}}}}}
	ext.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: hami.Name, UID: hami.UID}}
	d := newTestDriver(t, dir, gpus, pod, hami, a, b, ext)
	res := d.prepare(a, ext)
	if err := res[a.UID].Err; err == nil || !strings.Contains(err.Error(), `pod two: container "main" would get 2 GPU requests of gpu.tessera.io (claim claim-1 request gpu, claim claim-2 request gpu)`) {
		t.Errorf("two claims in one container: %v", err)
	}
	if err := res[ext.UID].Err; err == nil || !strings.Contains(err.Error(), `pod hami: container "main" asks for a GPU share (nvidia.com/gpumem 4096) beside nvidia.com/gpu, which this DRA node serves as whole GPUs`) {
		t.Errorf("HAMi-style pod: %v", err)
	}
	assertEmpty(t, dir)
}

// Collect unprepares claims that no longer exist (a kubelet that lost
// its state never will), after two rounds.
func TestCollect(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(1, api.SharingShared)
	c := newCluster(t, gpus)
	keep := c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi", "cores": "5"})
	gone := c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi", "cores": "5"})
	c.allocate(keep)
	c.allocate(gone)
	d := newTestDriver(t, dir, gpus, keep)
	d.prepare(keep, gone)
	d.Collect(context.Background())
	if len(d.Prepared()) != 2 {
		t.Fatal("collected after one round")
	}
	d.Collect(context.Background())
	p := d.Prepared()
	if _, ok := p[gone.UID]; ok || len(p) != 1 {
		t.Errorf("after two rounds: %v", p)
	}
	d.unprepare(keep)
	assertEmpty(t, dir)
}

// ociSpec is the OCI runtime spec CDI devices are injected into.
type ociSpec struct{ s oci.Spec }

func (o *ociSpec) oci() *oci.Spec {
	o.s.Process = &oci.Process{}
	return &o.s
}

// result is the container's environment and mounts (container path ->
// host path, " (ro)" appended for read-only ones).
func (o *ociSpec) result() (map[string]string, map[string]string) {
	env, mounts := map[string]string{}, map[string]string{}
	for _, e := range o.s.Process.Env {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	for _, m := range o.s.Mounts {
		v := m.Source
		if slices.Contains(m.Options, "ro") {
			v += " (ro)"
		}
		mounts[m.Destination] = v
	}
	return env, mounts
}

func TestCheckpointRefusesOtherVersion(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "claims", "checkpoint.json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"version": 2, "claims": map[string]any{}})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(Options{NodeName: "n", ClaimRoot: filepath.Join(dir, "claims"), CDIDir: filepath.Join(dir, "cdi")}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err == nil || !strings.Contains(err.Error(), "version 2, this agent reads 1") {
		t.Errorf("got %v", err)
	}
}

// A failure half-way (the CDI spec cannot be written after the limiter
// files were) leaves nothing of the claim.
func TestPrepareLeavesNothingOnFailure(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(1, api.SharingShared)
	c := newCluster(t, gpus)
	d := newTestDriver(t, dir, gpus)
	cl := c.claim(api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi", "cores": "5"})
	c.allocate(cl)
	cdiDir := filepath.Join(dir, "cdi")
	if err := os.RemoveAll(cdiDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cdiDir, nil, 0o644); err != nil { // not a directory
		t.Fatal(err)
	}
	if err := d.prepare(cl)[cl.UID].Err; err == nil || !strings.Contains(err.Error(), "writing the CDI spec") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "claims", string(cl.UID))); !os.IsNotExist(err) {
		t.Errorf("the claim's directory is left: %v", err)
	}
	if len(d.Prepared()) != 0 {
		t.Error("the claim is in the checkpoint")
	}
}
