package hollowkubelet

// Containers' cgroups. The runtime puts each container's processes in a
// cgroup of their own, named as the kubelet's cgroupfs driver names a
// container's (…/kubepods/pod<pod UID>/<container ID>), so that what maps
// a process to its pod and container from the host through
// /proc/<pid>/cgroup (the node agent's reconciler, reconcile.ParseCgroup)
// works on the runtime's containers as on a kubelet's. The cgroups are in
// a cgroup v2 hierarchy and no controller is enabled in them: they
// account and limit nothing, they only name. A container's init is
// placed in its cgroup before it executes the container's command, so
// every process of the container is born there.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// Cgroups is the directory, in a cgroup v2 hierarchy, under which the
// runtime makes its containers' cgroups: <Root>/kubepods/pod<UID>/<ID>.
type Cgroups struct{ Root string }

// Dir is the cgroup of a container.
func (c Cgroups) Dir(podUID, containerID string) string {
	return filepath.Join(c.Root, "kubepods", "pod"+podUID, containerID)
}

// Place makes the container's cgroup and moves the process into it.
func (c Cgroups) Place(podUID, containerID string, pid int) error {
	dir := c.Dir(podUID, containerID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making the container's cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("moving the container's process %d into its cgroup %s: %w", pid, dir, err)
	}
	return nil
}

// Remove removes the container's cgroup once its last process is gone
// (the kernel refuses to remove a cgroup with processes; the container's
// other processes die with its PID 1 but may take a moment), and its
// pod's cgroup when that is empty too. It gives up after wait.
func (c Cgroups) Remove(podUID, containerID string, wait time.Duration) error {
	dir := c.Dir(podUID, containerID)
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			break
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("removing the container's cgroup %s: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = syscall.Rmdir(filepath.Dir(dir)) // the pod's, once its last container's is gone
	return nil
}

// Clean removes every empty cgroup under Root (what a runtime that died
// left: its containers died with it), deepest first, and Root itself.
func (c Cgroups) Clean() {
	var dirs []string
	_ = filepath.WalkDir(c.Root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}

// newContainerID is a container ID as containerd and CRI-O make them: 64
// hex digits (the form a kubelet's cgroup names carry).
func newContainerID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
