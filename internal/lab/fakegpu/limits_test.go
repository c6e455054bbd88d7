package fakegpu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
)

// leaf makes a cgroup v2 group of its own for the test under this host's
// cgroup2 mount (the lab's containers get theirs the same way).
func leaf(t *testing.T, name string) string {
	t.Helper()
	m, err := cgroup2.FindMount("/proc/self/mountinfo")
	if errors.Is(err, cgroup2.ErrNoMount) {
		need.Missing(t, "a mounted cgroup v2 hierarchy (the driver's memory partitioning is per cgroup v2 group)", "mount -t cgroup2 none /sys/fs/cgroup/unified")
	}
	if err != nil {
		t.Fatal(err)
	}
	need.Root(t, "makes cgroups and sets memory limits")
	dir := filepath.Join(m.Point, fmt.Sprintf("tessera-fakegpu-test-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	return dir
}

// inGroup runs the command as a process of the group: a shell moves
// itself there, then executes it.
func inGroup(dir string, cmd *exec.Cmd) *exec.Cmd {
	args := append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir}, cmd.Args...)
	args[3] = cmd.Path
	c := exec.Command("/bin/sh", args...)
	c.Env = cmd.Env
	return c
}

// TestLimitsWithTheCDriver: the table the node's emulated NVML writes
// (SetLimits) is the one the containers' fake driver enforces, keyed by
// each process's own cgroup: a process is refused past its group's hard
// limit and sees that limit as its GPU's total, crossing the soft limit
// is counted, the fake NVML (nvidia-smi memory-limits) sets and reads the
// same entries, and a group's entry goes with the group when its soft
// limit was zeroed first, and is left behind, leaked, when it was not.
func TestLimitsWithTheCDriver(t *testing.T) {
	build := buildFake(t)
	dir := t.TempDir()
	node := &Node{Dir: filepath.Join(dir, "gpus")}
	g := GPU{UUID: "GPU-0b6c6f4e-1d2a-4e3b-9c8d-7e6f5a4b3c2d", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 8 << 30, Partitioning: true}
	file := node.File(g.UUID)
	if err := Create(file, g); err != nil {
		t.Fatal(err)
	}
	devs := filepath.Join(dir, "container-devices")
	if err := os.MkdirAll(devs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, filepath.Join(devs, "0")); err != nil {
		t.Fatal(err)
	}
	env := []string{"LD_LIBRARY_PATH=" + filepath.Join(build, "lib"), "FAKE_GPU_DEVICES=" + devs}
	tool := func(name string, args ...string) *exec.Cmd {
		c := exec.Command(filepath.Join(build, "bin", name), args...)
		c.Env = env
		return c
	}

	a, b := leaf(t, "a"), leaf(t, "b")
	if err := SetLimits(file, a, 2<<30, 3<<30); err != nil {
		t.Fatal(err)
	}
	out, err := inGroup(a, tool("gpu-fill")).CombinedOutput()
	if err != nil {
		t.Fatalf("gpu-fill in group a: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "cuMemGetInfo: total 3072 MiB, free 3072 MiB") || !strings.Contains(string(out), "refused at 3072 MiB") {
		t.Errorf("a process of group a (hard limit 3 GiB on an 8 GiB GPU):\n%s\nwant it to see 3072 MiB and be refused there", out)
	}
	lims, err := ReadLimits(file)
	if err != nil || len(lims) != 1 || lims[0].Crossings == 0 || lims[0].Soft != 2<<30 || lims[0].Hard != 3<<30 {
		t.Errorf("table %+v, %v; want group a's entry with its soft limit crossed", lims, err)
	}
	// A process outside every limited group still gets the whole GPU.
	if out, err := tool("gpu-fill").CombinedOutput(); err != nil || !strings.Contains(string(out), "refused at 8192 MiB") {
		t.Errorf("a process of no limited group: %v\n%s", err, out)
	}

	// The fake NVML (C) writes the same table; the Go side reads it.
	if out, err := tool("nvidia-smi", "memory-limits", "--set", "-n", b, "--soft-limit", "1024", "--hard-limit", "2048").CombinedOutput(); err != nil {
		t.Fatalf("nvidia-smi memory-limits --set: %v\n%s", err, out)
	}
	holder := inGroup(b, tool("gpu-fill", "--step", "512", "--max", "1536", "--hold", "forever"))
	for sc := startHolder(t, holder); sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "holding") {
			break
		}
	}
	soft, hard, used, err := GetLimits(file, b)
	if err != nil || soft != 1<<30 || hard != 2<<30 || used != 1536<<20 {
		t.Errorf("GetLimits(b) = %d, %d, %d, %v; want 1 GiB, 2 GiB, 1536 MiB held", soft, hard, used, err)
	}
	out, err = tool("nvidia-smi", "memory-limits", "-n", b).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "soft 1024 MiB, hard 2048 MiB, used 1536 MiB") {
		t.Errorf("nvidia-smi memory-limits -n b: %v\n%s", err, out)
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()

	// Zeroed, then removed: the entry goes. Removed with its soft limit
	// set: it stays, leaked.
	if err := SetLimits(file, b, 0, 2<<30); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	lims, err = ReadLimits(file)
	if err != nil || len(lims) != 1 || lims[0].Path != a || !lims[0].Leaked {
		t.Errorf("after removing both groups: %+v, %v; want only a's entry, leaked", lims, err)
	}
	if _, _, _, err := GetLimits(file, a); !errors.Is(err, ErrCgroup) {
		t.Errorf("GetLimits of a removed group: %v, want %v", err, ErrCgroup)
	}
}

// TestLimitsRules: what the driver refuses, as NVML does.
func TestLimitsRules(t *testing.T) {
	dir := t.TempDir()
	old, part := filepath.Join(dir, "old"), filepath.Join(dir, "new")
	if err := Create(old, GPU{UUID: "GPU-1", MemoryBytes: 8 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := Create(part, GPU{UUID: "GPU-2", MemoryBytes: 8 << 30, Partitioning: true}); err != nil {
		t.Fatal(err)
	}
	g := leaf(t, "rules")
	if err := SetLimits(old, g, 1, 2); !errors.Is(err, ErrNotSupported) {
		t.Errorf("an older driver: %v", err)
	}
	if _, _, _, err := GetLimits(old, g); !errors.Is(err, ErrNotSupported) {
		t.Errorf("an older driver (get): %v", err)
	}
	for name, tc := range map[string]struct {
		dir        string
		soft, hard uint64
		want       error
	}{
		"soft above hard":       {g, 3, 2, ErrInvalid},
		"hard above the GPU":    {g, 1, 9 << 30, ErrInvalid},
		"not a cgroup":          {dir, 1, 2, ErrCgroup},
		"a group that is gone":  {g + "-gone", 1, 2, ErrCgroup},
		"no hard limit is fine": {g, 1 << 30, NoLimit, nil},
	} {
		if err := SetLimits(part, tc.dir, tc.soft, tc.hard); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if err := SetLimits(part, g, 0, NoLimit); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := GetLimits(part, g); !errors.Is(err, ErrNotFound) {
		t.Errorf("after clearing: %v, want %v", err, ErrNotFound)
	}
	if lims, err := ReadLimits(part); err != nil || len(lims) != 0 {
		t.Errorf("table after clearing: %+v, %v", lims, err)
	}
}
