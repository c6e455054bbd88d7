package dra

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// withCeiling allocates a claim asking memory (none: the GPU whole) with a
// GPUConfig memory ceiling in the claim's configuration.
func withCeiling(c *cluster, memory string, ceilingMiB int64) *resourceapi.ResourceClaim {
	capacity := map[string]string{}
	if memory != "" {
		capacity["memory"] = memory
	}
	cl := c.claim(api.DeviceClassGPU, 1, capacity)
	c.allocate(cl)
	raw := fmt.Sprintf(`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memoryCeilingMiB":%d}`, ceilingMiB)
	cl.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DRADriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}}
	return cl
}

// TestPrepareCeiling: the claim's memory capacity is the guarantee and
// the GPUConfig's memoryCeilingMiB the ceiling. Without the driver's
// partitioning the limits file lets the request burst from the GPU's
// budget file (ceiling, budget, the request's borrower name, the budget
// directory mounted read-only); a ceiling below the guarantee, above the
// GPU, or on a GPU allocated whole fails with the field, the value and
// the limit.
func TestPrepareCeiling(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(2, api.SharingShared)
	c := newCluster(t, gpus)
	good := withCeiling(c, "20Gi", 30720)
	below := withCeiling(c, "20Gi", 10240)
	above := withCeiling(c, "20Gi", 81921)
	whole := withCeiling(c, "", 30720)
	d := newTestDriver(t, dir, gpus)
	d.opts.Paths.BudgetHost = filepath.Join(dir, "burst")
	res := d.prepare(good, below, above, whole)
	for _, x := range []struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		{below, `spec.devices.config[0].opaque.parameters.memoryCeilingMiB 10240: below the 20480 MiB of memory request "gpu" consumes on GPU gpu-0 (its guarantee)`},
		{above, `spec.devices.config[0].opaque.parameters.memoryCeilingMiB 81921: more than GPU gpu-0 (GPU-00000000-0000-0000-0000-000000000000) has (81920 MiB)`},
		{whole, `spec.devices.config[0].opaque.parameters.memoryCeilingMiB 30720: request "gpu" was allocated GPU gpu-1 (GPU-00000001-0000-0000-0000-000000000000) whole`},
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
	want := limiterconf.Device{UUID: gpus[0].UUID, MemoryMiB: 20480, CeilingMiB: 30720, BudgetPath: limiterconf.BudgetDir + "/" + gpus[0].UUID}
	if len(conf.Devices) != 1 || conf.Devices[0] != want || conf.Borrower != Borrower(good.UID, "gpu") {
		t.Errorf("limits %+v; want %+v with borrower %s", conf, want, Borrower(good.UID, "gpu"))
	}
	if got := mounts[limiterconf.BudgetDir]; got != d.opts.Paths.BudgetHost+" (ro)" {
		t.Errorf("budget directory mounted from %q, want %s read-only", got, d.opts.Paths.BudgetHost)
	}
	if p := d.Prepared()[good.UID]; len(p.Grants) != 1 || p.Grants[0].CeilingMiB != 30720 || p.Requests[0].Confirm != "" {
		t.Errorf("prepared %+v; want the grant's ceiling and no driver confirmation (the driver does not partition)", p)
	}
	d.unprepare(good)
	assertEmpty(t, dir)
}

// TestPrepareCeilingDriver: where the driver partitions the GPU's memory,
// a request that one container of the claim's pod uses gets the device
// plugins' hook in its CDI device (soft = the guarantee, hard = the
// ceiling) and its confirmation mounted read-only; unpreparing clears
// what the confirmation names. A claim pods share keeps the limiter.
func TestPrepareCeilingDriver(t *testing.T) {
	dir := t.TempDir()
	gpus := testGPUs(1, api.SharingShared)
	c := newCluster(t, gpus)
	sole := withCeiling(c, "20Gi", 30720)
	shared := withCeiling(c, "10Gi", 20480)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "burst", Namespace: "default", UID: "pod-burst"},
		Spec: corev1.PodSpec{NodeName: "node-a",
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("t")}},
			Containers:     []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}, {Name: "side"}}},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(sole.Name)}}}}
	sole.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
	sole.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	d := newTestDriver(t, dir, gpus, pod, sole, shared)
	d.opts.Paths.BudgetHost = filepath.Join(dir, "burst")
	d.opts.DriverLimits = &deviceplugin.DriverLimits{Hook: []string{"/usr/local/tessera/tessera-hook", "memory-limits"}, CDIDir: filepath.Join(dir, "cdi"),
		Partitions: func(uuid string) bool { return uuid == gpus[0].UUID }}
	var released []string
	d.opts.ReleaseConfirmed = func(confirm string) error { released = append(released, confirm); return nil }
	res := d.prepare(sole, shared)
	for _, cl := range []*resourceapi.ResourceClaim{sole, shared} {
		if err := res[cl.UID].Err; err != nil {
			t.Fatalf("%s: %v", cl.Name, err)
		}
	}
	p := d.Prepared()[sole.UID]
	confirm := p.Requests[0].Confirm
	if confirm == "" {
		t.Fatalf("prepared %+v: want a driver confirmation", p)
	}
	spec := readSpec(t, filepath.Join(dir, "cdi", p.Spec))
	edits := spec.Devices[0].ContainerEdits
	wantArgs := []string{"tessera-hook", "memory-limits", "--confirm", confirm, "--gpu", gpus[0].UUID + "=20480:30720"}
	if len(edits.Hooks) != 2 || edits.Hooks[0].HookName != "createContainer" || !slices.Equal(edits.Hooks[0].Args, wantArgs) || edits.Hooks[1].HookName != "poststop" {
		t.Errorf("hooks %+v; want createContainer %v and poststop", edits.Hooks, wantArgs)
	}
	_, mounts := d.resolve(cdiIDs(res[sole.UID])...)
	if got := mounts[memlimits.ConfirmPath]; got != confirm+" (ro)" {
		t.Errorf("confirmation mounted from %q, want %s read-only", got, confirm)
	}
	// The limiter keeps the guarantee and ceiling until the hook confirms.
	conf := readLimits(t, strings.TrimSuffix(mounts[limiterconf.Path], " (ro)"))
	if conf.Devices[0].MemoryMiB != 20480 || conf.Devices[0].CeilingMiB != 30720 {
		t.Errorf("limits %+v", conf)
	}
	// A pre-created claim (no owning pod) may be shared: the limiter.
	ps := d.Prepared()[shared.UID]
	if ps.Requests[0].Confirm != "" || len(readSpec(t, filepath.Join(dir, "cdi", ps.Spec)).Devices[0].ContainerEdits.Hooks) != 0 {
		t.Errorf("a claim pods may share got the driver's limits: %+v", ps)
	}
	d.unprepare(sole, shared)
	if !slices.Equal(released, []string{confirm}) {
		t.Errorf("released %v at unprepare, want %s", released, confirm)
	}
	assertEmpty(t, dir)
}

func readSpec(t *testing.T, path string) cdispec.Spec {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s cdispec.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}
