package mps

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/mps/mpsfake"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
	"github.com/tessera-gpu/tessera/internal/testenv/poll"
)

// The test binary is also the fake control daemon (TESSERA_FAKE_MPS=1).
func TestMain(m *testing.M) {
	if os.Getenv("TESSERA_FAKE_MPS") == "1" {
		os.Exit(mpsfake.Main([]string{os.Args[0]}, os.Args[1:], os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

func fakeManager(t *testing.T) *Manager {
	t.Setenv("TESSERA_FAKE_MPS", "1")
	// Under -race every run of the fake (one per command) would otherwise
	// sleep 1 s at exit (the race runtime's atexit_sleep_ms).
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	return &Manager{Command: []string{os.Args[0]}, Root: shortDir(t), Logger: ktesting.NewLogger(t, ktesting.NewConfig())}
}

// shortDir is a temporary directory with a path short enough for a unix
// socket (108 bytes).
func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func commands(t *testing.T, m *Manager, uuid string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.LogDir(uuid), "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if _, c, ok := strings.Cut(l, "Cmd:"); ok {
			out = append(out, c)
		}
	}
	return out
}

// TestManagerWithFake: one daemon per GPU with its own pipe directory,
// the limits set and checked, re-set only when they change, a killed
// daemon started again with its limits, quit for a GPU no longer listed.
func TestManagerWithFake(t *testing.T) {
	m := fakeManager(t)
	ctx := context.Background()
	defer m.Stop(ctx)
	gpus := []GPU{{UUID: "GPU-a", Limits: Limits{ThreadPercent: 30, PinnedMiB: 4096}}, {UUID: "GPU-b", Limits: Limits{ThreadPercent: 10, PinnedMiB: 1000}}}
	if err := m.Ensure(ctx, gpus); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(commands(t, m, "GPU-a"), "|")
	for _, want := range []string{"set_default_active_thread_percentage 30", "set_default_device_pinned_mem_limit 0 4096M", "get_default_device_pinned_mem_limit 0"} {
		if !strings.Contains(got, want) {
			t.Errorf("GPU-a commands %s lack %q", got, want)
		}
	}
	if !strings.Contains(strings.Join(commands(t, m, "GPU-b"), "|"), "set_default_active_thread_percentage 10") {
		t.Error("GPU-b has not its own limits")
	}
	n := len(commands(t, m, "GPU-a"))
	if err := m.Ensure(ctx, gpus); err != nil {
		t.Fatal(err)
	}
	if again := commands(t, m, "GPU-a"); len(again) != n+1 || again[n] != "get_server_list" {
		t.Errorf("unchanged limits sent again: %v", again[n:])
	}
	// The daemon dies: started again, limits set again.
	pid, err := os.ReadFile(filepath.Join(m.PipeDir("GPU-a"), "control.pid"))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(string(pid))
	if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the killed daemon gone", 10*time.Second, func() bool { return syscall.Kill(p, 0) != nil })
	if err := m.Ensure(ctx, gpus); err != nil {
		t.Fatal(err)
	}
	if m.Starts("GPU-a") != 2 || m.Starts("GPU-b") != 1 {
		t.Errorf("starts a=%d b=%d", m.Starts("GPU-a"), m.Starts("GPU-b"))
	}
	if c := commands(t, m, "GPU-a"); c[len(c)-1] == "get_server_list" && !strings.Contains(strings.Join(c[n+1:], "|"), "set_default_active_thread_percentage 30") {
		t.Errorf("limits not set on the restarted daemon: %v", c[n+1:])
	}
	// GPU-b leaves: its daemon quits.
	if err := m.Ensure(ctx, gpus[:1]); err != nil {
		t.Fatal(err)
	}
	if c := commands(t, m, "GPU-b"); c[len(c)-1] != "quit" {
		t.Errorf("GPU-b not quit: %v", c)
	}
	if _, err := m.control(ctx, "GPU-b", "get_server_list"); err == nil {
		t.Error("GPU-b's daemon still answers")
	}
}

// TestManagerWithNVIDIADaemon runs the same commands against NVIDIA's own
// nvidia-cuda-mps-control (driver 535, Debian non-free; fetched by
// hack/fetch-mps-control.sh, which `make test-go` runs). Its control
// daemon starts and answers without a GPU.
func TestManagerWithNVIDIADaemon(t *testing.T) {
	bin := os.Getenv("TESSERA_MPS_CONTROL")
	if bin == "" {
		bin = filepath.Join(repoRoot(t), "bin", "nonfree", "nvidia-cuda-mps-control")
	}
	need.File(t, bin, "NVIDIA's MPS control daemon (Debian non-free): run hack/fetch-mps-control.sh (`make test-go` does), or set TESSERA_MPS_CONTROL")
	m := &Manager{Command: []string{bin}, Root: shortDir(t), Logger: ktesting.NewLogger(t, ktesting.NewConfig())}
	ctx := context.Background()
	stopped := false
	defer func() {
		if !stopped {
			_ = m.Stop(ctx)
		}
	}()
	if err := m.Ensure(ctx, []GPU{{UUID: "GPU-00000000-0000-0000-0000-000000000000", Limits: Limits{ThreadPercent: 25, PinnedMiB: 10240}}}); err != nil {
		t.Fatal(err)
	}
	u := "GPU-00000000-0000-0000-0000-000000000000"
	if out, err := m.control(ctx, u, "get_default_active_thread_percentage"); err != nil || out != "25.0" {
		t.Errorf("thread percentage %q %v", out, err)
	}
	if out, err := m.control(ctx, u, "get_default_device_pinned_mem_limit 0"); err != nil || out != "10G" {
		t.Errorf("pinned limit %q %v", out, err)
	}
	// The daemon refuses a bad percentage by answering the old value, with
	// exit status 0: setLimits must notice.
	if err := m.setLimits(ctx, u, Limits{ThreadPercent: 130}); err == nil || !strings.Contains(err.Error(), `the daemon answered "25.0"`) {
		t.Errorf("bad percentage: %v", err)
	}
	// quit ends the daemon (its log is complete only then: it buffers).
	stopped = true
	if err := m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.control(ctx, u, "get_server_list"); !errors.Is(err, ErrNoDaemon) {
		t.Errorf("the daemon still answers after quit: %v", err)
	}
	var b []byte
	poll.Until(t, "quit in the daemon's control.log", 5*time.Second, func() bool {
		b, _ = os.ReadFile(filepath.Join(m.LogDir(u), "control.log"))
		return strings.Contains(string(b), "Cmd:quit")
	})
	if !strings.Contains(string(b), "Cmd:set_default_active_thread_percentage 25") {
		t.Errorf("control.log lacks the command:\n%s", b)
	}
}

func repoRoot(t *testing.T) string {
	d, _ := os.Getwd()
	for ; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	t.Fatal("no go.mod above the test")
	return ""
}
