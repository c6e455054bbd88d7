//go:build e2e

// Package e2e is make e2e: Tessera installed with its chart, as the
// README says, on a real node (a real kubelet, containerd and runc, the
// CNI plugins, kube-proxy) beside the lab's control plane, and the GPU
// guides' pods run in real containers over a fake NVIDIA driver. It runs
// in a sandbox (internal/realnode) and needs root and what make e2e
// builds first.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/realnode"
)

var sandbox *realnode.Sandbox

func TestMain(m *testing.M) {
	if sandbox = realnode.Current(); sandbox == nil {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("tessera-e2e-%d", os.Getpid()))
		code, err := realnode.Run(dir, os.Getenv("TESSERA_E2E_KEEP") != "")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			if code == 0 {
				code = 1
			}
		}
		os.Exit(code)
	}
	if err := sandbox.Enter(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: entering the sandbox:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// The GPU guides' pods, in containers built here (hack/e2e/images.sh).
const (
	demoNamespace = "gpu-demo"
	// NVIDIA's guide: a whole GPU. busybox-static: no C library, so no
	// dynamic loader to preload anything into (nor a limiter to load: a
	// whole GPU has none).
	wholeGPUPod = `apiVersion: v1
kind: Pod
metadata: {name: whole-gpu, namespace: gpu-demo}
spec:
  containers:
  - name: main
    image: ` + busyboxImage + `
    command: ["sleep", "1000000"]
    resources: {limits: {nvidia.com/gpu: 1}}
`
	// Half a GPU, as fractional-GPU guides write it; an unprivileged user
	// whose program holds 4 GiB for the pod's life.
	halfGPUPod = `apiVersion: v1
kind: Pod
metadata: {name: half-gpu, namespace: gpu-demo}
spec:
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  containers:
  - name: main
    image: ` + debianImage + `
    command: ["gpu-fill", "--max", "4096", "--hold", "forever"]
    resources: {limits: {nvidia.com/gpu: 0.5}}
`
	// HAMi's guide: two GPUs, 10240 MiB and 30 % of each.
	hamiPod = `apiVersion: v1
kind: Pod
metadata: {name: hami-style, namespace: gpu-demo}
spec:
  containers:
  - name: main
    image: ` + debianImage + `
    command: ["sleep", "infinity"]
    resources:
      limits: {nvidia.com/gpu: 2, nvidia.com/gpumem: 10240, nvidia.com/gpucores: 30}
`
)

func TestRealNode(t *testing.T) {
	e := setUp(t)
	if os.Getenv("TESSERA_E2E_HOLD") != "" {
		t.Logf("holding for an hour: nsenter -t %d -m -n, then KUBECONFIG=%s", os.Getpid(), e.cp.Kubeconfig)
		time.Sleep(time.Hour)
	}
	e.must(t, "kubectl label node "+nodeName+" nvidia.com/gpu.present=true") // docs/install.md
	prepare, install, repository := docInstall(t, e.root)
	e.repository = repository
	e.step(t, "install: the README's commands")
	// "Push it to your registry": the image make images built, under the
	// repository the README's helm install names.
	version := chartAppVersion(t, e.root)
	if out, err := e.node.Ctr(context.Background(), "images", "tag", builtImage+":"+version, repository+":"+version); err != nil {
		t.Fatalf("ctr images tag: %v\n%s", err, out)
	}
	for _, c := range prepare {
		t.Logf("$ %s", c)
		t.Log(e.must(t, c))
	}
	t.Logf("$ %s", install)
	t.Log(e.must(t, install))
	e.checkInstalled(t)

	e.step(t, "the guides' pods")
	e.must(t, "kubectl create namespace "+demoNamespace)
	for _, m := range []string{wholeGPUPod, halfGPUPod, hamiPod} {
		e.apply(t, m)
	}
	e.must(t, "kubectl -n "+demoNamespace+" wait --for=condition=Ready pod --all --timeout=120s")
	before := e.checkPods(t)

	e.step(t, "the node agent's pod deleted")
	e.must(t, "kubectl -n tessera-system delete pod -l app=tessera-node-agent --wait")
	e.must(t, "kubectl -n tessera-system rollout status daemonset/tessera-node-agent --timeout=120s")
	e.checkUndisturbed(t, before)

	e.step(t, "helm upgrade with a changed value")
	gen := e.must(t, "kubectl -n tessera-system get daemonset tessera-node-agent -o jsonpath='{.metadata.generation}'")
	e.must(t, "helm upgrade tessera charts/tessera -n tessera-system --reuse-values --set nodeAgent.recoveryPeriod=6m --wait --atomic --debug")
	if after := e.must(t, "kubectl -n tessera-system get daemonset tessera-node-agent -o jsonpath='{.metadata.generation}'"); after == gen {
		t.Fatalf("helm upgrade did not change the node agent's DaemonSet (generation %s)", gen)
	}
	e.must(t, "kubectl -n tessera-system rollout status daemonset/tessera-node-agent --timeout=120s")
	if args := e.must(t, "kubectl -n tessera-system get pod -l app=tessera-node-agent -o jsonpath='{.items[*].spec.containers[0].args}'"); !strings.Contains(args, "--recovery-period=6m") {
		t.Fatalf("the node agent runs without the upgraded value: %s", args)
	}
	e.checkUndisturbed(t, before)

	e.step(t, "a pod's emptyDir over /etc and /usr/local")
	e.checkShadowingVolumes(t)

	e.step(t, "uninstall and the documented clean-up")
	e.must(t, "kubectl delete namespace "+demoNamespace+" --wait --timeout=120s")
	e.uninstall(t)

	e.step(t, "bad input: each refused, naming it, nothing installed")
	for _, c := range prepare {
		e.must(t, c)
	}
	e.badInput(t, install)
}

// chartAppVersion is the chart's appVersion: the image's tag.
func chartAppVersion(t *testing.T, root string) string {
	b, err := os.ReadFile(filepath.Join(root, "charts/tessera/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindSubmatch(b)
	if m == nil {
		t.Fatal("charts/tessera/Chart.yaml has no appVersion")
	}
	return string(m[1])
}

// step logs the start of a part of the test.
func (e *env) step(t *testing.T, what string) {
	t.Logf("=== %s", what)
}

// apply applies a manifest with kubectl.
func (e *env) apply(t *testing.T, manifest string) {
	t.Helper()
	e.must(t, "kubectl apply -f - <<'EOF'\n"+manifest+"EOF")
}

// exec runs a shell command line in a pod's container (kubectl exec).
func (e *env) exec(t *testing.T, pod, line string) string {
	t.Helper()
	return e.must(t, fmt.Sprintf("kubectl -n %s exec %s -- sh -c %s", demoNamespace, pod, shellQuote(line)))
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// number is the first integer in s after prefix (a regexp).
func number(t *testing.T, s, prefix string) int {
	t.Helper()
	m := regexp.MustCompile(prefix + `\s*([0-9]+)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %q in:\n%s", prefix, s)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
