// Package cgroup2 finds cgroup v2 groups: the cgroup2 mount of this
// process's mount namespace, and the group a directory of it is, as
// /proc/<pid>/cgroup names it. The lab's runtime makes its containers'
// groups under that mount, and the lab's fake GPU driver keys its memory
// limits (nvmlDeviceSetMemoryLimits_v1 takes a group's directory) by the
// group. Standard library and x/sys only.
package cgroup2

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is a cgroup2 mount: its mount point and the group it shows as its
// root ("/" unless the mount is of a sub-tree, as in a container with its
// own cgroup namespace).
type Mount struct {
	Point string
	Root  string
}

// ErrNoMount: no cgroup v2 hierarchy is mounted (a cgroup v1 host, or a
// container that was not given one).
var ErrNoMount = errors.New("no cgroup2 file system is mounted")

// FindMount returns the cgroup2 mount of this process's mount namespace
// (the shortest mount point if there are several), read from mountinfo
// (normally /proc/self/mountinfo).
func FindMount(mountinfo string) (Mount, error) {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return Mount{}, err
	}
	return parseMountinfo(b)
}

func parseMountinfo(b []byte) (Mount, error) {
	var best Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		m := Mount{Root: unescape(f[3]), Point: unescape(f[4])}
		if best.Point == "" || len(m.Point) < len(best.Point) {
			best = m
		}
	}
	if best.Point == "" {
		return Mount{}, ErrNoMount
	}
	return best, nil
}

// unescape undoes mountinfo's octal escapes ("\040" for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Group is the group a directory of the mount is, as /proc/<pid>/cgroup
// names it.
func (m Mount) Group(dir string) (string, error) {
	rel, err := filepath.Rel(m.Point, filepath.Clean(dir))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s is not under the cgroup2 mount at %s", dir, m.Point)
	}
	g := filepath.Join(m.Root, rel)
	if rel == "." {
		g = m.Root
	}
	return g, nil
}

// IsCgroup2 reports whether dir is a directory of a cgroup2 file system.
func IsCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}
