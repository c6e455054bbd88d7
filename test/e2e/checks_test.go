//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/nodeagent/nodelabels"
	"github.com/tessera-gpu/tessera/internal/realnode"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// checkInstalled: the chart's Deployments and DaemonSets run in real
// containers and the agent published the node's GPUs.
func (e *env) checkInstalled(t *testing.T) {
	for _, d := range []string{"tessera-scheduler", "tessera-webhook"} {
		if got := e.must(t, "kubectl -n tessera-system get deployment "+d+" -o jsonpath='{.status.readyReplicas}/{.spec.replicas}'"); got != "2/2" {
			t.Fatalf("deployment %s: %s replicas ready", d, got)
		}
	}
	for _, d := range []string{"tessera-node-agent", "tessera-kubelet-shim"} {
		if got := e.must(t, "kubectl -n tessera-system get daemonset "+d+" -o jsonpath='{.status.numberReady}/{.status.desiredNumberScheduled}'"); got != "1/1" {
			t.Fatalf("daemonset %s: %s pods ready", d, got)
		}
	}
	// Real containers: containerd runs every one of the release's.
	ids := strings.Fields(e.must(t, "kubectl -n tessera-system get pods -l app.kubernetes.io/component!=wait-ready -o jsonpath='{.items[*].status.containerStatuses[*].containerID}'"))
	ctrs, err := e.node.Ctr(context.Background(), "containers", "list", "-q")
	if err != nil {
		t.Fatalf("ctr containers list: %v\n%s", err, ctrs)
	}
	if len(ids) < 6 {
		t.Fatalf("want the containers of 2 schedulers, 2 webhooks, the agent and the shim, got %q", ids)
	}
	for _, id := range ids {
		if !strings.HasPrefix(id, "containerd://") || !strings.Contains(string(ctrs), strings.TrimPrefix(id, "containerd://")) {
			t.Fatalf("container %s is not one of containerd's:\n%s", id, ctrs)
		}
	}
	// The agent found the driver's GPUs through NVML under the driver
	// root and labelled the node as GFD would.
	var node map[string]string
	testenv.WaitFor(t, "the node's GPU labels", time.Minute, func() bool {
		n, err := e.cp.Client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		node = n.Labels
		_, ok := n.Annotations[api.AnnotationInventory]
		return ok && node[nodelabels.Count] != ""
	})
	want := map[string]string{
		nodelabels.Product: "NVIDIA-A100-SXM4-40GB", nodelabels.Count: fmt.Sprint(gpuCount), nodelabels.Memory: "40960",
		// The fake's NVML reports its version (fakegpu's
		// FAKE_DRIVER_VERSION); the installed files carry realnode's.
		nodelabels.DriverMajor: strings.Split(realnode.DriverVersion, ".")[0], nodelabels.DriverMinor: strings.Split(realnode.DriverVersion, ".")[1],
	}
	for k, v := range want {
		if node[k] != v {
			t.Errorf("node label %s=%q, want %q", k, node[k], v)
		}
	}
	inv := e.must(t, "kubectl get node "+nodeName+" -o jsonpath='{.metadata.annotations.tessera\\.io/gpu-inventory}'")
	for _, g := range e.driver.GPUs {
		if !strings.Contains(inv, g.UUID) {
			t.Errorf("the inventory lacks GPU %s: %s", g.UUID, inv)
		}
	}
	alloc := e.must(t, "kubectl get node "+nodeName+" -o jsonpath='{.status.allocatable.nvidia\\.com/gpu}'")
	t.Logf("node %s: nvidia.com/gpu allocatable %s, labels %v", nodeName, alloc, want)
}

// podState is what must not change about a running GPU pod.
type podState struct {
	containerID string
	restarts    string
	devices     []string // its /dev/nvidiaN
}

// gpuDevices are the GPU device nodes a pod's container sees.
func (e *env) gpuDevices(t *testing.T, pod string) []string {
	out := e.exec(t, pod, "ls /dev")
	var devs []string
	for _, f := range strings.Fields(out) {
		if regexp.MustCompile(`^nvidia[0-9]+$`).MatchString(f) {
			devs = append(devs, f)
		}
	}
	sort.Strings(devs)
	return devs
}

