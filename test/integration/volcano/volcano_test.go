//go:build integration

package volcano_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const volcanoNode = "lab-volcano"

var (
	jobsGVR      = schema.GroupVersionResource{Group: "batch.volcano.sh", Version: "v1alpha1", Resource: "jobs"}
	podGroupsGVR = schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "podgroups"}
	queuesGVR    = schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "queues"}
)

// useNamespace creates ns; at the end of the test its Volcano Jobs and
// pods are deleted and waited for, so the GPUs are free for the next test.
func useNamespace(t *testing.T, ns string) {
	t.Helper()
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = dyn.Resource(jobsGVR).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = client.AppsV1().Deployments(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		testenv.WaitFor(t, "the pods of "+ns+" deleted", 3*time.Minute, func() bool {
			_ = client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
			l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0
		})
	})
}

// running waits until the pods of ns matching selector are n and Running.
func running(t *testing.T, ns, selector string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	testenv.WaitFor(t, fmt.Sprintf("%d pods %q of %s Running", n, selector, ns), timeout, func() bool {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false
		}
		pods = pods[:0]
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning {
				pods = append(pods, p)
			}
		}
		return len(pods) == n && len(l.Items) == n
	})
	return pods
}

// record is what the node's runtime gave a container.
func record(t *testing.T, ns, pod, container string) *hollowkubelet.Container {
	t.Helper()
	m, err := filepath.Glob(dir.Node("*").ContainerRecord(ns, pod, container))
	if err != nil || len(m) == 0 {
		t.Fatalf("no record of container %s of %s/%s", container, ns, pod)
	}
	c, err := labdir.ReadContainer(m[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkLimited checks that a container of a Volcano pod got gpus GPUs
// under Tessera's limiter at mib MiB each: the read-only limits file (what
// the limiter enforces), the preload list, and HAMi-core's variables.
func checkLimited(t *testing.T, ns, pod, container string, gpus int, mib uint64) {
	t.Helper()
	c := record(t, ns, pod, container)
	var conf *limiterconf.Config
	preload := false
	for _, m := range c.Mounts {
		switch m.ContainerPath {
		case limiterconf.Path:
			b, err := os.ReadFile(m.HostPath)
			if err != nil || !m.ReadOnly {
				t.Fatalf("%s/%s: limits file %+v: %v", pod, container, m, err)
			}
			cfg, err := limiterconf.Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			conf = &cfg
		case api.ContainerPreload:
			preload = m.ReadOnly
		}
	}
	if conf == nil || !preload {
		t.Fatalf("%s/%s: limits file %v, read-only preload %v; mounts %+v", pod, container, conf != nil, preload, c.Mounts)
	}
	if len(conf.Devices) != gpus || len(c.GPUs) != gpus {
		t.Fatalf("%s/%s: %d GPUs in the limits file, %d exposed; want %d", pod, container, len(conf.Devices), len(c.GPUs), gpus)
	}
	for i, d := range conf.Devices {
		if d.MemoryMiB != mib || c.Env[fmt.Sprintf("%s_%d", api.EnvMemoryLimit, i)] != fmt.Sprintf("%dm", mib) {
			t.Errorf("%s/%s GPU %d: limit %d MiB (env %q), want %d", pod, container, i, d.MemoryMiB, c.Env[fmt.Sprintf("%s_%d", api.EnvMemoryLimit, i)], mib)
		}
	}
}

// TestVolcanoExamples: Volcano's vGPU examples, as Volcano's and its
// device plugin's documentation write them (a pod with one vGPU, a pod
// whose first and third containers ask two vGPUs each, a Deployment of ten
// 16 GiB vGPUs), run on the volcano node placed by Volcano's scheduler,
// every container under Tessera's limiter at its annotated memory; and a
// program in such a pod is refused at its limit.
func TestVolcanoExamples(t *testing.T) {
	const ns = "vexamples"
	useNamespace(t, ns)
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: test1, namespace: vexamples, labels: {example: single}}
spec:
  restartPolicy: OnFailure
  schedulerName: volcano
  containers:
  - image: ubuntu:24.04
    name: pod1-ctr
    command: ["sleep"]
    args: ["100000"]
    resources:
      limits:
        volcano.sh/vgpu-memory: 1024
        volcano.sh/vgpu-number: 1
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-pod12, namespace: vexamples, labels: {example: several}}
spec:
  schedulerName: volcano
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          volcano.sh/vgpu-number: 2
          volcano.sh/vgpu-memory: 2000
    - name: ubuntu-container0
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
    - name: ubuntu-container1
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          volcano.sh/vgpu-number: 2
          volcano.sh/vgpu-memory: 3000
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: resnet101-deployment, namespace: vexamples}
spec:
  selector:
    matchLabels:
      app: resnet101-server
  replicas: 10
  template:
    metadata:
      labels:
        app: resnet101-server
    spec:
      schedulerName: volcano
      containers:
      - name: resnet101-container
        image: ubuntu:24.04
        command: ["sleep","infinity"]
        resources:
         limits:
            volcano.sh/vgpu-number: 1
            volcano.sh/vgpu-memory: 16384
`)
	running(t, ns, "example=single", 1, 2*time.Minute)
	running(t, ns, "example=several", 1, 2*time.Minute)
	deploy := running(t, ns, "app=resnet101-server", 10, 3*time.Minute)
	checkLimited(t, ns, "test1", "pod1-ctr", 1, 1024)
	checkLimited(t, ns, "gpu-pod12", "ubuntu-container", 2, 2000)
	checkLimited(t, ns, "gpu-pod12", "ubuntu-container1", 2, 3000)
	if c := record(t, ns, "gpu-pod12", "ubuntu-container0"); len(c.GPUs) != 0 || c.Env[api.EnvVisibleDevices] != "" {
		t.Errorf("the container without vGPUs got GPUs %v", c.GPUs)
	}
	for _, p := range deploy {
		checkLimited(t, ns, p.Name, "resnet101-container", 1, 16384)
	}
	// Every pod was placed by Volcano on the volcano node, its grant in
	// the annotations Volcano wrote, and served.
	l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Items {
		if p.Spec.NodeName != volcanoNode || p.Annotations[api.AnnotationVolcanoNode] != volcanoNode ||
			p.Annotations[api.AnnotationVolcanoIDs] == "" || p.Annotations[api.AnnotationVolcanoBindPhase] != api.VolcanoBindSuccess {
			t.Errorf("pod %s: node %q, annotations %v", p.Name, p.Spec.NodeName, p.Annotations)
		}
	}

	// The limit is enforced: a program in a pod of the single example's
	// shape sees 3000 MiB and is refused past it.
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: fill, namespace: vexamples, labels: {example: fill}}
spec:
  restartPolicy: Never
  schedulerName: volcano
  containers:
  - name: main
    image: cuda
    command: ["gpu-fill"]
    resources:
      limits:
        volcano.sh/vgpu-number: 1
        volcano.sh/vgpu-memory: 3000
`)
	log := podLog(t, ns, "fill", "1 MiB more")
	if !strings.Contains(log, "cuMemGetInfo: total 3000 MiB") || !strings.Contains(log, "1 MiB more: CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("gpu-fill under a 3000 MiB vGPU:\n%s", log)
	}
}

