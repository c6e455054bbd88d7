//go:build integration

// Package volcano_test runs Tessera's node layer under Volcano's real
// scheduler (docs/volcano.md): Volcano's scheduler and controller manager
// are built from the release pinned in hack/volcano, `tessera-lab up
// --volcano` runs them beside a node in mode volcano (8 × A100-40GB), one
// in Volcano's mig mode (an A100-40GB) and a DRA node, and the tests drive Volcano's pods, Jobs and Queues with
// client-go and check what the node agent gave each container. Each test
// works in its own namespace and leaves nothing behind.
package volcano_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/testenv"
)

var (
	kubectlBin string
	dir        labdir.Dir
	client     kubernetes.Interface
	dyn        dynamic.Interface
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "volcano-e2e-")
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
	labBin, kubectl, tools, err := testenv.BuildLab(tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kubectlBin = kubectl
	fmt.Printf("tessera-lab, kubectl and the lab's tools built in %v\n", time.Since(built).Round(100*time.Millisecond))
	built = time.Now()
	volcanoDir := filepath.Join(tmp, "volcano")
	if err := testenv.BuildVolcano(volcanoDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("Volcano %s built in %v\n", lab.VolcanoBinaries(volcanoDir).Version(), time.Since(built).Round(100*time.Millisecond))

	dir = labdir.Dir(filepath.Join(tmp, "lab"))
	start := time.Now()
	// A DRA node beside the volcano node (DRA claims under Volcano), and
	// a node in Volcano's mig mode.
	labRun, err := testenv.StartLab(labBin, string(dir), 4*time.Minute, "--node-groups", "1xA100-80GB:1@dra,1xA100-40GB:1@vc-mig", "--sharing-nodes=false",
		"--tools", tools, "--volcano", "--volcano-dir", volcanoDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer labRun.Stop()
	fmt.Printf("lab with Volcano up in %v\n", time.Since(start).Round(100*time.Millisecond))
	cfg, err := clientcmd.BuildConfigFromFlags("", dir.Kubeconfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.QPS, cfg.Burst = 200, 400
	if client, err = kubernetes.NewForConfig(cfg); err == nil {
		dyn, err = dynamic.NewForConfig(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "lab output:\n%s\n", labRun.Output())
		labRun.DumpLogs(os.Stderr, 40)
	}
	return code
}

// kubectl runs the kubectl built from the pinned module against the lab,
// with stdin.
func kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, err := kubectlErr(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func kubectlErr(stdin string, args ...string) (string, error) {
	cmd := exec.Command(kubectlBin, append([]string{"--kubeconfig", dir.Kubeconfig()}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// apply creates the manifest's objects.
func apply(t *testing.T, manifest string) {
	t.Helper()
	kubectl(t, manifest, "apply", "-f", "-")
}

// ctx is the tests' context.
var ctx = context.Background()
