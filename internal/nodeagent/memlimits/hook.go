package memlimits

// The container-side half: the createContainer hook the node agent
// injects into a GPU container's CDI edits (`tessera memory-limits set`)
// finds the container's own cgroup v2 group from the OCI state on its
// standard input, sets the driver's limits there on each granted GPU
// (soft = the guarantee, hard = the ceiling) and writes the container's
// confirmation file, which the agent mounts read-only at ConfirmPath: the
// limiter leaves the memory of the GPUs it names to the driver. The agent
// clears the limits (Release) before the group goes away and after its own
// restart (Reconcile).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
	"github.com/tessera-gpu/tessera/internal/cli"
)

// ConfirmPath is where a container sees its confirmation file (read-only);
// the limiter reads it at load (TL_DRIVER_PATH in limiter/src/tl_driver.h:
// change them together).
const ConfirmPath = "/etc/tessera/driver-memory"

// Grant is what the driver is to hold one GPU's memory to for a
// container: Soft (the guarantee) and Hard (the ceiling; Hard = Soft when
// no ceiling is asked), in MiB.
type Grant struct {
	UUID             string
	SoftMiB, HardMiB uint64
}

// String is the grant as the hook's --gpu flag takes it.
func (g Grant) String() string { return fmt.Sprintf("%s=%d:%d", g.UUID, g.SoftMiB, g.HardMiB) }

// ParseGrant reads UUID=SOFT:HARD (MiB).
func ParseGrant(s string) (Grant, error) {
	uuid, lim, ok := strings.Cut(s, "=")
	soft, hard, ok2 := strings.Cut(lim, ":")
	if !ok || !ok2 || uuid == "" {
		return Grant{}, fmt.Errorf("--gpu %q: want UUID=SOFT_MIB:HARD_MIB", s)
	}
	g := Grant{UUID: uuid}
	var err1, err2 error
	g.SoftMiB, err1 = strconv.ParseUint(soft, 10, 32)
	g.HardMiB, err2 = strconv.ParseUint(hard, 10, 32)
	if err1 != nil || err2 != nil || g.SoftMiB == 0 || g.HardMiB < g.SoftMiB {
		return Grant{}, fmt.Errorf("--gpu %q: want MiB with 0 < soft <= hard", s)
	}
	return g, nil
}

// Confirmation is the content of a container's confirmation file: the
// group the limits were set on and the grants the driver holds.
type Confirmation struct {
	Cgroup string
	Grants []Grant
}

// Encode writes the file: the limiter reads the device= lines (their
// first word, a UUID); the rest is for the agent and for people.
func (c Confirmation) Encode() []byte {
	var b bytes.Buffer
	b.WriteString("# written by tessera memory-limits: the driver holds these GPUs' memory limits\n")
	fmt.Fprintf(&b, "cgroup=%s\n", c.Cgroup)
	for _, g := range c.Grants {
		fmt.Fprintf(&b, "device=%s soft=%dm hard=%dm\n", g.UUID, g.SoftMiB, g.HardMiB)
	}
	return b.Bytes()
}

// ParseConfirmation reads a confirmation file; an empty one confirms
// nothing (Cgroup "").
func ParseConfirmation(b []byte) (Confirmation, error) {
	var c Confirmation
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "cgroup="):
			c.Cgroup = strings.TrimPrefix(line, "cgroup=")
		case strings.HasPrefix(line, "device="):
			var g Grant
			if _, err := fmt.Sscanf(line, "device=%s soft=%dm hard=%dm", &g.UUID, &g.SoftMiB, &g.HardMiB); err != nil {
				return Confirmation{}, fmt.Errorf("line %d %q: %v", n, line, err)
			}
			c.Grants = append(c.Grants, g)
		default:
			return Confirmation{}, fmt.Errorf("line %d %q: unknown", n, line)
		}
	}
	return c, sc.Err()
}

// ReadConfirmation reads the confirmation file at path; a missing or
// empty file is no confirmation.
func ReadConfirmation(path string) (Confirmation, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Confirmation{}, nil
	}
	if err != nil {
		return Confirmation{}, err
	}
	return ParseConfirmation(b)
}