// podLog waits until the log of pod ns/name says until, and returns it.
func podLog(t *testing.T, ns, name, until string) string {
	t.Helper()
	var log string
	testenv.WaitFor(t, name+"'s log", 2*time.Minute, func() bool {
		out, err := kubectlErr("", "logs", "-n", ns, name)
		log = out
		return err == nil && strings.Contains(out, until)
	})
	return log
}

// job is a Volcano Job of n workers, each asking one vGPU of mib MiB,
// with minAvailable min, in queue, at priorityClass (may be empty).
func job(ns, name, queue, priorityClass string, n, min int, mib int64) string {
	pc := ""
	if priorityClass != "" {
		pc = "\n        priorityClassName: " + priorityClass
	}
	return fmt.Sprintf(`apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: %s, namespace: %s}
spec:
  schedulerName: volcano
  minAvailable: %d
  queue: %s
  tasks:
  - name: worker
    replicas: %d
    template:
      metadata:
        labels: {job: %s}
      spec:
        restartPolicy: OnFailure
        terminationGracePeriodSeconds: 1%s
        containers:
        - name: main
          image: cuda
          resources:
            limits:
              volcano.sh/vgpu-number: 1
              volcano.sh/vgpu-memory: %d
`, name, ns, min, queue, n, name, pc, mib)
}

