package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/testenv"
)

// TestRestartsAndStops runs stand-in components (sh), kills one, and
// expects it back with a new PID; killed again, its restart is pending
// when StopAll begins, and StopAll returns with nothing left to restart
// it: it stays stopped.
func TestRestartsAndStops(t *testing.T) {
	logs := t.TempDir()
	logFile := func(name string) string { return filepath.Join(logs, name+".log") }
	s := New("/bin/sh", logFile, ktesting.NewLogger(t, ktesting.NewConfig()), nil)
	if err := s.Start("api", []string{"-c", "sleep 60"}, nil, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Start("worker", []string{"-c", "trap 'exit 0' TERM; sleep 60 & wait"}, []string{"X=1"}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Start("worker", nil, nil, false); err == nil {
		t.Error("a second component named worker was accepted")
	}
	first := s.Components()["worker"].PID
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "worker restarted", 10*time.Second, func() bool {
		c := s.Components()["worker"]
		return c.Restarts == 1 && c.PID != first && s.Alive("worker")
	})

	// Killed again: its watcher waits out the restart delay (1 s).
	second := s.Components()["worker"].PID
	if err := syscall.Kill(second, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "worker exited", 10*time.Second, func() bool { return !s.Alive("worker") })
	stopped := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		s.StopAll(5 * time.Second)
	}()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatalf("StopAll has not returned after 30s: %+v", s.Components())
	}
	if s.Alive("worker") || s.Alive("api") {
		t.Error("components alive after StopAll")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("StopAll took %v for components that exit on SIGTERM", d)
	}
	// Only watchers restart a component, and StopAll left none: the
	// worker cannot come back.
	s.mu.Lock()
	watchers := s.watchers
	s.mu.Unlock()
	if c := s.Components()["worker"]; watchers != 0 || c.PID != second {
		t.Errorf("after StopAll: %d watchers, worker %+v; want none, and the worker's last PID %d", watchers, c, second)
	}
	if err := s.Start("late", []string{"-c", "sleep 60"}, nil, false); err == nil || s.Alive("late") {
		t.Errorf("a component started after StopAll: %v", err)
	}
	b, err := os.ReadFile(logFile("worker"))
	if err != nil || strings.Count(string(b), "starting worker") != 2 || strings.Count(string(b), "signal: killed") != 2 {
		t.Errorf("worker.log: %v\n%s", err, b)
	}
}
