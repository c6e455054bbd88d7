//go:build integration

package lab_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/lab/component"
	"github.com/tessera-gpu/tessera/internal/testenv"
)

// TestEveryPolicyStartsInTheLab runs the lab's scheduler as the lab runs
// it (tessera-lab's scheduler component) against the lab, with one profile
// per placement policy (testenv.EveryPolicyConfig), beside the lab's own
// scheduler, and checks that each profile places a pod.
func TestEveryPolicyStartsInTheLab(t *testing.T) {
	ns := "every-policy"
	useNamespace(t, ns)
	// Under the scheduler's own identity, the only one the admission
	// policy lets write allocation records.
	cfg, err := testenv.EveryPolicyConfig(dir.SchedulerKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "every-policy.yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(labBin, component.Command, component.Scheduler, "--config="+path, "--secure-port=0")
	log := &bytes.Buffer{} // one writer for both: exec calls it from one goroutine at a time
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	testenv.CheckEveryPolicySchedules(t, client, ns, 2*time.Minute)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("the lab's scheduler did not stop within 30s of SIGTERM")
	}
	if t.Failed() {
		t.Logf("scheduler log:\n%s", log.String())
	}
}
