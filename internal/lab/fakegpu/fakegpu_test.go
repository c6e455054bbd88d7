package fakegpu

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/testenv"
)

// buildFake builds the fake driver and gpu-fill (fakegpu/Makefile) into a
// temporary directory.
func buildFake(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("the fake GPU is C: gcc is needed: %v", err)
	}
	out := t.TempDir()
	if err := testenv.Make("fakegpu", "B="+out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSharedWithTheCDriver: a state file made by Create is the GPU the C
// driver shows (UUID, name, memory), a process holding memory there is
// read back live with that memory and the host pid the driver socket gave
// it, a second process is refused what the first holds, and a process is
// gone from the file the moment it exits.
func TestSharedWithTheCDriver(t *testing.T) {
	build := buildFake(t)
	dir := t.TempDir()
	node := &Node{Dir: filepath.Join(dir, "gpus")}
	g := GPU{UUID: "GPU-0b6c6f4e-1d2a-4e3b-9c8d-7e6f5a4b3c2d", Name: "NVIDIA A100-SXM4-40GB", MemoryBytes: 8 << 30}
	if err := Create(node.File(g.UUID), g); err != nil {
		t.Fatal(err)
	}
	// A container's view: its GPU's file as "0" beside the driver socket.
	devs := filepath.Join(dir, "container-devices")
	if err := os.MkdirAll(devs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(node.File(g.UUID), filepath.Join(devs, "0")); err != nil {
		t.Fatal(err)
	}
	l, err := (&Node{Dir: devs}).ListenDriver()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = ServeDriver(ctx, l) }()

	fill := func(args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(build, "bin", "gpu-fill"), args...)
		cmd.Env = []string{"LD_LIBRARY_PATH=" + filepath.Join(build, "lib"), "FAKE_GPU_DEVICES=" + devs,
			// ignored: the device directory names the GPUs
			"FAKE_GPUS=GPU-11111111-2222-3333-4444-555555555555:1g"}
		return cmd
	}
	holder := fill("--step", "1024", "--max", "5120", "--hold", "forever")
	sc := startHolder(t, holder)
	var log []string
	for sc.Scan() {
		log = append(log, sc.Text())
		if strings.HasPrefix(sc.Text(), "holding") {
			break
		}
	}
	if !strings.Contains(strings.Join(log, "\n"), "cuMemGetInfo: total 8192 MiB, free 8192 MiB") || !strings.Contains(log[0], g.Name+" ("+g.UUID+")") {
		t.Fatalf("the driver does not show the file's GPU:\n%s", strings.Join(log, "\n"))
	}
	got, procs, err := Read(node.File(g.UUID))
	if err != nil {
		t.Fatal(err)
	}
	if got != g {
		t.Errorf("header %+v, want %+v", got, g)
	}
	if len(procs) != 1 || procs[0].UsedBytes != 5<<30 || procs[0].HostPID != uint32(holder.Process.Pid) {
		t.Fatalf("processes %+v, want pid %d holding 5 GiB", procs, holder.Process.Pid)
	}
	if used, err := node.UsedBytes(g.UUID); err != nil || used != 5<<30 {
		t.Errorf("UsedBytes = %d, %v", used, err)
	}
	if ps, err := node.Processes(g.UUID); err != nil || len(ps) != 1 || ps[0].Pid != procs[0].HostPID || ps[0].UsedGpuMemory != 5<<30 {
		t.Errorf("Processes = %+v, %v", ps, err)
	}

	// A second process gets what is left of the GPU, not more.
	out, err := fill().CombinedOutput()
	if err != nil {
		t.Fatalf("second gpu-fill: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "cuMemGetInfo: total 8192 MiB, free 3072 MiB") || !strings.Contains(string(out), "refused at 3072 MiB") {
		t.Errorf("second process:\n%s\nwant it to see 3072 MiB free and be refused there", out)
	}

	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	if _, procs, err := Read(node.File(g.UUID)); err != nil || len(procs) != 0 {
		t.Errorf("after the holder died: %+v, %v; want no process", procs, err)
	}
}

func TestCreateKeepsAndReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g")
	g := GPU{UUID: "GPU-1", Name: "n", MemoryBytes: 1 << 30, SMs: 108}
	if err := Create(path, g); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if fi.Size() != FileSize || fi.Mode().Perm() != 0o666 {
		t.Errorf("file of %d bytes, mode %v; want %d, 0666", fi.Size(), fi.Mode(), FileSize)
	}
	before, _ := os.Stat(path)
	if err := Create(path, g); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path)
	if !os.SameFile(before, after) {
		t.Error("Create replaced the file of the same GPU (its processes would lose their slots)")
	}
	g.MemoryBytes = 2 << 30
	if err := Create(path, g); err != nil {
		t.Fatal(err)
	}
	if got, _, err := Read(path); err != nil || got != g {
		t.Errorf("after a change: %+v, %v; want %+v", got, err, g)
	}
	if err := os.WriteFile(path, make([]byte, FileSize), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Read(path); err == nil || !strings.Contains(err.Error(), "not a GPU state file of layout version 2") {
		t.Errorf("Read of a zeroed file: %v", err)
	}
	if err := Create(filepath.Join(t.TempDir(), "x"), GPU{UUID: strings.Repeat("u", 48)}); err == nil {
		t.Error("Create took a UUID longer than the header holds")
	}
}

func TestUtilization(t *testing.T) {
	var s Sampler
	now := uint64(10e9)
	busy := Process{Slot: 3, HostPID: 42, BusyNs: 1e9, TailNs: now + 5e8, StartNs: 1, RatePPM: 500000}
	idle := Process{Slot: 4, HostPID: 43, BusyNs: 2e9, TailNs: now - 1e9, StartNs: 1}
	gpu, per := s.Utilization("f", []Process{busy, idle}, now)
	if per[42] != 50 || per[43] != 0 || gpu != 50 {
		t.Errorf("first sight: gpu %d, per %v; want 50 for the busy one (half the GPU), 0 for the idle one", gpu, per)
	}
	// 100 ms later the busy one has done 50 ms more of GPU time.
	busy.BusyNs += 5e7
	busy.TailNs += 1e8
	gpu, per = s.Utilization("f", []Process{busy, idle}, now+1e8)
	if per[42] != 50 || gpu != 50 {
		t.Errorf("after 100 ms: gpu %d, per %v; want 50", gpu, per)
	}
	if done := busy.Done(busy.TailNs); done != busy.BusyNs {
		t.Errorf("Done at the tail = %d, want all of %d", done, busy.BusyNs)
	}
	// A process that is gone is forgotten.
	s.Utilization("f", nil, now+2e8)
	if len(s.seen) != 0 {
		t.Errorf("sampler keeps %d gone processes", len(s.seen))
	}
}

// startHolder starts a gpu-fill that holds its memory, killed when the
// test ends; its output is read from the scanner.
func startHolder(t *testing.T, holder *exec.Cmd) *bufio.Scanner {
	t.Helper()
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	return bufio.NewScanner(stdout)
}
