//go:build integration

// Package lab_test drives the emulated cluster (cmd/tessera-lab) as a
// user would: the binary is built, `tessera-lab up` runs as a process, and
// the tests use a kubectl built from the pinned module, the lab's
// kubeconfig, what the nodes' runtimes record and the GPUs' shared state.
// One lab (4 fractional nodes x 8 A100-40GB, lab-gpu-01 to 04, and one of
// 8 H100-80GB, lab-gpu-05, for the GPU guides' 8-GPU pod of the corpus;
// one of 2 A100-40GB whose driver partitions GPU memory per cgroup,
// lab-gpu-06, tainted for the tests of driver-held limits; one node of
// each other mode; lab-dra-02, a DRA node of one A100-80GB tainted for
// the preemption of claims; the profiles of nodeConfig) serves every
// test of the package; each
// test works in its own namespace and leaves no pods behind, so any test
// passes alone (go test -run TestFaults) or after the others.
package lab_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/status"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
)

var (
	labBin, kubectlBin string
	// labTools holds the lab's tools (gpu-fill in bin/, the fake driver
	// in lib/), for processes a test runs on the host
	labTools string
	dir      labdir.Dir
	client   kubernetes.Interface
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if code, ok := need.RootMain("test/integration/lab", "the lab's hollow kubelets and containers run in mount and PID namespaces"); !ok {
		return code
	}
	tmp, err := os.MkdirTemp("", "lab-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if os.Getenv("KEEP_LAB") == "" {
			os.RemoveAll(tmp)
		}
	}()
	built := time.Now()
	var tools string
	if labBin, kubectlBin, tools, err = testenv.BuildLab(tmp); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("tessera-lab, kubectl and the lab's tools built in %v\n", time.Since(built).Round(100*time.Millisecond))
	labTools = tools
	nodeConfig := filepath.Join(tmp, "node-config.yaml")
	if err := os.WriteFile(nodeConfig, []byte(nodeConfigYAML), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir = labdir.Dir(filepath.Join(tmp, "lab"))
	start := time.Now()
	labRun, err := testenv.StartLab(labBin, string(dir), 4*time.Minute, "--node-groups", labNodeGroups,
		"--tools", tools, "--node-config", nodeConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer labRun.Stop()
	fmt.Printf("lab up in %v\n", time.Since(start).Round(100*time.Millisecond))
	cfg, err := clientcmd.BuildConfigFromFlags("", dir.Kubeconfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.QPS, cfg.Burst = 500, 1000
	if client, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for node, key := range map[string]string{partitioningNode: partitioningKey, partitioningMIGNode: partitioningKey, partitioningDRANode: partitioningKey, claimNode: claimKey} {
		if err := taintNode(node, key); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "lab output:\n%s\n", labRun.Output())
		labRun.DumpLogs(os.Stderr, 25)
	}
	return code
}

// labNodeGroups are the lab's fractional nodes (--node-groups), a
// dynamic-MIG node and a DRA node (lab-dra-01) whose drivers partition
// memory, and lab-dra-02 (mode dra, one A100-80GB) for the preemption of
// claims.
const labNodeGroups = "4xA100-40GB:8,1xH100-80GB:8,1xA100-40GB:2+partitioning,1xA100-40GB:1@mig-dynamic+partitioning,1xA100-40GB:2@dra+partitioning,1xA100-80GB:1@dra"

// taintNode taints node with key (NoSchedule), so that only the tests
// whose pods tolerate it place pods there.
func taintNode(node, key string) error {
	ctx := context.Background()
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
	_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	return err
}

// nodeConfigYAML is the lab's --node-config: a profile a test switches a
// node to.
const nodeConfigYAML = `apiVersion: v1
kind: ConfigMap
metadata:
  name: test-profiles
data:
  test-dense: |
    sharing: shared
    sharesPerGPU: 20
`

// kubectl runs the kubectl built from the pinned module against the lab.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(kubectlBin, append([]string{"--kubeconfig", dir.Kubeconfig()}, args...)...)
	cmd.Dir = testenv.RepoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// labCmd runs tessera-lab with the lab's --dir.
func labCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(labBin, append(args, "--dir", string(dir))...).CombinedOutput()
	if err != nil {
		t.Fatalf("tessera-lab %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// checkInvariant runs the placement core's checker over what the API
// server holds, and the physical checker over what the containers were
// given and what NVML reports (status.CheckPhysical).
func checkInvariant(t *testing.T) *status.Report {
	t.Helper()
	r, err := status.Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if r.Invariant != nil {
		t.Fatalf("invariant broken: %v", r.Invariant)
	}
	ph := checkPhysical(t)
	if err := ph.Err(); err != nil {
		t.Fatalf("physical invariant broken over %d containers: %v", ph.Containers, err)
	}
	return r
}

// checkPhysical reads what the lab's containers were given.
func checkPhysical(t *testing.T) *status.PhysicalReport {
	t.Helper()
	st, err := lab.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	ph, err := status.CheckPhysical(context.Background(), client, dir, st.Nodes)
	if err != nil {
		t.Fatal(err)
	}
	return ph
}