// WriteConfirmation replaces the content of the file at path in place
// (the container's mount of it is of this inode: a rename would not reach
// it). The agent creates it empty, so an absent file is an error.
func WriteConfirmation(path string, c Confirmation) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("the confirmation file: %w", err)
	}
	var data []byte
	if c.Cgroup != "" {
		data = c.Encode()
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

// ReadState reads the OCI state a runtime gives a hook on its standard
// input and returns the container's pid.
func ReadState(r io.Reader) (int, error) {
	var st specs.State
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&st); err != nil {
		return 0, fmt.Errorf("the OCI state on standard input: %w", err)
	}
	if st.Pid <= 0 {
		return 0, fmt.Errorf("the OCI state of container %q has no pid (%d)", st.ID, st.Pid)
	}
	return st.Pid, nil
}

// GroupDir is the directory of the cgroup v2 group of process pid, under
// the cgroup2 mount of this mount namespace, read from procRoot/PID/cgroup
// (the unified hierarchy's "0::" line).
func GroupDir(procRoot string, pid int, m cgroup2.Mount) (string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("the container's cgroup: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		g, ok := strings.CutPrefix(line, "0::")
		if !ok {
			continue
		}
		rel, err := filepath.Rel(m.Root, g)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("process %d's cgroup %s is outside the cgroup2 mount at %s (root %s)", pid, g, m.Point, m.Root)
		}
		if rel == "." {
			return "", fmt.Errorf("process %d is in the cgroup2 hierarchy's root group, not a leaf of its own", pid)
		}
		return filepath.Join(m.Point, rel), nil
	}
	return "", fmt.Errorf("process %d has no cgroup v2 group (no 0:: line in /proc/%d/cgroup)", pid, pid)
}

// Set sets soft and hard limits on each GPU for the group at dir. On the
// first failure it clears what it set and returns the error, naming the
// GPU: all or nothing.
func Set(lib nvml.Interface, dir string, grants []Grant) error {
	for i, g := range grants {
		dev, ret := lib.DeviceGetHandleByUUID(g.UUID)
		if ret == nvml.SUCCESS {
			ret = dev.SetMemoryLimits_v1(dir, g.SoftMiB<<20, g.HardMiB<<20)
		}
		if ret != nvml.SUCCESS {
			_ = Release(lib, dir, grants[:i])
			return fmt.Errorf("GPU %s: soft %d MiB, hard %d MiB on %s: %v", g.UUID, g.SoftMiB, g.HardMiB, dir, ret)
		}
	}
	return nil
}

// Release clears the group's limits on each GPU: the soft limit zeroed
// and no hard limit, which removes the driver's entry. A group that is
// gone, or that has no entry, is no error.
func Release(lib nvml.Interface, dir string, grants []Grant) error {
	var errs []error
	for _, g := range grants {
		dev, ret := lib.DeviceGetHandleByUUID(g.UUID)
		if ret == nvml.SUCCESS {
			ret = dev.SetMemoryLimits_v1(dir, 0, nvml.DEVICE_MEMORY_LIMIT_MAX)
		}
		if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
			errs = append(errs, fmt.Errorf("GPU %s: clearing the limits of %s: %v", g.UUID, dir, ret))
		}
	}
	return errors.Join(errs...)
}

// Hook is the createContainer hook: the container's group from the OCI
// state on stdin, its limits set on every GPU, then its confirmation
// file written. When it fails, nothing is set and the confirmation file
// stays empty: the limiter keeps enforcing the container's memory.
func Hook(lib nvml.Interface, stdin io.Reader, procRoot string, m cgroup2.Mount, confirm string, grants []Grant) (Confirmation, error) {
	pid, err := ReadState(stdin)
	if err != nil {
		return Confirmation{}, err
	}
	dir, err := GroupDir(procRoot, pid, m)
	if err != nil {
		return Confirmation{}, err
	}
	if err := Set(lib, dir, grants); err != nil {
		return Confirmation{}, err
	}
	c := Confirmation{Cgroup: dir, Grants: grants}
	if err := WriteConfirmation(confirm, c); err != nil {
		return Confirmation{}, errors.Join(err, Release(lib, dir, grants))
	}
	return c, nil
}

