//go:build integration

package lab_test

// DRA on the lab's default cluster (docs/dra.md): the node lab-dra (mode
// dra, 4 × A100-80GB) serves its GPUs as ResourceClaims of the driver
// gpu.tessera.io; the claims are written as users write them for
// resource.k8s.io/v1 and placed by the lab's scheduler (kube-scheduler's
// DynamicResources), prepared by the node agent through the kubelet's DRA
// manager, and their CDI devices applied by the node's runtime.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const draNode = "lab-dra"

// draNamespace is a namespace whose pods and claims are gone (and the
// claims unprepared) when the test ends.
func draNamespace(t *testing.T, ns string) {
	t.Helper()
	// Cleanups run last-registered first: the pods go (useNamespace),
	// then the claims they no longer use.
	t.Cleanup(func() {
		ctx := context.Background()
		_ = client.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		testenv.WaitFor(t, "the claims of "+ns+" gone", 2*time.Minute, func() bool {
			l, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0
		})
	})
	useNamespace(t, ns)
}

// draContainer is the container lab-dra's runtime created, with the GPU
// its CDI devices gave it.
func draContainer(t *testing.T, ns, pod, name string) (*hollowkubelet.Container, string) {
	t.Helper()
	return draContainerOn(t, draNode, ns, pod, name)
}

// draContainerOn is draContainer on another node.
func draContainerOn(t *testing.T, node, ns, pod, name string) (*hollowkubelet.Container, string) {
	t.Helper()
	c, err := dir.Node(node).Container(ns, pod, name)
	if err != nil {
		t.Fatalf("%s/%s: %v", pod, name, err)
	}
	if len(c.CDIDevices) == 0 || !strings.HasPrefix(c.CDIDevices[0], api.CDIKind+"=") {
		t.Errorf("%s/%s: CDI devices %v, want %s ones", pod, name, c.CDIDevices, api.CDIKind)
	}
	return c, c.Env[api.EnvVisibleDevices]
}

