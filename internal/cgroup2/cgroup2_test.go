package cgroup2

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tessera-gpu/tessera/internal/testenv/need"
)

func TestParseMountinfo(t *testing.T) {
	hybrid := "30 22 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n" +
		"35 30 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n" +
		"36 30 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
	unified := "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	// A container with its own cgroup namespace sees its group as the
	// mount's root; a sub-tree bind-mounted elsewhere shows its path.
	inner := "100 99 0:30 /kubepods/pod1/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
	spaced := `41 31 0:38 / /mnt/cg\040v2 rw - cgroup2 cgroup2 rw` + "\n"
	for _, c := range []struct {
		name, info string
		want       Mount
	}{
		{"hybrid", hybrid, Mount{Point: "/sys/fs/cgroup/unified", Root: "/"}},
		{"unified", unified, Mount{Point: "/sys/fs/cgroup", Root: "/"}},
		{"namespaced", inner, Mount{Point: "/sys/fs/cgroup", Root: "/kubepods/pod1/c1"}},
		{"escaped", spaced, Mount{Point: "/mnt/cg v2", Root: "/"}},
		{"two mounts: the shorter", hybrid + "50 24 0:26 / /run/tessera-lab/node-a/cgroup rw - cgroup2 cgroup2 rw\n", Mount{Point: "/sys/fs/cgroup/unified", Root: "/"}},
	} {
		if m, err := parseMountinfo([]byte(c.info)); err != nil || m != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, m, err, c.want)
		}
	}
	if _, err := parseMountinfo([]byte("36 30 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")); !errors.Is(err, ErrNoMount) {
		t.Errorf("a v1-only host: %v, want %v", err, ErrNoMount)
	}
}

func TestGroup(t *testing.T) {
	m := Mount{Point: "/sys/fs/cgroup/unified", Root: "/"}
	for dir, group := range map[string]string{"/sys/fs/cgroup/unified": "/", "/sys/fs/cgroup/unified/a/b": "/a/b", "/sys/fs/cgroup/unified/a/../c/": "/c"} {
		if g, err := m.Group(dir); err != nil || g != group {
			t.Errorf("Group(%q) = %q, %v; want %q", dir, g, err, group)
		}
	}
	for _, bad := range []string{"/tmp/x", "/sys/fs/cgroup", "relative"} {
		if g, err := m.Group(bad); err == nil {
			t.Errorf("Group of %q outside the mount = %q, want an error", bad, g)
		}
	}
	sub := Mount{Point: "/sys/fs/cgroup", Root: "/kubepods/pod1"}
	if g, err := sub.Group("/sys/fs/cgroup/c1"); err != nil || g != "/kubepods/pod1/c1" {
		t.Errorf("Group in a sub-tree mount = %q, %v", g, err)
	}
}

// TestThisHost: a group made under this host's cgroup2 mount is on a
// cgroup2 file system and is the group its path says; a plain directory
// is not.
func TestThisHost(t *testing.T) {
	m, err := FindMount("/proc/self/mountinfo")
	if errors.Is(err, ErrNoMount) {
		need.Missing(t, "a mounted cgroup v2 hierarchy", "mount -t cgroup2 none /sys/fs/cgroup/unified")
	}
	if err != nil {
		t.Fatal(err)
	}
	need.Root(t, "makes a cgroup")
	name := "cgroup2-test-" + filepath.Base(t.TempDir())
	child := filepath.Join(m.Point, name)
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(child)
	if !IsCgroup2(child) {
		t.Errorf("%s is not on a cgroup2 file system", child)
	}
	if IsCgroup2(t.TempDir()) {
		t.Error("a temporary directory counts as a cgroup")
	}
	if g, err := m.Group(child); err != nil || g != filepath.Join(m.Root, name) {
		t.Errorf("Group(%s) = %q, %v", child, g, err)
	}
}
