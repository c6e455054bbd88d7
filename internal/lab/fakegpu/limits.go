package fakegpu

// The fake driver's memory partitioning per cgroup: the table of limits
// after the slots of a GPU's state file, the same entries the fake NVML
// (fakegpu/src/fake_limits.h) reads and writes, so the node agent's
// emulated NVML (nvmlemu) and the containers' fake driver are one driver.
// The semantics are fake_limits.h's; TestLimitsParityWithC holds the two
// to them.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
)

// NoLimit is the hard limit of a cgroup without one
// (NVML_DEVICE_MEMORY_LIMIT_MAX).
const NoLimit = ^uint64(0)

// Layout of one entry (struct fake_limit).
const (
	limPath      = 0
	lenLimPath   = 256
	limKey       = 256
	lenLimKey    = 200
	limSoft      = 456
	limHard      = 464
	limCrossings = 472
	limPressure  = 476
	limLeaked    = 480
)

// Errors of SetLimits and GetLimits, as NVML answers them.
var (
	ErrNotSupported = errors.New("the GPU's driver does not partition memory (NVML_ERROR_NOT_SUPPORTED)")
	ErrInvalid      = errors.New("invalid limits (NVML_ERROR_INVALID_ARGUMENT)")
	ErrNoPermission = errors.New("setting memory limits needs root (NVML_ERROR_NO_PERMISSION)")
	ErrCgroup       = errors.New("the cgroup path cannot be opened (NVML_ERROR_OPERATING_SYSTEM)")
	ErrNotFound     = errors.New("no limits for this cgroup (NVML_ERROR_NOT_FOUND)")
	ErrTableFull    = errors.New("the driver's table of limits is full (NVML_ERROR_UNKNOWN)")
)

// Limit is one cgroup's entry in a GPU's table.
type Limit struct {
	// Path is the cgroup's directory as the setter named it; Group the
	// same group as its processes' /proc/<pid>/cgroup names it.
	Path, Group string
	Soft, Hard  uint64
	// Crossings counts allocations that took the group past its soft
	// limit; Pressure its allocations within the soft limit the GPU
	// could not hold while another group was above its own.
	Crossings, Pressure uint32
	// Leaked: the group went away while its soft limit was set.
	Leaked bool
}

// CgroupHash is the hash a process's slot records of its cgroup v2 group
// (fake_cg_hash: FNV-1a, never 0).
func CgroupHash(group string) uint64 {
	h := uint64(1469598103934665603)
	for i := 0; i < len(group); i++ {
		h = (h ^ uint64(group[i])) * 1099511628211
	}
	if h == 0 {
		return 1
	}
	return h
}

// SetLimits is nvmlDeviceSetMemoryLimits_v1 on the GPU of the state file
// at path: dir is the group's directory under a cgroup2 mount of this
// mount namespace; soft 0 and hard NoLimit clear its entry.
func SetLimits(path, dir string, soft, hard uint64) error {
	return withTable(path, true, func(g GPU, t *table) error {
		if soft > hard || (hard != NoLimit && hard > g.MemoryBytes) || len(dir) >= lenLimPath {
			return fmt.Errorf("soft %d, hard %d on a GPU of %d bytes: %w", soft, hard, g.MemoryBytes, ErrInvalid)
		}
		if os.Geteuid() != 0 {
			return ErrNoPermission
		}
		group, err := groupOfDir(dir)
		if err != nil {
			return err
		}
		t.sweep()
		i := t.find(group)
		if soft == 0 && hard == NoLimit {
			if i >= 0 {
				t.clear(i)
			}
			return nil
		}
		if i < 0 {
			if i = t.free(); i < 0 {
				return ErrTableFull
			}
			t.clear(i)
			t.put(i, limPath, lenLimPath, dir)
			t.put(i, limKey, lenLimKey, group)
		}
		le := binary.LittleEndian
		le.PutUint64(t.entry(i)[limSoft:], soft)
		le.PutUint64(t.entry(i)[limHard:], hard)
		return nil
	})
}

// GetLimits is nvmlDeviceGetMemoryLimits_v1: the group's limits and what
// its processes hold on the GPU.
func GetLimits(path, dir string) (soft, hard, used uint64, err error) {
	err = withTable(path, true, func(_ GPU, t *table) error {
		if _, err := os.Stat(dir); err != nil {
			return fmt.Errorf("%s: %w", dir, ErrCgroup)
		}
		group, err := groupOfDir(dir)
		if err != nil {
			return err
		}
		t.sweep()
		i := t.find(group)
		if i < 0 {
			return ErrNotFound
		}
		l := t.limit(i)
		soft, hard, used = l.Soft, l.Hard, t.used[CgroupHash(group)]
		return nil
	})
	return soft, hard, used, err
}