// TestDRAGuides runs the three uses the GPU guides show, as written: a
// ResourceClaimTemplate shared by two containers of a pod (class
// gpu.nvidia.com), one ResourceClaim shared by two pods (class
// nvidia-gpu), and a claim selecting a GPU by memory with CEL.
func TestDRAGuides(t *testing.T) {
	const ns = "dra-guides"
	draNamespace(t, ns)
	apply(t, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  namespace: dra-guides
  name: single-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: v1
kind: Pod
metadata:
  namespace: dra-guides
  name: pod-template
spec:
  containers:
  - name: ctr0
    image: ubuntu:22.04
    command: ["bash", "-c"]
    args: ["nvidia-smi -L; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      claims:
      - name: shared-gpu
  - name: ctr1
    image: ubuntu:22.04
    command: ["bash", "-c"]
    args: ["nvidia-smi -L; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      claims:
      - name: shared-gpu
  resourceClaims:
  - name: shared-gpu
    resourceClaimTemplateName: single-gpu
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  namespace: dra-guides
  name: single-gpu
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: nvidia-gpu
---
apiVersion: v1
kind: Pod
metadata:
  namespace: dra-guides
  name: pod0
spec:
  containers:
  - name: ctr
    image: ubuntu:22.04
    command: ["bash", "-c"]
    args: ["nvidia-smi -L; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      claims:
      - name: shared-gpu
  resourceClaims:
  - name: shared-gpu
    resourceClaimName: single-gpu
---
apiVersion: v1
kind: Pod
metadata:
  namespace: dra-guides
  name: pod1
spec:
  containers:
  - name: ctr
    image: ubuntu:22.04
    command: ["bash", "-c"]
    args: ["nvidia-smi -L; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      claims:
      - name: shared-gpu
  resourceClaims:
  - name: shared-gpu
    resourceClaimName: single-gpu
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  namespace: dra-guides
  name: large-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel:
              expression: device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("16Gi")) >= 0
---
apiVersion: v1
kind: Pod
metadata:
  namespace: dra-guides
  name: pod-cel
spec:
  containers:
  - name: ctr
    image: ubuntu:22.04
    command: ["bash", "-c"]
    args: ["nvidia-smi -L; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: large-gpu
`)
	for _, p := range []string{"pod-template", "pod0", "pod1", "pod-cel"} {
		if got := waitRunning(t, ns, p); got.Spec.NodeName != draNode {
			t.Errorf("%s runs on %s, want %s", p, got.Spec.NodeName, draNode)
		}
	}
	_, a := draContainer(t, ns, "pod-template", "ctr0")
	_, b := draContainer(t, ns, "pod-template", "ctr1")
	if a == "" || a != b {
		t.Errorf("the template's two containers see GPUs %q and %q, want one", a, b)
	}
	_, c := draContainer(t, ns, "pod0", "ctr")
	_, d := draContainer(t, ns, "pod1", "ctr")
	if c == "" || c != d {
		t.Errorf("the claim's two pods see GPUs %q and %q, want one", c, d)
	}
	if c == a {
		t.Errorf("two whole-GPU claims got one GPU %s", a)
	}
	_, e := draContainer(t, ns, "pod-cel", "ctr")
	for _, pc := range [][2]string{{"pod-template", "ctr0"}, {"pod-template", "ctr1"}, {"pod0", "ctr"}, {"pod-cel", "ctr"}} {
		want := "(UUID: " + map[string]string{"pod-template": a, "pod0": c, "pod-cel": e}[pc[0]] + ")"
		testenv.WaitFor(t, fmt.Sprintf("%q in the log of %s/%s", want, pc[0], pc[1]), time.Minute, func() bool {
			out, err := kubectlIn(t, "", "logs", "-n", ns, pc[0], "-c", pc[1])
			return err == nil && strings.Contains(out, want)
		})
	}
}

// TestDRAShares: four claims of 20 Gi + 25 % share one 80 GB GPU and a
// fifth goes to another; each container's limits file is its claim's
// capacity; what the claims consume never exceeds a GPU.
func TestDRAShares(t *testing.T) {
	const ns = "dra-shares"
	draNamespace(t, ns)
	m := `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: dra-shares, name: quarter}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.io
          capacity:
            requests: {memory: 20Gi, cores: "25"}
`
	for i := range 5 {
		m += fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {namespace: dra-shares, name: q%d}
spec:
  containers:
  - name: main
    image: cuda
    command: ["gpu-fill", "--hold", "forever"]
    resources: {claims: [{name: gpu}]}
  resourceClaims: [{name: gpu, resourceClaimTemplateName: quarter}]
`, i)
	}
	// The template, then the pods one at a time, so the first four are
	// allocated before the fifth.
	for i, doc := range strings.Split(m, "---\n") {
		apply(t, doc)
		if i > 1 {
			waitRunning(t, ns, fmt.Sprintf("q%d", i-2))
		}
	}
	waitRunning(t, ns, "q4")
	perGPU := map[string][]string{}
	for i := range 5 {
		name := fmt.Sprintf("q%d", i)
		c, gpu := draContainer(t, ns, name, "main")
		perGPU[gpu] = append(perGPU[gpu], name)
		var conf limiterconf.Config
		for _, mt := range c.Mounts {
			if mt.ContainerPath == limiterconf.Path {
				if !mt.ReadOnly {
					t.Errorf("%s: the limits file is mounted writable", name)
				}
				b, err := os.ReadFile(mt.HostPath)
				if err == nil {
					conf, err = limiterconf.Parse(b)
				}
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			}
		}
		if len(conf.Devices) != 1 || conf.Devices[0].UUID != gpu || conf.Devices[0].MemoryMiB != 20480 || conf.Devices[0].SMPercent != 25 {
			t.Errorf("%s: limits %+v, want %s 20480 MiB 25 %%", name, conf, gpu)
		}
		// The limiter enforces it: the container sees 20 GiB.
		logsContain(t, ns, name, "total 20480 MiB")
	}
	var sizes []int
	for _, pods := range perGPU {
		sizes = append(sizes, len(pods))
	}
	if len(perGPU) != 2 || !(sizes[0] == 4 && sizes[1] == 1 || sizes[0] == 1 && sizes[1] == 4) {
		t.Errorf("claims per GPU %v, want 4 on one and the fifth on another", perGPU)
	}
	checkCapacities(t, draNode)
}

// checkCapacities sums what every allocated claim consumes per device of
// node and compares it with the device's capacity in the slice.
func checkCapacities(t *testing.T, node string) {
	t.Helper()
	ctx := context.Background()
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node})
	if err != nil {
		t.Fatal(err)
	}
	capacity := map[string]map[resourceapi.QualifiedName]resource.Quantity{}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			capacity[d.Name] = map[resourceapi.QualifiedName]resource.Quantity{}
			for n, c := range d.Capacity {
				capacity[d.Name][n] = c.Value
			}
		}
	}
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]map[resourceapi.QualifiedName]*resource.Quantity{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != api.DRADriverName || r.Pool != node {
				continue
			}
			if used[r.Device] == nil {
				used[r.Device] = map[resourceapi.QualifiedName]*resource.Quantity{}
			}
			for n, q := range r.ConsumedCapacity {
				if used[r.Device][n] == nil {
					used[r.Device][n] = resource.NewQuantity(0, q.Format)
				}
				used[r.Device][n].Add(q)
			}
		}
	}
	for dev, caps := range used {
		for n, q := range caps {
			if c, ok := capacity[dev][n]; !ok || q.Cmp(c) > 0 {
				t.Errorf("device %s: claims consume %s of %s, its capacity is %s", dev, q.String(), n, c.String())
			}
		}
	}
}

