// Package cinit sets up one container of the lab's process runtime and
// executes its command: the first process of the container, started by the
// runtime in new mount, PID, UTS and IPC namespaces (tessera-lab-init,
// cmd/tessera-lab/init). It reads a Spec, builds the container's root
// filesystem and mounts, drops to the container's user and executes the
// command, which becomes PID 1 of the container.
//
// The root filesystem is an overlay over the host's root filesystem (its
// root mount only, not the host's other mounts) with a private, writable
// upper layer on a tmpfs: the container sees the host's programs and
// libraries, and what it writes stays in the container and is gone when
// its last process exits. /proc (the container's PID namespace), /dev (a
// few devices), /dev/shm, /tmp and /run are its own; /sys is the host's,
// read-only. Then come the bind mounts the kubelet asked for, in order.
//
// The package imports nothing from Kubernetes, so the init binary starts
// in a millisecond or two.
package cinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Spec is everything the init needs to start a container.
type Spec struct {
	// Scratch is an empty host directory on which the init mounts a tmpfs
	// that holds the overlay's upper and work directories and the new root.
	Scratch string `json:"scratch"`
	// Hide lists host paths that the container must not see (the lab's
	// state directory): each is covered by an empty read-only tmpfs.
	Hide []string `json:"hide,omitempty"`
	// Mounts are bind mounts from the host, made in order after the
	// container's own /proc, /dev, /sys, /tmp and /run.
	Mounts []Mount `json:"mounts,omitempty"`
	// ReadOnlyRoot makes the root filesystem read-only once the mounts
	// are made (securityContext.readOnlyRootFilesystem).
	ReadOnlyRoot bool   `json:"readOnlyRoot,omitempty"`
	Hostname     string `json:"hostname,omitempty"`
	// Cwd is the working directory, created if missing ("/" if empty).
	Cwd string `json:"cwd,omitempty"`
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Groups are the supplementary groups (besides GID).
	Groups []uint32 `json:"groups,omitempty"`
	// Env is the whole environment of the command ("KEY=value").
	Env []string `json:"env"`
	// Argv is the command and its arguments; Argv[0] is looked up in the
	// PATH of Env when it has no slash.
	Argv []string `json:"argv"`
	// HostPID: the runtime did not give the container its own PID
	// namespace (hostPID pods); /proc then shows the host's processes.
	HostPID bool `json:"hostPID,omitempty"`
}

// Mount is one bind mount from the host into the container.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Validate checks what the init relies on, so that the runtime can refuse
// a container before starting anything.
func (s *Spec) Validate() error {
	if !filepath.IsAbs(s.Scratch) {
		return fmt.Errorf("scratch directory %q is not an absolute path", s.Scratch)
	}
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return errors.New("no command to run")
	}
	for i, m := range s.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return fmt.Errorf("mount %d: %q on %q: both paths must be absolute", i, m.Source, m.Target)
		}
		if filepath.Clean(m.Target) == "/" {
			return fmt.Errorf("mount %d: %q on the container's root is not supported", i, m.Source)
		}
	}
	for _, h := range s.Hide {
		if !filepath.IsAbs(h) || filepath.Clean(h) == "/" {
			return fmt.Errorf("hidden path %q: want an absolute path below /", h)
		}
	}
	if s.Cwd != "" && !filepath.IsAbs(s.Cwd) {
		return fmt.Errorf("working directory %q is not an absolute path", s.Cwd)
	}
	return nil
}

// The init's file descriptors: the runtime writes the Spec (JSON) into
// SpecFD and closes it; the init writes a message into ErrorFD and exits
// with ExitSetup if it cannot start the command. ErrorFD is close-on-exec,
// so the runtime reads end-of-file and nothing else once the command runs.
const (
	SpecFD    = 3
	ErrorFD   = 4
	ExitSetup = 127
)

// oldRoot is where the host's root stays mounted inside the new root
// until the bind mounts are made.
const oldRoot = "/.tessera-lab-host"

// Main is the init's main function: it never returns when the command
// starts; otherwise it reports why on ErrorFD and exits with ExitSetup.
func Main() {
	errOut := os.NewFile(ErrorFD, "error")
	syscall.CloseOnExec(ErrorFD)
	fail := func(err error) {
		if errOut != nil {
			_, _ = io.WriteString(errOut, err.Error())
		}
		fmt.Fprintf(os.Stderr, "tessera-lab-init: %v\n", err)
		os.Exit(ExitSetup)
	}
	specIn := os.NewFile(SpecFD, "spec")
	if specIn == nil {
		fail(errors.New("no spec on fd 3 (tessera-lab-init is started by the lab's container runtime)"))
	}
	var s Spec
	if err := json.NewDecoder(specIn).Decode(&s); err != nil {
		fail(fmt.Errorf("reading the container spec: %w", err))
	}
	specIn.Close()
	if err := s.Validate(); err != nil {
		fail(err)
	}
	if err := setup(&s); err != nil {
		fail(err)
	}
	fail(execute(&s))
}

