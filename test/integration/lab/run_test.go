//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/demo"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/status"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// kubectlIn runs kubectl with stdin.
func kubectlIn(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(kubectlBin, append([]string{"--kubeconfig", dir.Kubeconfig()}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// apply is `kubectl apply -f -`.
func apply(t *testing.T, manifest string) {
	t.Helper()
	if out, err := kubectlIn(t, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// waitPod waits until the pod's phase is one of phases, or until ok says
// it is far enough.
func waitPod(t *testing.T, ns, name string, timeout time.Duration, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	testenv.WaitFor(t, "pod "+ns+"/"+name, timeout, func() bool {
		var err error
		p, err = client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && ok(p)
	})
	return p
}

func phase(phases ...corev1.PodPhase) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		for _, ph := range phases {
			if p.Status.Phase == ph {
				return true
			}
		}
		return false
	}
}

// logsContain waits until the pod's log (kubectl logs) contains s.
func logsContain(t *testing.T, ns, pod, s string) string {
	t.Helper()
	var out string
	testenv.WaitFor(t, fmt.Sprintf("%q in the log of %s", s, pod), time.Minute, func() bool {
		var err error
		out, err = kubectlIn(t, "", "logs", "-n", ns, pod) // fails until the container started
		return err == nil && strings.Contains(out, s)
	})
	return out
}

// procStart is a process's start time (field 22 of /proc/PID/stat), to
// tell it from a later process with the same PID; "" when it is gone.
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

var (
	totalRE   = regexp.MustCompile(`cuMemGetInfo: total (\d+) MiB, free (\d+) MiB`)
	inTotalRE = regexp.MustCompile(`\((\d+) MiB in total\)`)
)

// lastInTotal is the last "(N MiB in total)" of a gpu-fill log.
func lastInTotal(log string) int {
	m := inTotalRE.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// TestFractionalLimit is issue 15's acceptance: a fractional pod's
// program is refused at its limit and `kubectl logs` shows the limit as
// the GPU's total memory; a second process of the container shares the
// limit; deleting the pod frees the share and leaves no process behind.
func TestFractionalLimit(t *testing.T) {
	const ns = "limit"
	useNamespace(t, ns)
	// The first process fills 2 GiB and holds it; once it holds, the
	// second fills what the limit leaves, in 512 MiB steps, and holds.
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: frac, namespace: limit}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: tessera-lab/cuda
    command:
    - sh
    - -c
    - |
      gpu-fill --max 2048 --hold forever > /tmp/first.log 2>&1 &
      until grep -q holding /tmp/first.log; do sleep 0.05; done
      echo "== first"; cat /tmp/first.log
      echo "== second"; gpu-fill --step 512 --hold forever
    resources:
      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4096}
`)
	out := logsContain(t, ns, "frac", "== second")
	testenv.WaitFor(t, "the second process holding", time.Minute, func() bool {
		out = logsContain(t, ns, "frac", "holding")
		return strings.Count(out, "holding") == 2
	})
	t.Logf("kubectl logs frac:\n%s", out)
	first, second, _ := strings.Cut(out, "== second")
	for _, part := range []string{first, second} {
		m := totalRE.FindStringSubmatch(part)
		if m == nil || m[1] != "4096" {
			t.Fatalf("a process of the 4096 MiB pod saw %v as the GPU's memory, want total 4096 MiB:\n%s", m, part)
		}
	}
	if got := lastInTotal(first); got != 2048 {
		t.Errorf("first process holds %d MiB, want the 2048 it asked for", got)
	}
	// The second shares the limit: it gets what the first leaves (less
	// the contexts the limiter charges), is refused there, and 1 MiB
	// more is refused too.
	got := lastInTotal(second)
	if got+2048 > 4096 || got < 4096-2048-128 {
		t.Errorf("second process got %d MiB beside the first's 2048 of a 4096 MiB limit; want the rest (less contexts), no more", got)
	}
	if !strings.Contains(second, "refused at") || !strings.Contains(second, "1 MiB more: CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("second process was not refused at the limit:\n%s", second)
	}

	// The node's view: both processes on the pod's GPU, together within
	// the limit; the scheduler's record says the same GPU.
	pod, err := client.CoreV1().Pods(ns).Get(context.Background(), "frac", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := kubeobj.Record(pod)
	if err != nil || rec == nil || len(rec.Containers) != 1 || len(rec.Containers[0].Devices) != 1 {
		t.Fatalf("record %+v, %v", rec, err)
	}
	gpu := rec.Containers[0].Devices[0].UUID
	state := filepath.Join(dir.Node(pod.Spec.NodeName).GPUs(), gpu)
	_, procs, err := fakegpu.Read(state)
	if err != nil {
		t.Fatal(err)
	}
	var used uint64
	for _, p := range procs {
		used += p.UsedBytes
	}
	if len(procs) != 2 || used > 4096<<20 || used < 4000<<20 {
		t.Errorf("GPU %s holds %d MiB in %d processes; want the pod's two processes, together 4096 MiB at most: %+v", gpu, used>>20, len(procs), procs)
	}
	c, err := dir.Node(pod.Spec.NodeName).Container(ns, "frac", "main")
	if err != nil || c.PID == 0 {
		t.Fatalf("container record %+v, %v", c, err)
	}
	pids := []int{c.PID}
	for _, p := range procs {
		pids = append(pids, int(p.HostPID))
	}
	starts := map[int]string{}
	for _, pid := range pids {
		if starts[pid] = procStart(pid); starts[pid] == "" {
			t.Fatalf("process %d of the pod is not running", pid)
		}
	}
	if r := checkInvariant(t); !gpuHolds(r, gpu, "limit/frac") {
		t.Fatalf("the report does not show limit/frac on %s", gpu)
	}

	start := time.Now()
	kubectl(t, "delete", "pod", "-n", ns, "frac")
	t.Logf("kubectl delete took %v", time.Since(start).Round(10*time.Millisecond))
	for _, pid := range pids {
		if s := procStart(pid); s != "" && s == starts[pid] {
			t.Errorf("process %d of the deleted pod still runs", pid)
		}
	}
	if _, procs, err := fakegpu.Read(state); err != nil || len(procs) != 0 {
		t.Errorf("GPU %s after the delete: %+v, %v; want no process", gpu, procs, err)
	}
	if r := checkInvariant(t); gpuHolds(r, gpu, "limit/frac") {
		t.Errorf("GPU %s still charged with the deleted pod", gpu)
	}
}

func gpuHolds(r *status.Report, uuid, pod string) bool {
	for _, n := range r.Nodes {
		for _, g := range n.GPUs {
			if g.UUID != uuid {
				continue
			}
			for _, p := range g.Pods {
				if p == pod {
					return true
				}
			}
		}
	}
	return false
}

// TestCPUOnlyPod: a pod that asks for no GPU is placed by the default
// scheduler profile and runs.
func TestCPUOnlyPod(t *testing.T) {
	const ns = "cpu"
	useNamespace(t, ns)
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: cpu}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'echo hello from $(hostname); nproc >/dev/null']
    resources: {requests: {cpu: 100m, memory: 64Mi}}
`)
	p := waitPod(t, ns, "hello", time.Minute, phase(corev1.PodSucceeded, corev1.PodFailed))
	if p.Status.Phase != corev1.PodSucceeded || p.Spec.SchedulerName != lab.DefaultScheduler || p.Spec.NodeName == "" {
		t.Fatalf("pod %s on %q by %s; want Succeeded, placed by %s", p.Status.Phase, p.Spec.NodeName, p.Spec.SchedulerName, lab.DefaultScheduler)
	}
	if out := kubectl(t, "logs", "-n", ns, "hello"); !strings.Contains(out, "hello from hello") {
		t.Errorf("kubectl logs: %q", out)
	}
	c, err := dir.Node(p.Spec.NodeName).Container(ns, "hello", "main")
	if err != nil || len(c.GPUs) != 0 || c.Env[api.EnvVisibleDevices] != "" {
		t.Errorf("CPU-only container %+v, %v: want no GPU", c, err)
	}
}

// TestResourceQuota: the quota controller shows a ResourceQuota's usage
// and the API server refuses a pod over it, GPUs included.
func TestResourceQuota(t *testing.T) {
	const ns = "quota"
	useNamespace(t, ns)
	apply(t, `apiVersion: v1
kind: ResourceQuota
metadata: {name: team, namespace: quota}
spec:
  hard: {pods: "3", requests.nvidia.com/gpu: "2"}
`)
	testenv.WaitFor(t, "the quota's status", time.Minute, func() bool {
		q, err := client.CoreV1().ResourceQuotas(ns).Get(context.Background(), "team", metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) == 2
	})
	gpuPod := func(name string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: quota}
spec:
  containers:
  - name: main
    image: tessera-lab/cuda
    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 1024}}