// TestDRAExtendedResource: an unchanged nvidia.com/gpu: 1 pod on the DRA
// node runs through the DeviceClass that maps nvidia.com/gpu; a HAMi-style
// share stays pending there with a reason that names DRA.
func TestDRAExtendedResource(t *testing.T) {
	const ns = "dra-extended"
	draNamespace(t, ns)
	apply(t, `
apiVersion: v1
kind: Pod
metadata: {namespace: dra-extended, name: whole}
spec:
  nodeSelector: {tessera.io/lab-mode: dra}
  containers:
  - name: main
    image: cuda
    command: ["sh", "-c", "nvidia-smi -L; sleep 3600"]
    resources: {limits: {nvidia.com/gpu: 1}}
---
apiVersion: v1
kind: Pod
metadata: {namespace: dra-extended, name: hami}
spec:
  nodeSelector: {tessera.io/lab-mode: dra}
  containers:
  - name: main
    image: cuda
    command: ["sh", "-c", "nvidia-smi -L; sleep 3600"]
    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30}}
`)
	p := waitRunning(t, ns, "whole")
	if p.Status.ExtendedResourceClaimStatus == nil || len(p.Status.ExtendedResourceClaimStatus.RequestMappings) != 1 {
		t.Fatalf("pod whole has no extended-resource claim: %+v", p.Status.ExtendedResourceClaimStatus)
	}
	claim, err := client.ResourceV1().ResourceClaims(ns).Get(context.Background(), p.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil {
		t.Fatalf("the extended-resource claim %s is not allocated", claim.Name)
	}
	r := claim.Status.Allocation.Devices.Results
	if len(r) != 1 || r[0].Driver != api.DRADriverName || r[0].Pool != draNode {
		t.Fatalf("the extended-resource claim's allocation %+v, want one Tessera GPU of %s", r, draNode)
	}
	// A share ID means the device allows several allocations: the claim
	// then consumed all its memory (the GPU whole; docs/dra.md).
	if mem := r[0].ConsumedCapacity[api.CapacityMemory]; r[0].ShareID != nil && mem.Cmp(resource.MustParse("80Gi")) < 0 {
		t.Errorf("the extended-resource claim consumed %s of memory, want the whole GPU", mem.String())
	}
	if _, ok := p.Annotations[api.AnnotationAllocation]; ok {
		t.Error("a pod served by DRA carries a Tessera allocation record")
	}
	_, gpu := draContainer(t, ns, "whole", "main")
	logsContain(t, ns, "whole", "(UUID: "+gpu+")")

	want := `node serves its GPUs through DRA (mode dra) and gives nvidia.com/gpu only whole GPUs through DeviceClass extended-resource.gpu.tessera.io: container "main" asks 3000 MiB of GPU memory`
	testenv.WaitFor(t, "the HAMi-style pod's reason", time.Minute, func() bool {
		h, err := client.CoreV1().Pods(ns).Get(context.Background(), "hami", metav1.GetOptions{})
		if err != nil || h.Spec.NodeName != "" {
			return false
		}
		for _, c := range h.Status.Conditions {
			if c.Type == corev1.PodScheduled && strings.Contains(c.Message, want) {
				return true
			}
		}
		return false
	})
}

// TestDRAAgentRestart: the node agent of lab-dra killed while claims are
// prepared: the pods keep running, the restarted agent knows the claims
// (a new pod's claim is prepared beside them, deleting the pods
// unprepares them), and nothing is left on the node afterwards.
func TestDRAAgentRestart(t *testing.T) {
	const ns = "dra-restart"
	draNamespace(t, ns)
	ctx := context.Background()
	pod := func(name string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {namespace: dra-restart, name: %s}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: cuda
    command: ["gpu-fill", "--hold", "forever"]
    resources: {claims: [{name: gpu}]}
  resourceClaims: [{name: gpu, resourceClaimTemplateName: share}]
`, name)
	}
	apply(t, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: dra-restart, name: share}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.io
          capacity:
            requests: {memory: 10Gi, cores: "10"}
`+pod("r0")+pod("r1"))
	before := map[string]int{}
	for _, p := range []string{"r0", "r1"} {
		waitRunning(t, ns, p)
		c, _ := draContainer(t, ns, p, "main")
		before[p] = c.PID
	}
	restartComponent(t, "node-agent/"+draNode)
	apply(t, pod("r2"))
	waitRunning(t, ns, "r2")
	for _, p := range []string{"r0", "r1"} {
		c, _ := draContainer(t, ns, p, "main")
		if c.PID != before[p] || !supervisor.ProcessAlive(c.PID) {
			t.Errorf("%s: container pid %d (alive %v), was %d: want it kept running across the agent's restart", p, c.PID, supervisor.ProcessAlive(c.PID), before[p])
		}
	}
	zero := int64(0)
	if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	nd := dir.Node(draNode)
	testenv.WaitFor(t, "no CDI spec or claim directory left on "+draNode, 2*time.Minute, func() bool {
		return len(leftovers(nd)) == 0
	})
	if l := leftovers(nd); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}

// restartComponent kills one of the lab's components (SIGKILL) and waits
// until its supervisor has started it again.
func restartComponent(t *testing.T, name string) {
	t.Helper()
	st, err := lab.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := st.Components[name].PID
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s (pid %d): %v", name, old, err)
	}
	testenv.WaitFor(t, name+" restarted", time.Minute, func() bool {
		now, err := lab.ReadState(dir)
		return err == nil && now.Components[name].PID != old && supervisor.ProcessAlive(now.Components[name].PID)
	})
}

// leftovers lists the CDI specs and claim directories on the node.
func leftovers(node labdir.NodeDir) []string {
	var out []string
	for _, d := range []string{node.CDI(), node.Claims()} {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.Name() != "checkpoint.json" {
				out = append(out, filepath.Join(d, e.Name()))
			}
		}
	}
	return out
}