// checkDevices: the container's device nodes are the GPUs of its
// allocation record.
func (e *env) checkDevices(t *testing.T, pod string, n int) []string {
	devs := e.gpuDevices(t, pod)
	if len(devs) != n {
		t.Fatalf("%s sees GPU device nodes %v, want %d", pod, devs, n)
	}
	record := e.must(t, "kubectl -n "+demoNamespace+" get pod "+pod+" -o jsonpath='{.metadata.annotations.tessera\\.io/allocation}'")
	for _, d := range devs {
		var i int
		fmt.Sscanf(d, "nvidia%d", &i)
		if i >= len(e.driver.GPUs) || !strings.Contains(record, e.driver.GPUs[i].UUID) {
			t.Fatalf("%s has /dev/%s, a GPU its allocation record does not name: %s", pod, d, record)
		}
	}
	return devs
}

// checkPods checks the guides' pods and returns their state.
func (e *env) checkPods(t *testing.T) map[string]podState {
	states := map[string]podState{}
	for pod, n := range map[string]int{"whole-gpu": 1, "half-gpu": 1, "hami-style": 2} {
		s := podState{
			containerID: e.must(t, "kubectl -n "+demoNamespace+" get pod "+pod+" -o jsonpath='{.status.containerStatuses[0].containerID}'"),
			restarts:    e.must(t, "kubectl -n "+demoNamespace+" get pod "+pod+" -o jsonpath='{.status.containerStatuses[0].restartCount}'"),
			devices:     e.checkDevices(t, pod, n),
		}
		states[pod] = s
	}
	// A whole GPU: the CDI spec's devices and environment, no limiter.
	if out := e.exec(t, "whole-gpu", "echo $NVIDIA_VISIBLE_DEVICES; test -e /etc/ld.so.preload && echo preload || echo none"); out != "void\nnone\n" {
		t.Fatalf("whole-gpu: want the CDI spec's NVIDIA_VISIBLE_DEVICES=void and no preload list, got %q", out)
	}
	e.checkLimiter(t, "half-gpu", "1000")
	e.checkLimiter(t, "hami-style", "0")
	// nvidia-smi shows the pod's share, not the GPU.
	if out := e.exec(t, "half-gpu", "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits"); strings.TrimSpace(out) != "20480" {
		t.Fatalf("half-gpu: nvidia-smi's memory.total %q, want 20480 (half of 40960 MiB)", out)
	}
	if out := e.exec(t, "hami-style", "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits"); strings.Fields(out)[0] != "10240" || len(strings.Fields(out)) != 2 {
		t.Fatalf("hami-style: nvidia-smi's memory.total %q, want 10240 on each of 2 GPUs", out)
	}
	e.checkRefusals(t)
	return states
}

