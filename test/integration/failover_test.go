//go:build integration

package integration

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// leaderLease is the lease the schedulers of leaderConfig compete for,
// named after the scheduler as in deploy/scheduler/config.yaml.
const leaderLease = api.SchedulerName

// buildTessera builds the tessera binary for tests that run it as a
// process.
func buildTessera(t *testing.T) string {
	t.Helper()
	start := time.Now()
	bin, err := testenv.Build(t.TempDir(), "tessera", "./cmd/tessera")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built tessera in %v", time.Since(start).Round(time.Millisecond))
	return bin
}

// leaderConfig is the shipped configuration with leader election on
// short timings, so a standby takes over within seconds.
func (e *env) leaderConfig() string {
	return e.schedulerConfig("leader.yaml", func(cfg map[string]any) {
		cfg["leaderElection"] = map[string]any{
			"leaderElect":       true,
			"resourceNamespace": "tessera-system",
			"resourceName":      leaderLease,
			"leaseDuration":     "4s",
			"renewDeadline":     "3s",
			"retryPeriod":       "500ms",
		}
	})
}

type process struct {
	cmd *exec.Cmd
	log *bytes.Buffer
}

func (e *env) startProcess(bin, config, name string) *process {
	p := &process{log: &bytes.Buffer{}}
	p.cmd = exec.Command(bin, "scheduler", "--config="+config, "--secure-port=0", "--v=1")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		e.t.Fatalf("starting %s: %v", name, err)
	}
	e.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		if e.t.Failed() {
			lines := strings.Split(p.log.String(), "\n")
			e.t.Logf("%s log (last 30 lines):\n%s", name, strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
	})
	return p
}

// TestLeaderFailover runs two `tessera scheduler` processes with leader
// election, kills the leader with SIGKILL part-way through 300 pods and
// checks that the standby takes over, rebuilds its state from the records
// and leaves the cluster consistent.
func TestLeaderFailover(t *testing.T) {
	bin := buildTessera(t)
	e := newEnv(t)
	ctx := context.Background()
	// tessera-system exists: newEnv installed the scheduler's identity
	// there.
	e.addNodes("node", 20, 8, "NVIDIA A100-SXM4-80GB", 81920)
	config := e.leaderConfig()

	const total = 300
	shapes := []map[string]string{
		{names.Memory: "8192", names.Cores: "10"},
		{names.GPU: "0.5"},
		{names.GPU: "1"},
		{names.GPU: "2", names.Memory: "20000", names.Cores: "40"},
	}
	leader := e.startProcess(bin, config, "scheduler-a")
	testenv.WaitFor(t, "the first scheduler to take the lease", 30*time.Second, func() bool {
		_, err := e.cp.Client.CoordinationV1().Leases("tessera-system").Get(ctx, leaderLease, metav1.GetOptions{})
		return err == nil
	})
	standby := e.startProcess(bin, config, "scheduler-b")
	// Pods arrive as a stream, so the kill lands in the middle of it.
	created := make(chan error, 1)
	go func() {
		for i := range total {
			if _, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name(fmt.Sprintf("f%03d", i)).Container("main", shapes[i%len(shapes)]).Obj()); err != nil {
				created <- err
				return
			}
			if i%10 == 9 {
				time.Sleep(100 * time.Millisecond)
			}
		}
		created <- nil
	}()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := e.cp.Client.CoreV1().Pods(gpuNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				n++
			}
		}
		return n >= 100, nil
	})
	if err != nil {
		t.Fatalf("the first scheduler did not bind 100 pods within 2 minutes: %v", err)
	}
	first, err := e.cp.Client.CoordinationV1().Leases("tessera-system").Get(ctx, leaderLease, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the leader holds no lease: %v", err)
	}
	// SIGKILL: no graceful shutdown, no lease release.
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = leader.cmd.Wait()
	killedAt := e.checkInvariant()
	if err := <-created; err != nil {
		t.Fatalf("creating pods: %v", err)
	}
	t.Logf("leader killed with %d pods bound; invariant holds", killedAt)

	var bound, unschedulable int
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, recs, pods := e.published()
		bound, unschedulable = len(recs), 0
		for _, p := range pods {
			if p.Spec.NodeName == "" {
				if strings.Contains(unschedulableMessage(&p), "nodes fit") {
					unschedulable++
				} else {
					return false, nil
				}
			}
		}
		return bound+unschedulable == total, nil
	})
	if err != nil {
		t.Fatalf("after failover: %d bound, %d unschedulable with a reason, of %d: %v", bound, unschedulable, total, err)
	}
	if bound <= killedAt {
		t.Errorf("the standby bound nothing (%d bound at the kill, %d now)", killedAt, bound)
	}
	e.checkInvariant()
	lease, err := e.cp.Client.CoordinationV1().Leases("tessera-system").Get(ctx, leaderLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *lease.Spec.HolderIdentity == *first.Spec.HolderIdentity {
		t.Errorf("lease still held by the killed leader %s", *first.Spec.HolderIdentity)
	}
	t.Logf("lease moved from %s to %s; %d bound, %d unschedulable with a reason", *first.Spec.HolderIdentity, *lease.Spec.HolderIdentity, bound, unschedulable)
	_ = standby
}