// podGroupOf is the PodGroup Volcano's controller made for a Job.
func podGroupOf(t *testing.T, ns, job string) *unstructured.Unstructured {
	t.Helper()
	var pg *unstructured.Unstructured
	testenv.WaitFor(t, "the PodGroup of job "+job, time.Minute, func() bool {
		l, err := dyn.Resource(podGroupsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for i := range l.Items {
			for _, o := range l.Items[i].GetOwnerReferences() {
				if o.Kind == "Job" && o.Name == job {
					pg = &l.Items[i]
					return true
				}
			}
		}
		return false
	})
	return pg
}

// podGroupSays waits until the PodGroup of job has a condition or an event
// of type Unschedulable whose message matches re (Volcano's scheduler has
// evaluated it and decided), and returns the message.
func podGroupSays(t *testing.T, ns, job string, re *regexp.Regexp) string {
	t.Helper()
	name := podGroupOf(t, ns, job).GetName()
	var said string
	testenv.WaitFor(t, fmt.Sprintf("PodGroup %s: Unschedulable matching %q", name, re), 2*time.Minute, func() bool {
		pg, err := dyn.Resource(podGroupsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(pg.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if msg, _ := m["message"].(string); m["type"] == "Unschedulable" && re.MatchString(msg) {
				said = msg
				return true
			}
		}
		evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "Unschedulable" && re.MatchString(e.Message) {
				said = e.Message
				return true
			}
		}
		return false
	})
	return said
}

// bound counts the pods of a job bound to a node.
func bound(t *testing.T, ns, job string) int {
	t.Helper()
	l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job=" + job})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range l.Items {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// TestVolcanoGang: a Volcano Job of 4 workers of 30000 MiB (one per GPU)
// with minAvailable 4 starts all or nothing. With 5 of the node's 8 GPUs
// held by other pods there is room for 3: Volcano's gang plugin reports
// the PodGroup unschedulable and none of its pods is bound. When a GPU
// frees, all 4 start, each under its limit.
func TestVolcanoGang(t *testing.T) {
	const ns = "vgang"
	useNamespace(t, ns)
	apply(t, job(ns, "blockers", "default", "", 5, 5, 30000))
	running(t, ns, "job=blockers", 5, 2*time.Minute)
	apply(t, job(ns, "gang", "default", "", 4, 4, 30000))
	// Volcano's gang plugin has weighed the job with its four pods
	// created and none placed (not before: the PodGroup says so from its
	// creation, with no pods yet). Each of the four is Pending, or
	// Pipelined: Volcano's preempt action nominates a task onto a node
	// whose free vGPU memory, summed, would hold it (with no victim to
	// evict), without binding it.
	var split []string
	for pending := 0; pending <= 4; pending++ {
		switch pipelined := 4 - pending; {
		case pipelined == 0:
			split = append(split, "4 Pending")
		case pending == 0:
			split = append(split, "4 Pipelined")
		default:
			split = append(split, fmt.Sprintf("%d Pending, %d Pipelined", pending, pipelined), fmt.Sprintf("%d Pipelined, %d Pending", pipelined, pending))
		}
	}
	msg := podGroupSays(t, ns, "gang", regexp.MustCompile(`tasks in gang unschedulable: pod group is not ready, (`+strings.Join(split, "|")+`), 4 minAvailable`))
	if n := bound(t, ns, "gang"); n != 0 {
		t.Fatalf("%d of the gang's pods bound with room for 3 (PodGroup: %q)", n, msg)
	}
	t.Logf("with room for 3: %s", msg)
	// Room appears: one blocker's Job scaled away (its pods deleted).
	l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job=blockers"})
	if err != nil || len(l.Items) == 0 {
		t.Fatal(err)
	}
	if err := dyn.Resource(jobsGVR).Namespace(ns).Delete(ctx, "blockers", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	pods := running(t, ns, "job=gang", 4, 3*time.Minute)
	t.Logf("all 4 workers Running %v after room appeared", time.Since(start).Round(100*time.Millisecond))
	for _, p := range pods {
		checkLimited(t, ns, p.Name, "main", 1, 30000)
	}
}

// TestVolcanoQueueCapability: a Queue with capability
// volcano.sh/vgpu-memory: 4000 admits a Job of two 2000 MiB workers and
// holds the next, while the same Job in the default queue runs beside
// them: what holds it is the queue's capability, counted against the
// vGPU memory the node agent advertises (volcano#4168).
func TestVolcanoQueueCapability(t *testing.T) {
	const ns = "vqueue"
	useNamespace(t, ns)
	q := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
		"metadata": map[string]any{"name": "vgpu-4000"},
		"spec":     map[string]any{"weight": int64(1), "reclaimable": false, "capability": map[string]any{api.VolcanoVGPUMemory: "4000"}},
	}}
	if _, err := dyn.Resource(queuesGVR).Create(ctx, q, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dyn.Resource(queuesGVR).Delete(ctx, "vgpu-4000", metav1.DeleteOptions{}) })
	apply(t, job(ns, "first", "vgpu-4000", "", 2, 2, 2000))
	running(t, ns, "job=first", 2, 2*time.Minute)
	apply(t, job(ns, "second", "vgpu-4000", "", 1, 1, 2000))
	apply(t, job(ns, "control", "default", "", 1, 1, 2000))
	running(t, ns, "job=control", 1, 2*time.Minute)
	msg := podGroupSays(t, ns, "second", regexp.MustCompile(`.`))
	if n := bound(t, ns, "second"); n != 0 {
		t.Fatalf("the second job has %d pods bound beyond the queue's capability", n)
	}
	t.Logf("second job held: %s", msg)
}

