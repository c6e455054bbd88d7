package hollowkubelet

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
)

// TestCgroupsNameTheContainer: a process placed in a container's cgroup
// is mapped back to its pod UID and container ID by the node agent's
// reconciler, as a kubelet's container is; the cgroups go once the
// process has.
func TestCgroupsNameTheContainer(t *testing.T) {
	need.Root(t, "makes cgroups")
	mnt, err := cgroup2.FindMount("/proc/self/mountinfo")
	if errors.Is(err, cgroup2.ErrNoMount) || (err == nil && mnt.Root != "/") {
		need.Missing(t, "a mounted cgroup v2 hierarchy", "mount -t cgroup2 none /sys/fs/cgroup/unified")
	}
	if err != nil {
		t.Fatal(err)
	}
	cg := Cgroups{Root: filepath.Join(mnt.Point, "tessera-test-"+newContainerID()[:8])}
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
