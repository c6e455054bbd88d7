//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
	"github.com/tessera-gpu/tessera/internal/realnode"
	"github.com/tessera-gpu/tessera/internal/testenv"
)

// The node and what make e2e builds for it (the Makefile's e2e target).
const (
	nodeName   = "gpu-node-1"
	driverRoot = "/run/nvidia/driver"
	cdiSpec    = "/var/run/cdi/nvidia.yaml"
	gpuCount   = 4
	// The images of hack/e2e/images.sh.
	pauseImage   = "e2e.tessera.local/pause:1.0"
	debianImage  = "e2e.tessera.local/debian:12"
	busyboxImage = "e2e.tessera.local/busybox:1.35"
	// builtImage is the repository make images names its image after
	// (the chart's default).
	builtImage = "ghcr.io/tessera-gpu/tessera"
)

// env is the running cluster and the tools to drive it as a user does.
type env struct {
	root   string // the repository
	cp     *lab.ControlPlane
	node   *realnode.Node
	driver *realnode.Driver
	// repository is the image repository the README's helm install names.
	repository string
	// environ is the users' commands' environment: KUBECONFIG, and PATH
	// with kubectl and helm first.
	environ []string
	// lastState is the cluster's state last sampled while mustFail's
	// command ran.
	lastState string
}

// built are what make e2e builds before the test, relative to the
// repository.
var built = []string{
	"bin/tessera-lab", "bin/lab-tools", "bin/helm", "bin/e2e/kubectl", "bin/e2e/kubelet", "bin/e2e/kube-proxy", "bin/e2e/node",
	"bin/images/tessera.oci.tar", "bin/e2e/images/pause.oci.tar", "bin/e2e/images/debian.oci.tar", "bin/e2e/images/busybox.oci.tar",
}

func setUp(t *testing.T) *env {
	e := &env{root: testenv.RepoRoot(t)}
	var missing []string
	for _, p := range built {
		if _, err := os.Stat(filepath.Join(e.root, p)); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("missing %s: run `make e2e`, which builds them first", strings.Join(missing, ", "))
	}
	bin := func(p string) string { return filepath.Join(e.root, p) }
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	start := time.Now()
	cp, err := lab.StartControlPlane(ctx, lab.ControlPlaneConfig{
		Dir: labdir.Dir(filepath.Join(sandbox.Dir, "control-plane")), Exe: bin("bin/tessera-lab"), Address: sandbox.Address,
		PodSecurity: "baseline", Out: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	e.cp = cp
	if e.driver, err = realnode.InstallDriver(driverRoot, tools.Dir(bin("bin/lab-tools")), realnode.A100s(gpuCount, nodeName)); err != nil {
		t.Fatal(err)
	}
	if err := e.driver.Serve(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.driver.WriteCDISpec(cdiSpec); err != nil {
		t.Fatal(err)
	}
	e.node, err = realnode.Start(ctx, cp, realnode.Config{
		Name: nodeName, Address: sandbox.Address, Dir: filepath.Join(sandbox.Dir, "node"),
		PodCIDR: realnode.PodCIDR, ClusterCIDR: realnode.ClusterCIDR, CgroupRoot: sandbox.CgroupRoot,
		Bin: realnode.Binaries{Runtime: bin("bin/e2e/node"), Kubelet: bin("bin/e2e/kubelet"), KubeProxy: bin("bin/e2e/kube-proxy")},
		Images: []string{
			bin("bin/e2e/images/pause.oci.tar"), bin("bin/e2e/images/debian.oci.tar"), bin("bin/e2e/images/busybox.oci.tar"),
			bin("bin/images/tessera.oci.tar"),
		},
		SandboxImage: pauseImage,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("[%5.1fs] node %s Ready: kubelet, containerd, kube-proxy; %d fake GPUs under %s", time.Since(start).Seconds(), nodeName, gpuCount, driverRoot)
	e.environ = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig,
		"PATH="+bin("bin/e2e")+":"+bin("bin")+":"+os.Getenv("PATH"), "HOME="+sandbox.Dir)
	return e
}

// sh runs a user's command line with bash in the repository and returns
// its output (stdout and stderr).
func (e *env) sh(ctx context.Context, line string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", line)
	cmd.Dir, cmd.Env = e.root, e.environ
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// must runs a command line that must succeed.
func (e *env) must(t *testing.T, line string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	out, err := e.sh(ctx, line)
	if err != nil {
		t.Fatalf("%s: %v\n%s\nthe cluster then:\n%s", line, err, out, e.clusterState())
	}
	return out
}

// clusterState is what a failed step leaves to read: Tessera's workloads
// with their status, every pod, and the latest events (best effort; a
// command that fails says so in its output).
func (e *env) clusterState() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _ := e.sh(ctx, "kubectl -n tessera-system get daemonsets,deployments,jobs -o wide 2>&1; "+
		"kubectl get pods -A -o wide 2>&1; "+
		"kubectl -n tessera-system get daemonsets,deployments -o jsonpath='{range .items[*]}{.kind} {.metadata.name}: generation {.metadata.generation} status {.status}{\"\\n\"}{end}' 2>&1; "+
		"kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -40; "+
		// The last log lines of every pod of Tessera's namespace not ready.
		"for p in $(kubectl -n tessera-system get pods -o jsonpath='{range .items[*]}{.metadata.name}{\" \"}{.status.containerStatuses[*].ready}{\"\\n\"}{end}' | awk '{for (i = 2; i <= NF; i++) if ($i != \"true\") {print $1; next}} NF < 2 {print $1}'); do "+
		"echo \"--- the last log lines of $p (not ready)\"; kubectl -n tessera-system logs $p --all-containers --tail 25 2>&1; done")
	return out
}

// testWriter writes progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