// TestVolcanoPreemptionVictimFreed: a lower-priority vGPU job holds every
// GPU; a higher-priority job waits (Volcano has weighed it). When one of
// the low job's pods is evicted (deleted, as Volcano's evictor does), its
// share leaves the agent's ledger at once, so the waiting pod is served
// on that GPU under its limit, and the victim's limiter state is removed.
// (Volcano v1.14's preempt action does not evict for vGPU preemptors:
// docs/volcano.md, "Preemption".)
func TestVolcanoPreemptionVictimFreed(t *testing.T) {
	const ns = "vevict"
	useNamespace(t, ns)
	apply(t, `apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: vgpu-low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: vgpu-high}
value: 1000
`)
	t.Cleanup(func() {
		_ = client.SchedulingV1().PriorityClasses().Delete(ctx, "vgpu-low", metav1.DeleteOptions{})
		_ = client.SchedulingV1().PriorityClasses().Delete(ctx, "vgpu-high", metav1.DeleteOptions{})
	})
	apply(t, job(ns, "low", "default", "vgpu-low", 8, 1, 40960))
	low := running(t, ns, "job=low", 8, 2*time.Minute)
	apply(t, job(ns, "high", "default", "vgpu-high", 1, 1, 30000))
	podGroupSays(t, ns, "high", regexp.MustCompile(`tasks in gang unschedulable: pod group is not ready, 1 Pending`))
	if n := bound(t, ns, "high"); n != 0 {
		t.Fatalf("the high-priority pod bound while every GPU is held whole")
	}
	victim := low[0]
	gpu := record(t, ns, victim.Name, "main").GPUs[0].UUID
	state := statedir.Dirs{Root: dir.Node(volcanoNode).LimiterState()}
	if !state.Served(victim.UID, "main") {
		t.Fatalf("no limiter state of %s before its eviction", victim.Name)
	}
	zero := int64(0)
	if err := client.CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	high := running(t, ns, "job=high", 1, 2*time.Minute)
	checkLimited(t, ns, high[0].Name, "main", 1, 30000)
	if got := record(t, ns, high[0].Name, "main").GPUs[0].UUID; got != gpu {
		t.Errorf("the high-priority pod got GPU %s, want the evicted pod's %s (every other GPU is held whole)", got, gpu)
	}
	testenv.WaitFor(t, "the evicted pod's limiter state removed", 3*time.Minute, func() bool {
		return !state.Served(victim.UID, "main")
	})
}

