//go:build integration

package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
)

// TestEveryPolicyStarts starts the integration harness's scheduler
// (RunInProcess) and the `tessera scheduler` command, each once with one
// profile per placement policy (testenv.EveryPolicyConfig: the shipped
// profile with placementPolicy set to every name in policies.Names), and
// checks that each profile places a pod; the lab's scheduler is checked in
// test/integration/lab (TestEveryPolicyStartsInTheLab).
func TestEveryPolicyStarts(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.Options{APIServerFlags: []string{"--authorization-mode=RBAC"}})
	ctx := context.Background()
	// The scheduler runs under its own identity (its RBAC, the namespace
	// of its signing key); the test writes the node's inventory as the
	// admin, so the admission policies are left out.
	if err := install.Identities(ctx, cp.Client, true); err != nil {
		t.Fatal(err)
	}
	token, err := install.Token(ctx, cp.Client, install.SchedulerAccount)
	if err != nil {
		t.Fatal(err)
	}
	inv := fixtures.Inventory("gpu-0", 8, "NVIDIA A100-SXM4-80GB", 81920, 10)
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, fixtures.Node("gpu-0", inv, names), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := testenv.EveryPolicyConfig(cp.KubeconfigAs(t, "scheduler.kubeconfig", token))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "every-policy.yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	namespace := func(t *testing.T, ns string) {
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("harness", func(t *testing.T) {
		namespace(t, "harness")
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- scheduler.RunInProcess(sctx, path) }()
		testenv.CheckEveryPolicySchedules(t, cp.Client, "harness", time.Minute)
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("scheduler: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("scheduler did not stop within 30s")
		}
	})

	t.Run("tessera scheduler", func(t *testing.T) {
		bin := buildTessera(t)
		namespace(t, "command")
		cmd := exec.Command(bin, "scheduler", "--config="+path, "--secure-port=0")
		log := &bytes.Buffer{} // one writer for both: exec calls it from one goroutine at a time
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		testenv.CheckEveryPolicySchedules(t, cp.Client, "command", time.Minute)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("tessera scheduler did not stop within 30s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("tessera scheduler log:\n%s", log.String())
		}
	})
}