`, name)
	}
	apply(t, gpuPod("g1")+"---\n"+gpuPod("g2"))
	for _, n := range []string{"g1", "g2"} {
		waitPod(t, ns, n, time.Minute, phase(corev1.PodRunning))
	}
	testenv.WaitFor(t, "the quota's usage", time.Minute, func() bool {
		out := kubectl(t, "describe", "quota", "-n", ns, "team")
		return regexp.MustCompile(`requests.nvidia.com/gpu\s+2\s+2`).MatchString(out) && regexp.MustCompile(`pods\s+2\s+3`).MatchString(out)
	})
	out, err := kubectlIn(t, gpuPod("g3"), "apply", "-f", "-")
	if err == nil || !strings.Contains(out, "exceeded quota: team") || !strings.Contains(out, "requests.nvidia.com/gpu") {
		t.Errorf("a third GPU pod over the quota: %v\n%s\nwant it refused, naming requests.nvidia.com/gpu", err, out)
	}
	cpuPod := func(name string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: quota}\nspec:\n  containers: [{name: main, image: busybox}]\n", name)
	}
	apply(t, cpuPod("c1"))
	if out, err := kubectlIn(t, cpuPod("c2"), "apply", "-f", "-"); err == nil || !strings.Contains(out, "exceeded quota: team") || !strings.Contains(out, "pods") {
		t.Errorf("a fourth pod over the quota's 3 pods: %v\n%s", err, out)
	}
}

// TestVersions: the API server and the kubelets report the pinned
// Kubernetes release, so kubectl version works.
func TestVersions(t *testing.T) {
	want, err := testenv.KubernetesVersion()
	if err != nil || !strings.HasPrefix(want, "v1.") {
		t.Fatalf("the pinned k8s.io/kubernetes version: %q, %v", want, err)
	}
	if out := kubectl(t, "version"); !strings.Contains(out, "Server Version: "+want) {
		t.Errorf("kubectl version:\n%s\nwant Server Version: %s", out, want)
	}
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if n.Status.NodeInfo.KubeletVersion != want || !strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "tessera-lab://") {
			t.Errorf("node %s: kubelet %s, runtime %s; want %s, tessera-lab", n.Name, n.Status.NodeInfo.KubeletVersion, n.Status.NodeInfo.ContainerRuntimeVersion, want)
		}
	}
}

// TestNodeModes: the lab has a node of every mode, labelled with it, its
// agent in the mode's profile, and a pod runs on each.
func TestNodeModes(t *testing.T) {
	const ns = "modes"
	useNamespace(t, ns)
	ctx := context.Background()
	pods, _, _ := demo.Pods(ns)
	for _, m := range modes.All() {
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: modes.Label + "=" + m.Name})
		if err != nil || len(nodes.Items) == 0 {
			t.Fatalf("no node of mode %s: %v", m.Name, err)
		}
		for _, n := range nodes.Items {
			if n.Labels[api.LabelNodeConfig] != m.Profile {
				t.Errorf("node %s of mode %s: profile label %q, want %q", n.Name, m.Name, n.Labels[api.LabelNodeConfig], m.Profile)
			}
		}
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "lab-time-slicing", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := kubeobj.Inventory(node)
	if err != nil || inv == nil || len(inv.GPUs) != 1 || inv.GPUs[0].Sharing != api.SharingTimeSlicing || inv.GPUs[0].MaxShares != 4 {
		t.Errorf("lab-time-slicing's inventory %+v, %v: want time-slicing, 4 replicas (NVIDIA's guide)", inv, err)
	}
	// One pod per mode (the demo's first), each on a node of its mode.
	seen := map[string]bool{}
	for _, p := range pods {
		mode := p.Labels[modes.Label]
		if seen[mode] {
			continue
		}
		seen[mode] = true
		p.Spec.Containers[0].Command = []string{"sh", "-c", "nvidia-smi -L"}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := waitPod(t, ns, p.Name, time.Minute, phase(corev1.PodSucceeded, corev1.PodFailed))
		n, err := client.CoreV1().Nodes().Get(ctx, got.Spec.NodeName, metav1.GetOptions{})
		if err != nil || got.Status.Phase != corev1.PodSucceeded || n.Labels[modes.Label] != mode {
			t.Errorf("mode %s: pod %s %s on %s (mode %q)", mode, p.Name, got.Status.Phase, got.Spec.NodeName, n.Labels[modes.Label])
		}
		// A MIG mode's pod is given a MIG device: a GPU of its own to
		// the driver, named as NVML names MIG devices.
		want := `GPU 0: NVIDIA A100-SXM4-40GB \(UUID: GPU-`
		if mode == "dra" {
			want = `GPU 0: NVIDIA A100-SXM4-80GB \(UUID: GPU-` // lab-dra's GPUs
		}
		if strings.HasPrefix(mode, "mig") {
			want = `GPU 0: NVIDIA A100-SXM4-40GB MIG [1-7]g\.[0-9]+gb \(UUID: MIG-`
		}
		if out := kubectl(t, "logs", "-n", ns, p.Name); !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("mode %s: nvidia-smi -L printed %q", mode, out)
		}
	}
}

// TestNodeProfiles: labelling a node with a profile of --node-config
// applies it (the inventory and the device plugin's slots follow, the
// agent logs it); a label naming no profile is refused in the log and the
// last good profile stays.
func TestNodeProfiles(t *testing.T) {
	ctx := context.Background()
	const node = "lab-gpu-04"
	t.Cleanup(func() {
		kubectl(t, "label", "node", node, api.LabelNodeConfig+"=default", "--overwrite")
		testenv.WaitFor(t, node+" back to its profile", time.Minute, func() bool { return slots(t, node) == 8*10 })
	})
	agentLog := dir.Log("node-agent/" + node)
	kubectl(t, "label", "node", node, api.LabelNodeConfig+"=test-dense", "--overwrite")
	testenv.WaitFor(t, node+" in profile test-dense (20 shares per GPU)", time.Minute, func() bool {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		inv, err := kubeobj.Inventory(n)
		return err == nil && inv != nil && len(inv.GPUs) == 8 && inv.GPUs[0].MaxShares == 20 && slots(t, node) == 8*20
	})
	if b, _ := os.ReadFile(agentLog); !regexp.MustCompile(`"Node configuration applied".*profile="test-dense"`).Match(b) {
		t.Errorf("%s does not say the profile was applied", agentLog)
	}
	kubectl(t, "label", "node", node, api.LabelNodeConfig+"=no-such-profile", "--overwrite")
	testenv.WaitFor(t, "the agent refusing profile no-such-profile", time.Minute, func() bool {
		b, _ := os.ReadFile(agentLog)
		return regexp.MustCompile(`"Bad node configuration; keeping the last good one".*no-such-profile`).Match(b)
	})
	if s := slots(t, node); s != 8*20 {
		t.Errorf("%s offers %d slots after a bad label, want the last good profile's %d", node, s, 8*20)
	}
}

func slots(t *testing.T, node string) int64 {
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		return -1
	}
	q := n.Status.Allocatable[corev1.ResourceName(names.GPU)]
	return q.Value()
}

// TestContainerLifecycle: exit codes become container statuses, restart
// policies apply, a container that handles SIGTERM ends at once and one
// that does not at the end of its grace period, a command not found is a
// StartError, and an image alone runs the idle default.
func TestContainerLifecycle(t *testing.T) {
	const ns = "lifecycle"
	useNamespace(t, ns)
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: retry, namespace: lifecycle}
spec:
  restartPolicy: OnFailure
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: main
    image: busybox
    volumeMounts: [{name: data, mountPath: /data}]
    command: [sh, -c, 'if [ -e /data/ran ]; then echo second run; exit 0; fi; touch /data/ran; echo first run; exit 3']
---
apiVersion: v1
kind: Pod
metadata: {name: never, namespace: lifecycle}
spec:
  restartPolicy: Never
  containers: [{name: main, image: busybox, command: [sh, -c, 'exit 7']}]
---
apiVersion: v1
kind: Pod
metadata: {name: missing, namespace: lifecycle}
spec:
  restartPolicy: Never
  containers: [{name: main, image: python, command: [python, train.py]}]
---
apiVersion: v1
kind: Pod
metadata: {name: idle, namespace: lifecycle}
spec:
  terminationGracePeriodSeconds: 30
  containers: [{name: main, image: nvcr.io/nvidia/tritonserver:24.08-py3}]
---
apiVersion: v1
kind: Pod
metadata: {name: stubborn, namespace: lifecycle}
spec:
  terminationGracePeriodSeconds: 2
  containers: [{name: main, image: busybox, command: [sh, -c, 'echo ready; while true; do sleep 0.1; done']}]
`)
	retry := waitPod(t, ns, "retry", time.Minute, phase(corev1.PodSucceeded, corev1.PodFailed))
	cs := retry.Status.ContainerStatuses
	if retry.Status.Phase != corev1.PodSucceeded || len(cs) != 1 || cs[0].RestartCount != 1 || cs[0].LastTerminationState.Terminated == nil || cs[0].LastTerminationState.Terminated.ExitCode != 3 {
		t.Errorf("OnFailure pod: %s %+v; want Succeeded after one restart from exit code 3", retry.Status.Phase, cs)
	}
	if out := kubectl(t, "logs", "-n", ns, "retry", "--previous"); !strings.Contains(out, "first run") {
		t.Errorf("kubectl logs --previous: %q", out)
	}
	never := waitPod(t, ns, "never", time.Minute, phase(corev1.PodSucceeded, corev1.PodFailed))
	if st := never.Status.ContainerStatuses; never.Status.Phase != corev1.PodFailed || len(st) != 1 || st[0].State.Terminated == nil || st[0].State.Terminated.ExitCode != 7 || st[0].RestartCount != 0 {
		t.Errorf("Never pod: %s %+v; want Failed with exit code 7, no restart", never.Status.Phase, st)
	}
	missing := waitPod(t, ns, "missing", time.Minute, phase(corev1.PodFailed))
	if st := missing.Status.ContainerStatuses; len(st) != 1 || st[0].State.Terminated == nil || st[0].State.Terminated.Reason != "StartError" ||
		!strings.Contains(st[0].State.Terminated.Message, `exec: "python": executable file not found in $PATH`) {
		t.Errorf("a command not on the host: %+v; want a StartError naming it", st)
	}
	idle := waitPod(t, ns, "idle", time.Minute, phase(corev1.PodRunning))
	stubborn := waitPod(t, ns, "stubborn", time.Minute, phase(corev1.PodRunning))
	starts := map[int]string{}
	for _, p := range []*corev1.Pod{idle, stubborn} {
		c, err := dir.Node(p.Spec.NodeName).Container(ns, p.Name, "main")
		if err != nil || c.PID == 0 {
			t.Fatalf("%s: %+v, %v", p.Name, c, err)
		}
		starts[c.PID] = procStart(c.PID)
		if p.Name == "idle" && (len(c.Command) != 1 || !strings.HasSuffix(c.Command[0], "/lab-pause")) {
			t.Errorf("an image alone runs %v, want the lab's idle process", c.Command)
		}
	}
	// lab-pause ends at SIGTERM: well within its 30 s grace period.
	start := time.Now()
	kubectl(t, "delete", "pod", "-n", ns, "idle")
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("deleting a pod whose process ends at SIGTERM took %v", d)
	}
	// A shell that ignores SIGTERM as PID 1 is killed when its 2 s end.
	start = time.Now()
	kubectl(t, "delete", "pod", "-n", ns, "stubborn")
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("a container that ignores SIGTERM stopped after %v, before its grace period of 2 s", d)
	}
	for pid, started := range starts {
		if s := procStart(pid); s != "" && s == started {
			t.Errorf("process %d of a deleted pod still runs", pid)
		}
	}
}