// HookCommand is the command line of `tessera memory-limits` (and of the
// lab's stand-in for it): flags, then Hook. open loads NVML (from
// --nvml, or the loader's search path when empty). A failure is written
// into the confirmation file as a comment and on stderr, and the command
// exits 0: the container starts with the limiter enforcing its memory,
// as on a driver without partitioning.
func HookCommand(args []string, open func(path string) (nvml.Interface, error), stdin io.Reader, stderr io.Writer) error {
	fs := flag.NewFlagSet("memory-limits", flag.ContinueOnError)
	fs.SetOutput(stderr)
	confirm := fs.String("confirm", "", "the container's confirmation file on the host (the agent creates it empty and mounts it read-only at "+ConfirmPath+")")
	proc := fs.String("proc", "/proc", "the host's /proc")
	lib := fs.String("nvml", "", "the NVML library (empty: libnvidia-ml.so.1 from the loader's search path)")
	release := fs.Bool("release", false, "the poststop hook: clear the limits the confirmation file names (soft limit zeroed first) and empty it")
	var grants []Grant
	fs.Func("gpu", "UUID=SOFT_MIB:HARD_MIB, once per GPU: the guarantee (soft) and the ceiling (hard)", func(s string) error {
		g, err := ParseGrant(s)
		grants = append(grants, g)
		return err
	})
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tessera memory-limits --confirm FILE --gpu UUID=SOFT:HARD...\n\nThe createContainer hook the node agent injects into GPU containers on drivers that partition GPU memory per cgroup: reads the OCI state on standard input, sets the driver's memory limits on the container's own cgroup v2 group, and confirms them in FILE.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if *confirm == "" || (len(grants) == 0) != *release || fs.NArg() > 0 {
		return fmt.Errorf("%w: memory-limits needs --confirm, and --release or at least one --gpu, and no arguments", cli.ErrUsage)
	}
	err := func() error {
		m, err := cgroup2.FindMount(filepath.Join(*proc, "self", "mountinfo"))
		if err != nil {
			return err
		}
		l, err := open(*lib)
		if err != nil {
			return err
		}
		defer l.Shutdown()
		if *release {
			return ReleaseConfirmed(l, *confirm)
		}
		_, err = Hook(l, stdin, *proc, m, *confirm, grants)
		return err
	}()
	if err != nil && *release {
		fmt.Fprintf(stderr, "tessera memory-limits --release: %v\n", err)
		return nil
	}
	if err != nil {
		fmt.Fprintf(stderr, "tessera memory-limits: %v; the limiter enforces the container's memory\n", err)
		_ = os.WriteFile(*confirm, []byte("# not set: "+strings.ReplaceAll(err.Error(), "\n", "; ")+"\n"), 0o444)
	}
	return nil
}

// ReleaseConfirmed clears the limits a confirmation file names and
// empties it (the limiter of a process started later enforces memory
// again). An empty file is nothing to do.
func ReleaseConfirmed(lib nvml.Interface, confirm string) error {
	c, err := ReadConfirmation(confirm)
	if err != nil || c.Cgroup == "" {
		return err
	}
	if err := Release(lib, c.Cgroup, c.Grants); err != nil {
		return err
	}
	return WriteConfirmation(confirm, Confirmation{})
}

// GroupState is whether a cgroup v2 group exists and has processes (its
// cgroup.events "populated" key).
func GroupState(dir string) (exists, populated bool) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return true, v == "1"
		}
	}
	return true, false
}

// Outcome is what Reconcile did with one confirmation.
type Outcome int

// Reconcile's outcomes.
const (
	Untouched Outcome = iota // nothing confirmed, or a running container's limits left as they are
	Reapplied                // a running container's limits set again (after the agent's restart)
	Released                 // the container's processes are gone: its limits cleared, before the group goes
	Lost                     // the group went before its limits were cleared: what the driver keeps is logged
)

// Reconcile brings the driver's table in line with one container's
// confirmation file: a running container's limits are set again when
// reapply (the agent's first pass after a start: a driver reloaded since
// keeps nothing), a container whose processes are gone has its limits
// cleared and its confirmation emptied.
func Reconcile(lib nvml.Interface, confirm string, reapply bool) (Outcome, Confirmation, error) {
	c, err := ReadConfirmation(confirm)
	if err != nil || c.Cgroup == "" {
		return Untouched, c, err
	}
	exists, populated := GroupState(c.Cgroup)
	switch {
	case populated && reapply:
		return Reapplied, c, Set(lib, c.Cgroup, c.Grants)
	case populated:
		return Untouched, c, nil
	case exists:
		if err := Release(lib, c.Cgroup, c.Grants); err != nil {
			return Released, c, err
		}
		return Released, c, WriteConfirmation(confirm, Confirmation{})
	default:
		err := Release(lib, c.Cgroup, c.Grants)
		return Lost, c, errors.Join(err, WriteConfirmation(confirm, Confirmation{}))
	}
}