// TestVolcanoAnnotationsOnlyFromVolcano: the admission policy lets only
// Volcano's scheduler write Volcano's vGPU grants (the lab's admin is
// refused like any tenant): on a pod created with them (a pod naming
// spec.nodeName on the volcano node with a grant it made up), on a patch
// of a pod's, and through a Binding; the bind phase is Volcano's and the
// node agents' only.
func TestVolcanoAnnotationsOnlyFromVolcano(t *testing.T) {
	const ns = "vforge"
	useNamespace(t, ns)
	forged := `volcano.sh/vgpu-node: lab-volcano
    volcano.sh/vgpu-ids-new: "GPU-00000000-0000-0000-0000-000000000000,NVIDIA,40960,100:"`
	out, err := kubectlErr(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: squatter
  namespace: vforge
  annotations:
    %s
spec:
  nodeName: lab-volcano
  containers:
  - name: main
    image: cuda
`, forged), "create", "-f", "-")
	if err == nil || !strings.Contains(out, "only system:serviceaccount:volcano-system:volcano-scheduler may set, change or remove Volcano") {
		t.Fatalf("a pod created with a made-up grant: %v\n%s", err, out)
	}
	// A pod nothing schedules, then its grant patched in, and bound by a
	// Binding carrying one.
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: waiting, namespace: vforge}
spec:
  schedulerName: nobody
  containers:
  - name: main
    image: cuda
    resources:
      limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 1000}
`)
	for _, patch := range []string{
		`{"metadata":{"annotations":{"volcano.sh/vgpu-ids-new":"GPU-00000000-0000-0000-0000-000000000000,NVIDIA,40960,100:"}}}`,
		`{"metadata":{"annotations":{"volcano.sh/bind-phase":"success"}}}`,
	} {
		out, err := kubectlErr("", "patch", "pod", "-n", ns, "waiting", "--type=merge", "-p", patch)
		if err == nil || !strings.Contains(out, "tessera: only") {
			t.Errorf("patch %s: %v\n%s", patch, err, out)
		}
	}
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waiting", Annotations: map[string]string{api.AnnotationVolcanoNode: volcanoNode, api.AnnotationVolcanoIDs: "GPU-00000000-0000-0000-0000-000000000000,NVIDIA,1000,0:"}},
		Target:     corev1.ObjectReference{Kind: "Node", Name: volcanoNode},
	}
	if err := client.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("a Binding carrying a made-up grant: %v, want it refused", err)
	}
}

// TestVolcanoDRA: Tessera's DRA claims under Volcano's scheduler (its
// predicates plugin wraps kube-scheduler's DynamicResources): a claim for
// a whole GPU and a claim for a share (memory and cores as consumable
// capacity) of the DRA node, each pod placed by Volcano and its container
// under the limiter at the claim's memory.
func TestVolcanoDRA(t *testing.T) {
	const ns = "vdra"
	useNamespace(t, ns)
	apply(t, `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: share, namespace: vdra}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.io
          capacity: {requests: {memory: 20Gi, cores: "25"}}
---
apiVersion: v1
kind: Pod
metadata: {name: dra-share, namespace: vdra, labels: {dra: share}}
spec:
  schedulerName: volcano
  resourceClaims: [{name: gpu, resourceClaimTemplateName: share}]
  containers:
  - name: main
    image: cuda
    resources: {claims: [{name: gpu}]}
`)
	pods := running(t, ns, "dra=share", 1, 3*time.Minute)
	c := record(t, ns, pods[0].Name, "main")
	found := false
	for _, m := range c.Mounts {
		if m.ContainerPath != limiterconf.Path {
			continue
		}
		b, err := os.ReadFile(m.HostPath)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := limiterconf.Parse(b)
		if err != nil || len(cfg.Devices) != 1 || cfg.Devices[0].MemoryMiB != 20480 || cfg.Devices[0].SMPercent != 25 {
			t.Fatalf("limits file %+v, %v; want 20480 MiB and 25 percent", cfg, err)
		}
		found = true
	}
	if !found || pods[0].Spec.NodeName != "lab-dra-01" {
		t.Errorf("pod on %s, limits file mounted %v (mounts %+v)", pods[0].Spec.NodeName, found, c.Mounts)
	}
}