// setup builds the root filesystem and enters it.
func setup(s *Spec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", s.Scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", s.Scratch, err)
	}
	upper, work, root := filepath.Join(s.Scratch, "upper"), filepath.Join(s.Scratch, "work"), filepath.Join(s.Scratch, "root")
	for _, d := range []string{upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=/,upperdir=%s,workdir=%s", upper, work)
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("overlay of the host's root filesystem (%s): %w (the lab's containers need overlayfs: modprobe overlay)", opts, err)
	}
	if err := os.MkdirAll(root+oldRoot, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, root+oldRoot); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := systemMounts(s); err != nil {
		return err
	}
	for _, h := range s.Hide {
		if fi, err := os.Stat(h); err == nil && fi.IsDir() {
			if err := unix.Mount("tmpfs", h, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0755"); err != nil {
				return fmt.Errorf("hiding %s: %w", h, err)
			}
		}
	}
	for i, m := range s.Mounts {
		if err := bind(oldRoot+m.Source, m.Target, m.ReadOnly); err != nil {
			return fmt.Errorf("mount %d (%s on %s): %w", i, m.Source, m.Target, err)
		}
	}
	if err := unix.Unmount(oldRoot, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	_ = os.Remove(oldRoot)
	if s.ReadOnlyRoot {
		if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only root: %w", err)
		}
	}
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("hostname %q: %w", s.Hostname, err)
		}
	}
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := os.MkdirAll(cwd, 0o755); err != nil {
		return fmt.Errorf("working directory %s: %w", cwd, err)
	}
	if err := unix.Chdir(cwd); err != nil {
		return fmt.Errorf("working directory %s: %w", cwd, err)
	}
	return nil
}

// devices are the host devices every container gets.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

func systemMounts(s *Spec) error {
	_ = os.MkdirAll("/proc", 0o555)
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("/proc: %w", err)
	}
	_ = os.MkdirAll("/dev", 0o755)
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("/dev: %w", err)
	}
	for _, d := range devices {
		if err := bind(oldRoot+"/dev/"+d, "/dev/"+d, false); err != nil {
			return fmt.Errorf("/dev/%s: %w", d, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, "/dev/"+name); err != nil {
			return err
		}
	}
	if err := os.Mkdir("/dev/shm", 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("/dev/shm: %w", err)
	}
	_ = os.MkdirAll("/sys", 0o555)
	if err := unix.Mount(oldRoot+"/sys", "/sys", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("/sys: %w", err)
	}
	if err := unix.Mount("", "/sys", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("/sys read-only: %w", err)
	}
	for dir, mode := range map[string]string{"/tmp": "1777", "/run": "0755"} {
		_ = os.MkdirAll(dir, 0o755)
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode="+mode); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	return nil
}

// bind mounts source (a path in the current root) on target, creating the
// target as a directory or an empty file like the source.
func bind(source, target string, readOnly bool) error {
	fi, err := os.Stat(source)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) {
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			f.Close()
		}
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if readOnly {
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only: %w", err)
		}
	}
	return nil
}

// execute drops to the container's user and executes its command.
func execute(s *Spec) error {
	groups := make([]int, 0, len(s.Groups))
	for _, g := range s.Groups {
		groups = append(groups, int(g))
	}
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("supplementary groups %v: %w", s.Groups, err)
	}
	if err := unix.Setresgid(int(s.GID), int(s.GID), int(s.GID)); err != nil {
		return fmt.Errorf("group %d: %w", s.GID, err)
	}
	if err := unix.Setresuid(int(s.UID), int(s.UID), int(s.UID)); err != nil {
		return fmt.Errorf("user %d: %w", s.UID, err)
	}
	// Changing credentials cleared the parent-death signal: the
	// container still dies with its runtime.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return err
	}
	path, err := LookPath(s.Argv[0], s.Env)
	if err != nil {
		return err
	}
	err = unix.Exec(path, s.Argv, s.Env)
	return fmt.Errorf("exec %q: %w", path, err)
}

// LookPath finds a command as a container runtime does: a name with a
// slash is taken as it is, any other is searched in the PATH of env.
func LookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if _, err := os.Stat(name); err != nil {
			return "", fmt.Errorf("exec: %q: %w", name, err)
		}
		return name, nil
	}
	path := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %q: %w", name, exec.ErrNotFound)
}
