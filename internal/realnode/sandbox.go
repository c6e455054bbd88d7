package realnode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The sandbox's network: one address on a veth pair of its own (the
// node's InternalIP, where the API server listens), a default route
// through it, the pods' bridge behind it.
const (
	Address     = "10.203.0.2"
	gateway     = "10.203.0.1"
	ClusterCIDR = "10.244.0.0/16"
	PodCIDR     = "10.244.0.0/24"
)

// sandboxEnv carries the sandbox's directory and cgroup root to the
// process Run starts in it.
const sandboxEnv = "TESSERA_REALNODE_SANDBOX"

// Sandbox is where a node runs: new mount and network namespaces in which
// the node's host paths are directories of Dir.
type Sandbox struct {
	// Dir holds everything the node writes.
	Dir string
	// CgroupRoot is the cgroup (in every hierarchy) the kubelet puts its
	// pods under.
	CgroupRoot string
	// Address is the node's address.
	Address string
}

// shadowed are the host paths the sandbox replaces with directories of
// its own (bind mounts), besides /run and /var/log: the kubelet's, the CNI
// plugins' and the CDI specs'. Run makes the missing ones on this machine
// as empty mount points and removes them afterwards.
var shadowed = []string{"/var/lib/kubelet", "/var/lib/cni", "/etc/cdi"}

// overlaid are the host directories the sandbox sees through an overlay:
// this machine's files below, the node's writes in a directory of the
// sandbox above. Tessera's chart writes /var/lib/tessera and
// /usr/local/tessera there as plain directories, which the documented
// clean-up removes (a bind mount could not be).
var overlaid = []string{"/var/lib", "/usr/local"}

// HostPath is where a host path of the node (under shadowed, overlaid,
// /run or /var/log) lives outside the sandbox, for checks made after it
// ends (in overlaid, what the node wrote).
func (s *Sandbox) HostPath(p string) string {
	return filepath.Join(s.Dir, "host", strings.TrimPrefix(p, "/"))
}

// Current is the sandbox this process runs in (Run's child), or nil.
func Current() *Sandbox {
	v := os.Getenv(sandboxEnv)
	if v == "" {
		return nil
	}
	dir, root, _ := strings.Cut(v, ":")
	return &Sandbox{Dir: dir, CgroupRoot: root, Address: Address}
}

// CheckHost reports what this machine lacks to run a node: root, the
// commands the network needs (ip; iptables for kube-proxy and the CNI
// plugins), cgroup v1 or v2 hierarchies, overlayfs.
func CheckHost() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (namespaces, mounts, cgroups, mknod)")
	}
	for _, c := range []string{"ip", "iptables", "iptables-save", "iptables-restore"} {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, "the command "+c+" (Debian: apt-get install iproute2 iptables)")
		}
	}
	if b, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(b), "overlay") {
		missing = append(missing, "overlayfs (containerd's snapshotter)")
	}
	if len(cgroupHierarchies()) == 0 {
		missing = append(missing, "cgroup hierarchies under /sys/fs/cgroup")
	}
	if len(missing) > 0 {
		return fmt.Errorf("this machine cannot run a real node: missing %s", strings.Join(missing, "; "))
	}
	return nil
}

// cgroupHierarchies are the mounted cgroup hierarchies (v1 controllers,
// the named systemd one, the v2 unified one).
func cgroupHierarchies() []string {
	var out []string
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && (f[2] == "cgroup" || f[2] == "cgroup2") && strings.HasPrefix(f[1], "/sys/fs/cgroup") {
			out = append(out, f[1])
		}
	}
	sort.Strings(out)
	return out
}

