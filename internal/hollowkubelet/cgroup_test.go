package hollowkubelet

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
)

func TestCgroupV2Mount(t *testing.T) {
	hybrid := "31 25 0:27 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n" +
		"35 31 0:31 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n" +
		"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n"
	unified := "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	// A cgroup namespace's view of a subtree bind-mounted elsewhere is
	// not the hierarchy's root.
	subtree := "50 24 0:26 /kubepods /mnt/cg rw - cgroup2 cgroup2 rw\n"
	for _, c := range []struct{ name, info, want string }{
		{"hybrid", hybrid, "/sys/fs/cgroup/unified"},
		{"unified", unified, "/sys/fs/cgroup"},
		{"v1 only", "35 31 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", ""},
		{"subtree only", subtree, ""},
	} {
		if got := CgroupV2Mount(c.info); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestCgroupsNameTheContainer: a process placed in a container's cgroup
// is mapped back to its pod UID and container ID by the node agent's
// reconciler, as a kubelet's container is; the cgroups go once the
// process has.
func TestCgroupsNameTheContainer(t *testing.T) {
	need.Root(t, "makes cgroups")
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mnt := CgroupV2Mount(string(info))
	if mnt == "" {
		need.Missing(t, "a mounted cgroup v2 hierarchy", "mount -t cgroup2 none /sys/fs/cgroup/unified")
	}
	cg := Cgroups{Root: filepath.Join(mnt, "tessera-test-"+newContainerID()[:8])}
	t.Cleanup(cg.Clean)
	id := newContainerID()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(id) {
		t.Fatalf("container ID %q", id)
	}
	const uid = "0f3a6c2e-5b1d-4e8f-9a7c-2d4b6e8f0a1c"
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cg.Place(uid, id, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	gotUID, gotID, ok := reconcile.ParseCgroup(string(b))
	if !ok || string(gotUID) != uid || gotID != id {
		t.Fatalf("the reconciler reads pod %q container %q (%v) from\n%s", gotUID, gotID, ok, b)
	}
	if err := cg.Remove(uid, id, 0); err == nil {
		t.Error("a cgroup with a process in it was removed")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := cg.Remove(uid, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(cg.Dir(uid, id))); !os.IsNotExist(err) {
		t.Errorf("the pod's cgroup is left: %v", err)
	}
}
