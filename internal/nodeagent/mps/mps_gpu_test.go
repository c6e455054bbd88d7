//go:build gpu

// The agent's MPS daemon manager with NVIDIA's control daemon on a real
// GPU, with real clients (python3 with a CUDA build of PyTorch). Built
// only with -tags gpu: hack/gpu-node-check.sh runs it on a machine with a
// GPU; `make test` never builds it.
//
//	go test -tags gpu -run TestMPSOnGPU ./internal/nodeagent/mps/
//
// TESSERA_MPS_CONTROL names the control program (default: the one on
// PATH), TESSERA_GPU_UUID the GPU (default: nvidia-smi's GPU 0), PY the
// python. It changes no GPU setting: MPS runs without EXCLUSIVE_PROCESS
// compute mode, and the daemon is quit at the end.

package mps

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// The client: reports the total memory it is told, whether 2 GiB and then
// 6 GiB more can be allocated, and matrix products per second over a few
// seconds.
const mpsClient = `
import sys, time, torch
secs = float(sys.argv[1])
free, total = torch.cuda.mem_get_info()
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
try:
    b = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
    big = "allowed"
    del b
except RuntimeError:
    big = "refused"
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(20):
    y = x @ x
torch.cuda.synchronize()
n, t0 = 0, time.time()
while time.time() - t0 < secs:
    for _ in range(10):
        y = x @ x
    torch.cuda.synchronize()
    n += 10
print("client", total >> 20, big, round(n / (time.time() - t0), 1))
`

type mpsRun struct {
	totalMiB int64
	big      string
	rate     float64
}

// clientEnv is the manager's client environment without what this test's
// own environment would carry into it: an MPS setting of the caller's (a
// thread percentage, a pinned limit, another pipe directory) or a preloaded
// library (the limiter). Only the inherited part is filtered: m.env
// appends the manager's own CUDA_MPS_* settings to os.Environ().
func clientEnv(m *Manager, uuid string) []string {
	inherited := len(os.Environ())
	env := m.env(uuid)
	out := make([]string, 0, len(env))
	for i, kv := range env {
		if i < inherited && (strings.HasPrefix(kv, "CUDA_MPS_") || strings.HasPrefix(kv, "LD_PRELOAD=")) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func runMPSClient(t *testing.T, m *Manager, uuid, py, script string, extraEnv ...string) mpsRun {
	t.Helper()
	cmd := exec.Command(py, script, "6")
	cmd.Env = append(clientEnv(m, uuid), extraEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("MPS client %v: %v\n%s", extraEnv, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 4 || f[0] != "client" {
		t.Fatalf("MPS client %v printed %q", extraEnv, out)
	}
	var r mpsRun
	r.totalMiB, _ = strconv.ParseInt(f[1], 10, 64)
	r.big = f[2]
	r.rate, _ = strconv.ParseFloat(f[3], 64)
	t.Logf("client %v: told %d MiB total, 6 GiB more %s, %.1f products/s", extraEnv, r.totalMiB, r.big, r.rate)
	return r
}

func TestMPSOnGPU(t *testing.T) {
	bin := os.Getenv("TESSERA_MPS_CONTROL")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("nvidia-cuda-mps-control"); err != nil {
			t.Fatalf("nvidia-cuda-mps-control: %v (set TESSERA_MPS_CONTROL)", err)
		}
	}
	uuid := os.Getenv("TESSERA_GPU_UUID")
	if uuid == "" {
		out, err := exec.Command("nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0").Output()
		if err != nil {
			t.Fatalf("nvidia-smi: %v", err)
		}
		uuid = strings.TrimSpace(string(out))
	}
	py := os.Getenv("PY")
	if py == "" {
		py = "python3"
	}
	script := filepath.Join(t.TempDir(), "client.py")
	if err := os.WriteFile(script, []byte(mpsClient), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &Manager{Command: []string{bin}, Root: shortDir(t), Logger: ktesting.NewLogger(t, ktesting.NewConfig())}
	ctx := context.Background()
	defer func() {
		if err := m.Stop(ctx); err != nil {
			t.Errorf("quitting the daemon: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(m.LogDir(uuid), "control.log")); err == nil {
			t.Logf("control.log:\n%s", b)
		}
		if b, err := os.ReadFile(filepath.Join(m.LogDir(uuid), "server.log")); err == nil {
			t.Logf("server.log:\n%s", b)
		}
	}()

	// The whole GPU first: the reference rate.
	if err := m.Ensure(ctx, []GPU{{UUID: uuid, Limits: Limits{ThreadPercent: 100}}}); err != nil {
		t.Fatal(err)
	}
	full := runMPSClient(t, m, uuid, py, script)
	if full.big != "allowed" {
		t.Errorf("without a pinned limit, 2 + 6 GiB was %s; want allowed", full.big)
	}
	out, err := m.control(ctx, uuid, "get_server_list")
	t.Logf("get_server_list after a client ran: %q %v", out, err)

	// A tile: 30 % of the threads, 4 GiB. The manager's limits reach the
	// running server and new ones.
	tile := Limits{ThreadPercent: 30, PinnedMiB: 4096}
	if err := m.Ensure(ctx, []GPU{{UUID: uuid, Limits: tile}}); err != nil {
		t.Fatal(err)
	}
	limited := runMPSClient(t, m, uuid, py, script)
	if limited.big != "refused" {
		t.Errorf("with a 4 GiB pinned limit, 2 + 6 GiB was %s; want refused", limited.big)
	}
	t.Logf("with a 4 GiB pinned limit the client was told %d MiB total", limited.totalMiB)
	if ratio := limited.rate / full.rate; ratio > 0.6 {
		t.Errorf("30 %% of the threads gave %.2f of the whole GPU's rate (%.1f vs %.1f); want at most 0.6", ratio, limited.rate, full.rate)
	} else {
		t.Logf("30 %% of the threads: %.2f of the whole GPU's rate", ratio)
	}

	// A tenant's own environment cannot enlarge the tile.
	hostile := runMPSClient(t, m, uuid, py, script,
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=64G")
	if hostile.big != "refused" {
		t.Errorf("a client asking CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=64G got 2 + 6 GiB %s; want refused (the server's 4 GiB)", hostile.big)
	}
	if hostile.rate > limited.rate*1.25 {
		t.Errorf("a client asking CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 ran %.1f products/s; the 30 %% tile gave %.1f: want at most 1.25x", hostile.rate, limited.rate)
	}
	fmt.Fprintf(os.Stderr, "mps: whole %.1f/s, 30%% tile %.1f/s (%.2f), hostile env %.1f/s; 4 GiB tile told %d MiB, 6 GiB more %s / hostile %s\n",
		full.rate, limited.rate, limited.rate/full.rate, hostile.rate, limited.totalMiB, limited.big, hostile.big)
}
