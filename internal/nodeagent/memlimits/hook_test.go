package memlimits

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
	"github.com/tessera-gpu/tessera/internal/testenv/poll"
)

// fakeDriver builds the fake driver (fakegpu/) and lays out two GPUs of
// 8 GiB as a container sees them (FAKE_GPU_DEVICES): testUUID, whose
// driver partitions memory, and oldUUID, whose driver does not (a
// process loads NVML once: one layout per test binary). It returns the
// build directory, the GPUs' state files and the environment of the
// driver's users.
func fakeDriver(t *testing.T) (build string, files map[string]string, env []string) {
	t.Helper()
	m, err := cgroup2.FindMount("/proc/self/mountinfo")
	if errors.Is(err, cgroup2.ErrNoMount) || (err == nil && m.Root != "/") {
		need.Missing(t, "a mounted cgroup v2 hierarchy (the driver's limits are per cgroup v2 group)", "mount -t cgroup2 none /sys/fs/cgroup/unified")
	}
	need.Root(t, "makes cgroups and sets the driver's memory limits")
	build = t.TempDir()
	if err := testenv.Make("fakegpu", "B="+build); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	devs := filepath.Join(dir, "devices")
	if err := os.Mkdir(devs, 0o755); err != nil {
		t.Fatal(err)
	}
	files = map[string]string{}
	for i, uuid := range []string{testUUID, oldUUID} {
		g := fakegpu.GPU{UUID: uuid, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 8 << 30, Partitioning: uuid == testUUID}
		files[uuid] = filepath.Join(dir, g.UUID)
		if err := fakegpu.Create(files[uuid], g); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(files[uuid], filepath.Join(devs, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	return build, files, []string{"LD_LIBRARY_PATH=" + filepath.Join(build, "lib"), "FAKE_GPU_DEVICES=" + devs}
}

const (
	testUUID = "GPU-0b6c6f4e-1d2a-4e3b-9c8d-7e6f5a4b3c2d"
	oldUUID  = "GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8"
)

// container starts a process in a cgroup v2 leaf of its own (as a
// runtime's container) and returns the leaf and the OCI state a runtime
// gives the container's hooks.
func container(t *testing.T, name string) (dir string, state []byte, proc *exec.Cmd) {
	t.Helper()
	m, err := cgroup2.FindMount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(m.Point, fmt.Sprintf("tessera-memlimits-test-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$0/cgroup.procs" && exec sleep 600`, dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.Remove(dir)
	})
	// The shell has moved itself once its /proc/PID/cgroup names the leaf.
	poll.Until(t, "the container's process in its leaf", 10*time.Second, func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
		return strings.Contains(string(b), filepath.Base(dir))
	})
	return dir, fmt.Appendf(nil, `{"ociVersion":"1.2.0","id":"c1","status":"created","pid":%d,"bundle":"/b"}`, cmd.Process.Pid), cmd
}

// openNVML loads the fake driver's NVML in this process, as the hook does
// with the node's.
func openNVML(t *testing.T, build string, env []string) func(string) (nvml.Interface, error) {
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	return func(string) (nvml.Interface, error) {
		lib := nvml.New(nvml.WithLibraryPath(filepath.Join(build, "lib", "libnvidia-ml.so.1")))
		if ret := lib.Init(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml Init: %v", ret)
		}
		return lib, nil
	}
}

// TestHook: the hook, given a container's OCI state, sets soft =
// guarantee and hard = ceiling on the container's own leaf in the driver
// (the fake one, through go-nvml), confirms it, and the container's
// processes are then refused at the hard limit and see it as the GPU's
// total; released before the leaf goes, nothing is left in the driver's
// table. On a GPU whose driver does not partition memory the hook sets
// nothing, says why in the confirmation file (which then confirms
// nothing: the limiter keeps the memory limit) and lets the container
// start.
func TestHook(t *testing.T) {
	build, files, env := fakeDriver(t)
	open := openNVML(t, build, env)
	t.Run("partitioning", func(t *testing.T) { testHookSets(t, build, files[testUUID], env, open) })
	t.Run("old driver", func(t *testing.T) { testHookRefused(t, files, open) })
}

func testHookSets(t *testing.T, build, file string, env []string, open func(string) (nvml.Interface, error)) {
	dir, state, proc := container(t, "sets")
	confirm := filepath.Join(t.TempDir(), "driver-memory")
	if err := os.WriteFile(confirm, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	err := HookCommand([]string{"--confirm", confirm, "--gpu", testUUID + "=1024:3072"}, open, bytes.NewReader(state), &stderr)
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("hook: %v, stderr %q", err, stderr.String())
	}
	lims, err := fakegpu.ReadLimits(file)
	if err != nil || len(lims) != 1 || lims[0].Path != dir || lims[0].Soft != 1<<30 || lims[0].Hard != 3<<30 {
		t.Fatalf("the driver's table: %+v, %v; want %s with soft 1 GiB, hard 3 GiB", lims, err, dir)
	}
	c, err := ReadConfirmation(confirm)
	if err != nil || c.Cgroup != dir || len(c.Grants) != 1 || c.Grants[0] != (Grant{UUID: testUUID, SoftMiB: 1024, HardMiB: 3072}) {
		t.Fatalf("confirmation %+v, %v", c, err)
	}
	fill := exec.Command("/bin/sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$1"`, dir, filepath.Join(build, "bin", "gpu-fill"))
	fill.Env = env
	out, err := fill.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "total 3072 MiB") || !strings.Contains(string(out), "refused at 3072 MiB") {
		t.Errorf("a process of the container: %v\n%s\nwant it to see 3072 MiB and be refused there", err, out)
	}

	lib, err := open("")
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	// The agent's reconciliation: a running container's limits left as
	// they are, set again after its restart (here: after the driver lost
	// them), cleared once its processes are gone, before its group goes.
	if out, _, err := Reconcile(lib, confirm, false); out != Untouched || err != nil {
		t.Errorf("running container: %v, %v; want it untouched", out, err)
	}
	if err := Release(lib, dir, c.Grants); err != nil {
		t.Fatal(err)
	}
	if lims, err := fakegpu.ReadLimits(file); err != nil || len(lims) != 0 {
		t.Errorf("after release: %+v, %v; want an empty table", lims, err)
	}
	if out, _, err := Reconcile(lib, confirm, true); out != Reapplied || err != nil {
		t.Errorf("after the agent's restart: %v, %v; want the limits set again", out, err)
	}
	if lims, err := fakegpu.ReadLimits(file); err != nil || len(lims) != 1 || lims[0].Hard != 3<<30 {
		t.Errorf("re-applied: %+v, %v", lims, err)
	}
	_ = proc.Process.Kill()
	_ = proc.Wait()
	poll.Until(t, "the container's group empty", 10*time.Second, func() bool { _, populated := GroupState(dir); return !populated })
	if out, _, err := Reconcile(lib, confirm, false); out != Released || err != nil {
		t.Errorf("stopped container: %v, %v; want its limits released", out, err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if lims, err := fakegpu.ReadLimits(file); err != nil || len(lims) != 0 {
		t.Errorf("after the container's group went: %+v, %v; want an empty table (nothing leaked)", lims, err)
	}
	if c, err := ReadConfirmation(confirm); err != nil || c.Cgroup != "" {
		t.Errorf("confirmation after release: %+v, %v; want it emptied", c, err)
	}
}

func testHookRefused(t *testing.T, files map[string]string, open func(string) (nvml.Interface, error)) {
	_, state, _ := container(t, "refused")
	confirm := filepath.Join(t.TempDir(), "driver-memory")
	if err := os.WriteFile(confirm, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	// all or nothing: the partitioning GPU's limits are cleared again
	args := []string{"--confirm", confirm, "--gpu", testUUID + "=1024:2048", "--gpu", oldUUID + "=1024:2048"}
	if err := HookCommand(args, open, bytes.NewReader(state), &stderr); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(confirm)
	c, err := ParseConfirmation(b)
	if err != nil || c.Cgroup != "" || !strings.Contains(string(b), "# not set: GPU "+oldUUID) || !strings.Contains(stderr.String(), oldUUID) {
		t.Errorf("confirmation %q (%+v, %v), stderr %q; want a note of why, nothing confirmed", b, c, err, stderr.String())
	}
	if lims, err := fakegpu.ReadLimits(files[testUUID]); err != nil || len(lims) != 0 {
		t.Errorf("the partitioning GPU's table: %+v, %v; want its entry cleared again", lims, err)
	}
}

func TestParseGrantAndConfirmation(t *testing.T) {
	for _, bad := range []string{"GPU-a", "GPU-a=1", "=1:2", "GPU-a=0:2", "GPU-a=3:2", "GPU-a=x:2"} {
		if _, err := ParseGrant(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseGrant(%q) = %v, want an error naming it", bad, err)
		}
	}
	c := Confirmation{Cgroup: "/sys/fs/cgroup/k/p", Grants: []Grant{{"GPU-a", 1, 2}, {"GPU-b", 3, 3}}}
	got, err := ParseConfirmation(c.Encode())
	if err != nil || got.Cgroup != c.Cgroup || len(got.Grants) != 2 || got.Grants[1] != c.Grants[1] {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if _, err := ParseConfirmation([]byte("cgroup=/x\nfoo\n")); err == nil {
		t.Error("an unknown line parsed")
	}
}