// ReadLimits lists a GPU's table as the driver holds it now: the entries
// of groups that went away with their soft limit at 0 are gone, those
// that went away with it set are there, leaked.
func ReadLimits(path string) ([]Limit, error) {
	var out []Limit
	err := withTable(path, false, func(_ GPU, t *table) error {
		t.sweep() // in memory: nothing is written back
		for i := range Limits {
			if l := t.limit(i); l.Group != "" {
				out = append(out, l)
			}
		}
		return nil
	})
	return out, err
}

func groupOfDir(dir string) (string, error) {
	if !cgroup2.IsCgroup2(dir) {
		return "", fmt.Errorf("%s is not a directory of a cgroup2 file system: %w", dir, ErrCgroup)
	}
	m, err := cgroup2.FindMount("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("%s: %v: %w", dir, err, ErrCgroup)
	}
	g, err := m.Group(dir)
	if err != nil || len(g) >= lenLimKey {
		return "", fmt.Errorf("%s: %w", dir, ErrCgroup)
	}
	return g, nil
}

// table is a GPU's table of limits in memory, with what each cgroup's
// live processes hold (by cgroup hash).
type table struct {
	buf  []byte
	used map[uint64]uint64
}

func (t *table) entry(i int) []byte { return t.buf[i*LimitSize : (i+1)*LimitSize] }

func (t *table) limit(i int) Limit {
	e, le := t.entry(i), binary.LittleEndian
	return Limit{
		Path: cstring(e[limPath : limPath+lenLimPath]), Group: cstring(e[limKey : limKey+lenLimKey]),
		Soft: le.Uint64(e[limSoft:]), Hard: le.Uint64(e[limHard:]),
		Crossings: le.Uint32(e[limCrossings:]), Pressure: le.Uint32(e[limPressure:]),
		Leaked: le.Uint32(e[limLeaked:]) != 0,
	}
}

func (t *table) put(i, off, n int, s string) { copy(t.entry(i)[off:off+n-1], s) }

func (t *table) clear(i int) { clear(t.entry(i)) }

// find is the live (not leaked) entry of a group, or -1.
func (t *table) find(group string) int {
	for i := range Limits {
		if l := t.limit(i); l.Group == group && !l.Leaked {
			return i
		}
	}
	return -1
}

func (t *table) free() int {
	for i := range Limits {
		if t.limit(i).Group == "" {
			return i
		}
	}
	return -1
}

// sweep: entries whose group is gone are cleared when their soft limit
// is 0, marked leaked otherwise (fake_limits_sweep).
func (t *table) sweep() {
	for i := range Limits {
		l := t.limit(i)
		if l.Group == "" || l.Leaked {
			continue
		}
		if _, err := os.Stat(l.Path); err == nil {
			continue
		}
		if l.Soft == 0 {
			t.clear(i)
		} else {
			binary.LittleEndian.PutUint32(t.entry(i)[limLeaked:], 1)
		}
	}
}

// withTable runs f on the GPU's table under the state file's lock (byte
// 0, the fake driver's allocation lock) and writes it back when write.
func withTable(path string, write bool, f func(GPU, *table) error) error {
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR
	}
	file, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return err
	}
	defer file.Close()
	lockType := int16(unix.F_RDLCK)
	if write {
		lockType = unix.F_WRLCK
	}
	lk := unix.Flock_t{Type: lockType, Whence: io.SeekStart, Start: 0, Len: 1}
	if err := unix.FcntlFlock(file.Fd(), unix.F_OFD_SETLKW, &lk); err != nil {
		return fmt.Errorf("%s: locking: %w", path, err)
	}
	defer func() {
		lk.Type = unix.F_UNLCK
		_ = unix.FcntlFlock(file.Fd(), unix.F_OFD_SETLK, &lk)
	}()
	buf := make([]byte, FileSize)
	if _, err := io.ReadFull(file, buf); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	g, err := parseHeader(path, buf)
	if err != nil {
		return err
	}
	if !g.Partitioning {
		return ErrNotSupported
	}
	t := &table{buf: buf[limitsOff:], used: map[uint64]uint64{}}
	le := binary.LittleEndian
	for i := range Slots {
		s := buf[HeaderSize+i*SlotSize : HeaderSize+(i+1)*SlotSize]
		if le.Uint32(s[slotNSPID:]) == 0 {
			continue
		}
		if live, err := slotLive(file, i); err != nil || !live {
			continue
		}
		t.used[le.Uint64(s[slotCgroup:])] += le.Uint64(s[slotUsed:])
	}
	if err := f(g, t); err != nil {
		return err
	}
	if !write {
		return nil
	}
	_, err = file.WriteAt(t.buf, limitsOff)
	return err
}