// Run runs this program (os.Args) again inside a new sandbox whose state
// is in dir and returns its exit status. Before, it makes the pods' cgroup
// root and the missing mount points; after, it kills whatever the sandbox
// left running (container shims, containers), removes the cgroups and the
// mount points it made, and dir itself unless keep.
func Run(dir string, keep bool) (int, error) {
	if err := CheckHost(); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	s := &Sandbox{Dir: dir, CgroupRoot: fmt.Sprintf("tessera-e2e-%d", os.Getpid()), Address: Address}
	var made []string
	for _, p := range shadowed {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return 0, err
			}
			made = append(made, p)
		}
	}
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, s.CgroupRoot), 0o755); err != nil {
			return 0, fmt.Errorf("cgroup root: %w", err)
		}
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), sandboxEnv+"="+s.Dir+":"+s.CgroupRoot)
	// Go makes / private in the new mount namespace: nothing mounted
	// inside reaches this machine's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	code := 0
	runErr := cmd.Start()
	var mntNS string
	if runErr == nil {
		mntNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
		if err := cmd.Wait(); err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else {
				runErr = err
			}
		}
	}
	cleanErr := s.cleanUp(mntNS, made, keep)
	return code, errors.Join(runErr, cleanErr)
}

// cleanUp kills what runs in the sandbox's mount namespace or its
// cgroups, then removes the cgroups, the mount points made and the state.
func (s *Sandbox) cleanUp(mntNS string, made []string, keep bool) error {
	var errs []error
	hier := cgroupHierarchies()
	for try := 0; try < 50; try++ {
		pids := map[int]bool{}
		if mntNS != "" {
			for _, pid := range processesIn(mntNS) {
				pids[pid] = true
			}
		}
		for _, h := range hier {
			_ = filepath.WalkDir(filepath.Join(h, s.CgroupRoot), func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
					for _, f := range strings.Fields(string(b)) {
						if pid, err := strconv.Atoi(f); err == nil {
							pids[pid] = true
						}
					}
				}
				return nil
			})
		}
		if len(pids) == 0 {
			break
		}
		for pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, h := range hier {
		if err := removeCgroups(filepath.Join(h, s.CgroupRoot)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range made {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if !keep {
		// The namespace's mounts go with its last process; a lazy
		// unmount may still hold a file for a moment.
		var err error
		for range 20 {
			if err = os.RemoveAll(s.Dir); err == nil {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// processesIn lists the processes whose mount namespace is ns
// ("mnt:[N]").
func processesIn(ns string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && l == ns {
			out = append(out, pid)
		}
	}
	return out
}

// removeCgroups removes a cgroup and those below it, deepest first.
func removeCgroups(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dirs[i], err))
		}
	}
	return errors.Join(errs...)
}

// Enter sets the sandbox up from inside (Run's child, before anything
// else): mounts shared within it, a tmpfs on /run, the node's host paths
// as directories of Dir, and its network.
func (s *Sandbox) Enter() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making / shared in the sandbox: %w", err)
	}
	for _, p := range overlaid {
		upper, work := s.HostPath(p), filepath.Join(s.Dir, "overlay-work", strings.TrimPrefix(p, "/"))
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := unix.Mount("overlay", p, "overlay", 0, "lowerdir="+p+",upperdir="+upper+",workdir="+work); err != nil {
			return fmt.Errorf("an overlay on %s: %w", p, err)
		}
	}
	binds := append([]string{"/var/log"}, shadowed...)
	for _, p := range binds {
		src := s.HostPath(p)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", src, p, err)
		}
	}
	run := s.HostPath("/run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(run, "/run", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on /run: %w", run, err)
	}
	// Mounts made since are shared within the sandbox too (the kubelet's
	// HostToContainer and Bidirectional propagation need it).
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making / shared in the sandbox: %w", err)
	}
	for _, c := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "e2e0", "type", "veth", "peer", "name", "e2e1"},
		{"ip", "addr", "add", s.Address + "/24", "dev", "e2e0"},
		{"ip", "link", "set", "e2e0", "up"},
		{"ip", "link", "set", "e2e1", "up"},
		{"ip", "route", "add", "default", "via", gateway, "dev", "e2e0"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, out)
		}
	}
	for k, v := range map[string]string{"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"} {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	return nil
}