// checkLimiter: the agent's read-only /etc/ld.so.preload names the
// limiter, which every program of the container loads.
func (e *env) checkLimiter(t *testing.T, pod, uid string) {
	out := e.exec(t, pod, "id -u; cat /etc/ld.so.preload; grep -c libtessera-limiter /proc/self/maps; grep ' /etc/ld.so.preload ' /proc/self/mountinfo")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 4 || lines[0] != uid || lines[1] != api.ContainerLimiterDir+"/libtessera-limiter.so" || lines[2] == "0" {
		t.Fatalf("%s: want uid %s, the preload list naming the limiter and the limiter loaded in grep, got:\n%s", pod, uid, out)
	}
	if f := strings.Fields(lines[3]); len(f) < 6 || !regexp.MustCompile(`(^|,)ro(,|$)`).MatchString(f[5]) {
		t.Fatalf("%s: /etc/ld.so.preload is not mounted read-only: %s", pod, lines[3])
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Root is refused by the read-only mount; another user first by the
	// file's owner.
	want := "Read-only file system"
	if uid != "0" {
		want = "Permission denied"
	}
	if out, err := e.sh(ctx, fmt.Sprintf("kubectl -n %s exec %s -- sh -c 'echo x >> /etc/ld.so.preload'", demoNamespace, pod)); err == nil || !strings.Contains(out, want) {
		t.Fatalf("%s: writing /etc/ld.so.preload: want %q, got %v: %s", pod, want, err, out)
	}
}

// checkRefusals: a program in a fractional pod is refused at its limit
// (the half pod's main process holds 4096 MiB of its 20480).
func (e *env) checkRefusals(t *testing.T) {
	out := e.exec(t, "half-gpu", "gpu-fill --step 1024")
	if got := number(t, out, "refused at"); got > 20480-4096 || got < 20480-4096-1024 {
		t.Fatalf("half-gpu: gpu-fill refused at %d MiB, want at its limit less the 4096 MiB the pod's other process holds:\n%s", got, out)
	}
	for dev := 0; dev < 2; dev++ {
		out := e.exec(t, "hami-style", fmt.Sprintf("gpu-fill --device %d --step 1024", dev))
		if got := number(t, out, "refused at"); got > 10240 || got < 9216 {
			t.Fatalf("hami-style GPU %d: gpu-fill refused at %d MiB, want at 10240:\n%s", dev, got, out)
		}
	}
	// The half pod's holder is what the driver counts on its GPU.
	var i int
	fmt.Sscanf(e.gpuDevices(t, "half-gpu")[0], "nvidia%d", &i)
	used, err := e.driver.UsedBytes(i)
	if err != nil || used < 4096<<20 {
		t.Fatalf("the half pod's GPU %d: the driver counts %d bytes used (%v), want the holder's 4096 MiB", i, used, err)
	}
}

// checkUndisturbed: the GPU pods run on as before, with their GPUs and
// limits.
func (e *env) checkUndisturbed(t *testing.T, before map[string]podState) {
	for pod, s := range before {
		id := e.must(t, "kubectl -n "+demoNamespace+" get pod "+pod+" -o jsonpath='{.status.containerStatuses[0].containerID}'")
		r := e.must(t, "kubectl -n "+demoNamespace+" get pod "+pod+" -o jsonpath='{.status.containerStatuses[0].restartCount}'")
		if id != s.containerID || r != s.restarts {
			t.Fatalf("%s: container %s (restarts %s), was %s (restarts %s)", pod, id, r, s.containerID, s.restarts)
		}
		if devs := e.gpuDevices(t, pod); strings.Join(devs, " ") != strings.Join(s.devices, " ") {
			t.Fatalf("%s: GPU device nodes %v, were %v", pod, devs, s.devices)
		}
	}
	e.checkLimiter(t, "half-gpu", "1000")
	e.checkRefusals(t)
}

// checkShadowingVolumes: a GPU pod's own emptyDir volumes at /etc and
// /usr/local, parents of where the agent mounts the preload list, the
// limits file and the limiter (api.ContainerReservedPaths). The webhook
// refuses them, naming the path; in audit mode (webhook.audit) it admits
// them with a warning, and then what holds the pod to its share is the
// runtime's mount order: containerd mounts by depth, so the agent's deeper
// mounts land on top of the volumes, whatever order the kubelet lists
// them in. Both are checked here, on containerd.
func (e *env) checkShadowingVolumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	manifest := `apiVersion: v1
kind: Pod
metadata: {name: shadowing, namespace: gpu-demo}
spec:
  containers:
  - name: main
    image: ` + debianImage + `
    command: ["sleep", "infinity"]
    volumeMounts: [{name: etc, mountPath: /etc}, {name: local, mountPath: /usr/local}]
    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4096}}
  volumes: [{name: etc, emptyDir: {}}, {name: local, emptyDir: {}}]
`
	apply := "kubectl apply -f - <<'EOF'\n" + manifest + "EOF"
	out, err := e.sh(ctx, apply)
	if err == nil || !strings.Contains(out, "/etc") || !strings.Contains(out, "denied") {
		t.Fatalf("an emptyDir at /etc in a GPU pod: want the webhook to refuse it naming the path, got %v:\n%s", err, out)
	}
	t.Logf("refused: %s", lastLine(out))

	e.must(t, "helm upgrade tessera charts/tessera -n tessera-system --reuse-values --set webhook.audit=true --wait --atomic")
	out = e.must(t, apply)
	if !strings.Contains(out, "Warning") || !strings.Contains(out, "/etc") {
		t.Fatalf("audit mode: want the pod admitted with a warning naming /etc, got:\n%s", out)
	}
	e.must(t, "kubectl -n "+demoNamespace+" wait --for=condition=Ready pod/shadowing --timeout=120s")
	out = e.exec(t, "shadowing", "ls /etc /usr/local; cat /etc/ld.so.preload; ls /etc/tessera; grep -c libtessera-limiter /proc/self/maps; gpu-fill --step 1024")
	t.Logf("shadowing pod (audit mode):\n%s", out)
	if !strings.Contains(out, api.ContainerLimiterDir+"/libtessera-limiter.so") || !strings.Contains(out, "limiter.conf") {
		t.Fatalf("under containerd, emptyDirs at /etc and /usr/local hide the agent's mounts:\n%s", out)
	}
	if got := number(t, out, "refused at"); got > 4096 || got < 3072 {
		t.Fatalf("under emptyDirs at /etc and /usr/local, gpu-fill was refused at %d MiB of a 4096 MiB grant", got)
	}
	t.Logf("containerd mounts by depth: under emptyDirs at /etc and /usr/local the preload list, the limits file and the limiter stay visible, and the 4096 MiB limit held")
	e.must(t, "kubectl -n "+demoNamespace+" delete pod shadowing --wait")
}