// TestVolcanoMIG: Volcano's mig mode. On lab-vc-mig-01 (an A100-40GB in
// MIG mode, registered in Volcano's mode "mig"), a vGPU pod asking 9000
// MiB is given by Volcano's scheduler the first instance of the geometry
// group whose smallest fitting profile is 2g.10gb (deploy/volcano's
// device configuration: group2, position 0); the agent makes that
// instance, the container sees it alone, with its own memory (the MIG
// instance's, no limiter: the hardware enforces it), and once the pod is
// deleted the instance is destroyed.
func TestVolcanoMIG(t *testing.T) {
	const ns, node = "vmig", "lab-vc-mig-01"
	useNamespace(t, ns)
	reg, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := reg.Annotations[api.AnnotationVolcanoRegister]; !strings.HasSuffix(r, ",true,"+api.VolcanoModeMIG+":") {
		t.Fatalf("%s registers %q, want its GPU in mode %s", node, r, api.VolcanoModeMIG)
	}
	apply(t, `apiVersion: v1
kind: Pod
metadata:
  name: mig
  namespace: vmig
  annotations: {volcano.sh/vgpu-mode: mig}   # Volcano places it on a GPU in mig mode only
spec:
  restartPolicy: Never
  schedulerName: volcano
  tolerations: [{key: tessera.io/lab-sharing, value: vc-mig, effect: NoSchedule}]
  containers:
  - name: main
    image: cuda
    command: ["gpu-fill", "--hold", "forever"]
    resources:
      limits:
        volcano.sh/vgpu-number: 1
        volcano.sh/vgpu-memory: 9000
`)
	running(t, ns, "", 1, 2*time.Minute)
	log := podLog(t, ns, "mig", "holding")
	if !strings.Contains(log, "cuMemGetInfo: total 9856 MiB") || !strings.Contains(log, "1 MiB more: CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("gpu-fill on a 2g.10gb instance:\n%s", log)
	}
	p, err := client.CoreV1().Pods(ns).Get(ctx, "mig", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gpu := strings.TrimSuffix(reg.Annotations[api.AnnotationVolcanoRegister], ",true,mig:")
	gpu = gpu[:strings.IndexByte(gpu, ',')]
	if p.Spec.NodeName != node || p.Annotations[api.AnnotationVolcanoIDs] != gpu+"[group2-0],NVIDIA,9000,0:" ||
		p.Annotations[api.AnnotationVolcanoBindPhase] != api.VolcanoBindSuccess {
		t.Errorf("pod on %q, annotations %v; want group2's position 0 of %s on %s, served", p.Spec.NodeName, p.Annotations, gpu, node)
	}
	c := record(t, ns, "mig", "main")
	if len(c.GPUs) != 1 || !strings.HasPrefix(c.GPUs[0].UUID, "MIG-") || c.Env[api.EnvVisibleDevices] != c.GPUs[0].UUID {
		t.Errorf("the container's GPUs %+v (%s=%q), want one MIG device", c.GPUs, api.EnvVisibleDevices, c.Env[api.EnvVisibleDevices])
	}
	for _, m := range c.Mounts {
		if m.ContainerPath == limiterconf.Path || m.ContainerPath == api.ContainerPreload {
			t.Errorf("the limiter given to a MIG instance: %+v", m)
		}
	}
	// The instance is there while its pod runs: the agent's list of MIG
	// devices (what the node's runtime read to start the container) still
	// has it, and its log says it was made for this pod.
	if len(c.GPUs) == 1 {
		devs := migDevices(t, node)
		if d, ok := devs[c.GPUs[0].UUID]; !ok || d.Profile != "2g.10gb" || d.Start != 0 {
			t.Errorf("the node's MIG devices %+v while the pod runs, want %s as 2g.10gb@0", devs, c.GPUs[0].UUID)
		}
	}
	agentLog := dir.Log("node-agent/" + node)
	made, err := os.ReadFile(agentLog)
	if err != nil || !labdir.LogLine("Created a MIG instance", "pod", ns+"/mig", "gpu", gpu, "instance", "2g.10gb@0").Match(made) {
		t.Errorf("the agent's log does not show 2g.10gb@0 made for %s/mig (%v)", ns, err)
	}
	zero := int64(0)
	if err := client.CoreV1().Pods(ns).Delete(ctx, "mig", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	destroyed := labdir.LogLine("Destroyed a MIG instance no pod holds", "gpu", gpu, "instance", "2g.10gb@0")
	testenv.WaitFor(t, "the instance destroyed once its pod is gone", 2*time.Minute, func() bool {
		b, err := os.ReadFile(agentLog)
		return err == nil && destroyed.Match(b) && len(migDevices(t, node)) == 0
	})
}

// migDevices are the MIG devices the node's agent sees, by UUID (the
// list it keeps for the node's runtime: a volcano node publishes no
// inventory).
func migDevices(t *testing.T, node string) map[string]api.MIGDevice {
	t.Helper()
	b, err := os.ReadFile(dir.Node(node).MIGDevices())
	if err != nil {
		t.Fatal(err)
	}
	var devs map[string]api.MIGDevice
	if err := json.Unmarshal(b, &devs); err != nil {
		t.Fatalf("%s: %v", dir.Node(node).MIGDevices(), err)
	}
	return devs
}
