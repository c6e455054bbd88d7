// Package limiterconf writes and reads the limits file of Tessera's GPU
// limiter (limiter/, a C library preloaded into GPU containers).
//
// The node agent writes one file per container (device plugin) or per DRA
// claim and mounts it read-only into the container at Path. The limiter reads
// it at load time; when it exists it is authoritative: the limit environment
// variables (CUDA_DEVICE_MEMORY_LIMIT*, CUDA_DEVICE_SM_LIMIT*,
// CUDA_DEVICE_MEMORY_SHARED_CACHE, TESSERA_SM_ELASTIC,
// TESSERA_CONTEXT_RESERVE) are ignored, because a tenant controls its own
// environment but not a read-only mount, and processes started without the
// environment (env -i, sudo, su -) still get the limits. A file that exists
// but cannot be read or parsed makes the limiter refuse every GPU allocation.
// Devices are matched by UUID, to CUDA devices and NVML handles alike.
//
// The format (version 1) is a small line format, strict on both sides:
//
//	# comment lines and empty lines are ignored
//	version=1
//	state=/tessera/state/cache
//	elastic=0
//	context_reserve=256m
//	device.0.uuid=GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8
//	device.0.memory=4096m
//	device.0.sm=30
//
// version=1 is the first setting. state (the shared-state file inside the
// container, absolute) and at least one device are required; elastic (0 or 1,
// default 0) and context_reserve (MiB charged per CUDA context; absent: the
// limiter measures it) are optional. Devices are numbered from 0 without
// gaps, at most 16, each with uuid (GPU- or MIG- and the 8-4-4-4-12 hex
// digits NVML prints), memory (MiB with the suffix m; 0m: no memory limit)
// and sm (percent 0..100; 0 and 100: no compute limit). A device may add
// a ceiling above its memory limit (ceiling, MiB with the suffix m) with
// the node agent's budget file for the GPU (budget, an absolute path); the
// memory limit is then the guarantee, and the limiter lets the container
// allocate past it, up to the ceiling, from what the budget file lends
// (docs/isolation.md, "Guaranteed plus burst"); a file with a ceiling
// names the container in the budget files (borrower, 16 lower-case hex
// digits). reclaim (an absolute path, in the container's writable state
// directory) turns on reclaim on refusal: when the driver refuses an
// allocation within the guarantee, the limiter writes what it needs there
// (the node agent's need file, NeedFile) and retries for up to
// reclaim_wait (milliseconds with the suffix ms, 0ms..60000ms, default
// 2000ms) while the agent stops a container bursting on the GPU.
// Keys are unique;
// unknown keys, spaces, control characters and non-ASCII bytes outside
// comments are errors; the file is at most 64 KiB. The C parser is
// limiter/src/tl_config.c; TestParityWithC runs both on the same files.
//
// The package uses the standard library and pkg/api only.
package limiterconf

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	// Path is where the limiter reads the file; it is compiled into the
	// limiter (TL_CONF_PATH) and no environment variable can move it.
	Path = "/etc/tessera/limiter.conf"
	// Version is the format version Encode writes and Parse reads.
	Version = 1
	// MaxDevices is the most devices one file lists (the limiter's
	// TL_MAX_DEVICES).
	MaxDevices = 16
	// MaxBytes bounds the file.
	MaxBytes = 65536
	// MaxMiB bounds memory and context_reserve (bytes fit in 64 bits).
	MaxMiB   = 1<<44 - 1
	maxValue = 4095 // longest value the limiter reads
	// maxBudgetPath is the longest budget path (the limiter's
	// TL_BUDGET_PATH_MAX - 1) and reclaim path (TL_RECLAIM_PATH_MAX - 1).
	maxBudgetPath = 255
	// MaxReclaimWaitMs bounds reclaim_wait (the limiter's
	// TL_RECLAIM_WAIT_MAX_MS).
	MaxReclaimWaitMs = 60000
)

// Device is the limit on one GPU.
type Device struct {
	// UUID as NVML prints it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
	// (or MIG-…).
	UUID string
	// MemoryMiB is the memory limit; 0 means no memory limit.
	MemoryMiB uint64
	// SMPercent is the compute share; 0 and 100 mean no compute limit.
	SMPercent int
	// CeilingMiB, when not 0, is the most the container may hold on the
	// GPU, above MemoryMiB (its guarantee): what it holds past the
	// guarantee comes from the GPU's budget file (BudgetPath).
	CeilingMiB uint64
	// BudgetPath is the budget file of the GPU inside the container
	// (BudgetDir/<UUID>, read-only); set exactly when CeilingMiB is.
	BudgetPath string
}

// Config is the content of one limits file.
type Config struct {
	// StatePath is the limiter's shared-state file inside the container
	// (writable, shared by the container's processes), e.g.
	// /tessera/state/cache.
	StatePath string
	// Elastic lets a compute-limited container borrow idle GPU time.
	Elastic bool
	// ContextReserveMiB, when set, is charged per CUDA context instead of
	// the measured footprint; 0 turns context charges off.
	ContextReserveMiB *uint64
	// Devices in the order the allocation grants them.
	Devices []Device
	// Borrower names the container in the budget files (BorrowerName);
	// required when a device has a ceiling.
	Borrower string
	// ReclaimPath, when set, is the need file inside the container
	// (writable): where the limiter asks the node agent to reclaim
	// memory borrowed past other guarantees when the driver refuses an
	// allocation within the container's guarantee.
	ReclaimPath string
	// ReclaimWaitMs, when set, is how long the limiter retries such an
	// allocation (nil: the limiter's default, 2000 ms).
	ReclaimWaitMs *uint64
}

// Validate reports the first problem, naming the field, the value and the
// limit.
func (c Config) Validate() error {
	if err := checkState(c.StatePath); err != nil {
		return err
	}
	if c.ContextReserveMiB != nil && *c.ContextReserveMiB > MaxMiB {
		return fmt.Errorf("contextReserveMiB %d exceeds %d", *c.ContextReserveMiB, uint64(MaxMiB))
	}
	if len(c.Devices) == 0 {
		return errors.New("devices: none (a limits file needs at least one)")
	}
	if len(c.Devices) > MaxDevices {
		return fmt.Errorf("devices: %d exceed the limit of %d", len(c.Devices), MaxDevices)
	}
	if c.ReclaimPath != "" {
		if !strings.HasPrefix(c.ReclaimPath, "/") || len(c.ReclaimPath) > maxBudgetPath {
			return fmt.Errorf("reclaimPath %q: want an absolute path of at most %d bytes", c.ReclaimPath, maxBudgetPath)
		}
		if err := checkPathBytes("reclaimPath", c.ReclaimPath); err != nil {
			return err
		}
	}
	if c.ReclaimWaitMs != nil && *c.ReclaimWaitMs > MaxReclaimWaitMs {
		return fmt.Errorf("reclaimWaitMs %d exceeds %d", *c.ReclaimWaitMs, MaxReclaimWaitMs)
	}
	if c.Borrower != "" && !isBorrower(c.Borrower) {
		return fmt.Errorf("borrower %q: want %d lower-case hex digits", c.Borrower, BorrowerLen)
	}
	seen := map[string]int{}
	for i, d := range c.Devices {
		if err := checkUUID(d.UUID); err != nil {
			return fmt.Errorf("devices[%d].uuid %q: %w", i, d.UUID, err)
		}
		u := strings.ToLower(d.UUID[4:])
		if j, dup := seen[u]; dup {
			return fmt.Errorf("devices[%d].uuid %q duplicates devices[%d]", i, d.UUID, j)
		}
		seen[u] = i
		if d.MemoryMiB > MaxMiB {
			return fmt.Errorf("devices[%d].memoryMiB %d exceeds %d", i, d.MemoryMiB, uint64(MaxMiB))
		}
		if d.SMPercent < 0 || d.SMPercent > api.MaxCores {
			return fmt.Errorf("devices[%d].smPercent %d outside [0, %d]", i, d.SMPercent, api.MaxCores)
		}
		if err := checkCeiling(d); err != nil {
			return fmt.Errorf("devices[%d]: %w", i, err)
		}
		if d.CeilingMiB != 0 && c.Borrower == "" {
			return fmt.Errorf("devices[%d].ceilingMiB %d: the file needs a borrower", i, d.CeilingMiB)
		}
	}
	return nil
}

func checkCeiling(d Device) error {
	switch {
	case d.CeilingMiB == 0 && d.BudgetPath == "":
		return nil
	case d.CeilingMiB == 0 || d.BudgetPath == "":
		return fmt.Errorf("ceilingMiB %d and budgetPath %q go together", d.CeilingMiB, d.BudgetPath)
	case d.MemoryMiB == 0 || d.CeilingMiB <= d.MemoryMiB:
		return fmt.Errorf("ceilingMiB %d is not above memoryMiB %d", d.CeilingMiB, d.MemoryMiB)
	case d.CeilingMiB > MaxMiB:
		return fmt.Errorf("ceilingMiB %d exceeds %d", d.CeilingMiB, uint64(MaxMiB))
	case !strings.HasPrefix(d.BudgetPath, "/") || len(d.BudgetPath) > maxBudgetPath:
		return fmt.Errorf("budgetPath %q: want an absolute path of at most %d bytes", d.BudgetPath, maxBudgetPath)
	}
	return checkPathBytes("budgetPath", d.BudgetPath)
}

// BorrowerLen is the length of a borrower's name: hexadecimal digits.
const BorrowerLen = 16

// BorrowerName is the name the agent gives a container (or a DRA claim's
// request) in the budget files: opaque to the other tenants who read them.
func BorrowerName(owner string) string {
	h := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(h[:BorrowerLen/2])
}

func isBorrower(s string) bool {
	if len(s) != BorrowerLen {
		return false
	}
	for _, ch := range s {
		if (ch < '0' || ch > '9') && (ch < 'a' || ch > 'f') {
			return false
		}
	}
	return true
}

// Encode writes c in the file format, after Validate.
func Encode(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("limiter limits file: %w", err)
	}
	var b bytes.Buffer
	b.WriteString("# written by the Tessera node agent; read-only in the container\n")
	fmt.Fprintf(&b, "version=%d\nstate=%s\n", Version, c.StatePath)
	if c.Borrower != "" {
		fmt.Fprintf(&b, "borrower=%s\n", c.Borrower)
	}
	if c.ReclaimPath != "" {
		fmt.Fprintf(&b, "reclaim=%s\n", c.ReclaimPath)
	}
	if c.ReclaimWaitMs != nil {
		fmt.Fprintf(&b, "reclaim_wait=%dms\n", *c.ReclaimWaitMs)
	}
	if c.Elastic {
		b.WriteString("elastic=1\n")
	}
	if c.ContextReserveMiB != nil {
		fmt.Fprintf(&b, "context_reserve=%dm\n", *c.ContextReserveMiB)
	}
	for i, d := range c.Devices {
		fmt.Fprintf(&b, "device.%d.uuid=%s\ndevice.%d.memory=%dm\ndevice.%d.sm=%d\n", i, d.UUID, i, d.MemoryMiB, i,
			d.SMPercent)
		if d.CeilingMiB != 0 {
			fmt.Fprintf(&b, "device.%d.ceiling=%dm\ndevice.%d.budget=%s\n", i, d.CeilingMiB, i, d.BudgetPath)
		}
	}
	return b.Bytes(), nil
}

// ParseError locates a problem in a file.
type ParseError struct {
	Line int // 0: the file as a whole
	Msg  string
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return "limiter limits file: " + e.Msg
	}
	return fmt.Sprintf("limiter limits file line %d: %s", e.Line, e.Msg)
}

// Parse reads a file, accepting exactly what the limiter accepts.
func Parse(b []byte) (Config, error) {
	var c Config
	fail := func(line int, format string, a ...any) (Config, error) {
		return Config{}, &ParseError{Line: line, Msg: fmt.Sprintf(format, a...)}
	}
	if len(b) > MaxBytes {
		return fail(0, "%d bytes exceed the limit of %d", len(b), MaxBytes)
	}
	type dev struct {
		d    Device
		have int // bits: 1 uuid, 2 memory, 4 sm, 8 ceiling, 16 budget
	}
	var devs [MaxDevices]dev
	seenVersion, seenState, seenElastic, seenReserve, seenBorrower := false, false, false, false, false
	seenReclaim, seenReclaimWait := false, false
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	for n, raw := range lines {
		line := n + 1
		if len(raw) == 0 || raw[0] == '#' {
			continue
		}
		for _, ch := range raw {
			if ch <= ' ' || ch >= 0x7f {
				return fail(line, "control character, space or non-ASCII byte")
			}
		}
		key, val, ok := strings.Cut(string(raw), "=")
		if !ok {
			return fail(line, "want key=value")
		}
		if len(val) > maxValue {
			return fail(line, "value longer than %d bytes", maxValue)
		}
		if !seenVersion {
			seenVersion = true
			if key != "version" {
				return fail(line, "the first setting must be version=1")
			}
			if val != "1" {
				return fail(line, "unsupported version %q (this format is version 1)", val)
			}
			continue
		}
		switch {
		case key == "version":
			return fail(line, "version given twice")
		case key == "state":
			if seenState {
				return fail(line, "state given twice")
			}
			seenState = true
			if !strings.HasPrefix(val, "/") {
				return fail(line, "state=%q is not an absolute path", val)
			}
			c.StatePath = val
		case key == "elastic":
			if seenElastic {
				return fail(line, "elastic given twice")
			}
			seenElastic = true
			if val != "0" && val != "1" {
				return fail(line, "elastic=%q: want 0 or 1", val)
			}
			c.Elastic = val == "1"
		case key == "context_reserve":
			if seenReserve {
				return fail(line, "context_reserve given twice")
			}
			seenReserve = true
			mib, err := parseMiB(val)
			if err != nil {
				return fail(line, "context_reserve=%q: want MiB, e.g. 256m", val)
			}
			c.ContextReserveMiB = &mib
		case key == "borrower":
			if seenBorrower {
				return fail(line, "borrower given twice")
			}
			seenBorrower = true
			if !isBorrower(val) {
				return fail(line, "borrower=%q: want %d lower-case hex digits", val, BorrowerLen)
			}
			c.Borrower = val
		case key == "reclaim":
			if seenReclaim {
				return fail(line, "reclaim given twice")
			}
			seenReclaim = true
			if !strings.HasPrefix(val, "/") || len(val) > maxBudgetPath {
				return fail(line, "reclaim=%q: want an absolute path of at most %d bytes", val, maxBudgetPath)
			}
			c.ReclaimPath = val
		case key == "reclaim_wait":
			if seenReclaimWait {
				return fail(line, "reclaim_wait given twice")
			}
			seenReclaimWait = true
			num, ok := strings.CutSuffix(val, "ms")
			ms, err := parseUint(num, MaxReclaimWaitMs)
			if !ok || err != nil {
				return fail(line, "reclaim_wait=%q: want milliseconds from 0ms to %dms, e.g. 2000ms", val, MaxReclaimWaitMs)
			}
			c.ReclaimWaitMs = &ms
		case strings.HasPrefix(key, "device."):
			idx, field, ok := strings.Cut(key[len("device."):], ".")
			i, err := parseUint(idx, MaxDevices-1)
			if !ok || err != nil {
				return fail(line, "%q: want device.<0..%d>.<uuid|memory|sm|ceiling|budget>", key, MaxDevices-1)
			}
			bit := map[string]int{"uuid": 1, "memory": 2, "sm": 4, "ceiling": 8, "budget": 16}[field]
			if bit == 0 {
				return fail(line, "unknown key %q", key)
			}
			d := &devs[i]
			if d.have&bit != 0 {
				return fail(line, "%s given twice", key)
			}
			d.have |= bit
			switch bit {
			case 1:
				if err := checkUUID(val); err != nil {
					return fail(line, "%s=%q is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", key, val)
				}
				d.d.UUID = val[:4] + strings.ToLower(val[4:])
			case 2:
				mib, err := parseMiB(val)
				if err != nil {
					return fail(line, "%s=%q: want MiB, e.g. 4096m (0m: no memory limit)", key, val)
				}
				d.d.MemoryMiB = mib
			case 4:
				sm, err := parseUint(val, api.MaxCores)
				if err != nil {
					return fail(line, "%s=%q: want an integer percentage 0..100", key, val)
				}
				d.d.SMPercent = int(sm)
			case 8:
				mib, err := parseMiB(val)
				if err != nil || mib == 0 {
					return fail(line, "%s=%q: want MiB above the memory limit, e.g. 8192m", key, val)
				}
				d.d.CeilingMiB = mib
			case 16:
				if !strings.HasPrefix(val, "/") || len(val) > maxBudgetPath {
					return fail(line, "%s=%q: want an absolute path of at most %d bytes", key, val, maxBudgetPath)
				}
				d.d.BudgetPath = val
			}
		default:
			return fail(line, "unknown key %q", key)
		}
	}
	if !seenVersion {
		return fail(0, "empty (want version=1 and the devices)")
	}
	n := 0
	for n < MaxDevices && devs[n].have != 0 {
		n++
	}
	for i := range devs {
		if i >= n && devs[i].have != 0 {
			return fail(0, "device.%d given but device.%d is missing (devices are numbered from 0)", i, n)
		}
		if i >= n {
			continue
		}
		d := devs[i]
		switch {
		case d.have&7 != 7:
			return fail(0, "device.%d needs uuid, memory and sm", i)
		case (d.have&8 == 0) != (d.have&16 == 0):
			return fail(0, "device.%d: ceiling and budget go together", i)
		case d.have&8 != 0 && (d.d.MemoryMiB == 0 || d.d.CeilingMiB <= d.d.MemoryMiB):
			return fail(0, "device.%d.ceiling %dm is not above its memory limit %dm", i, d.d.CeilingMiB, d.d.MemoryMiB)
		case d.have&8 != 0 && !seenBorrower:
			return fail(0, "device.%d has a ceiling but the file has no borrower=", i)
		}
	}
	for i := 0; i < n; i++ {
		for j := 0; j < i; j++ {
			if strings.EqualFold(devs[i].d.UUID[4:], devs[j].d.UUID[4:]) {
				return fail(0, "device.%d and device.%d have the same uuid", j, i)
			}
		}
		c.Devices = append(c.Devices, devs[i].d)
	}
	if n == 0 {
		return fail(0, "no device")
	}
	if !seenState {
		return fail(0, "state= (the shared state file) is missing")
	}
	return c, nil
}

// parseUint: decimal, no sign, no leading zero, at most max.
func parseUint(s string, max uint64) (uint64, error) {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, errors.New("not a number")
	}
	for _, ch := range s {
		if ch < '0' || ch > '9' {
			return 0, errors.New("not a number")
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > max {
		return 0, errors.New("out of range")
	}
	return v, nil
}

func parseMiB(s string) (uint64, error) {
	if !strings.HasSuffix(s, "m") {
		return 0, errors.New("no m suffix")
	}
	return parseUint(strings.TrimSuffix(s, "m"), MaxMiB)
}

func checkState(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("statePath %q: want an absolute path", p)
	}
	if len(p) > maxValue {
		return fmt.Errorf("statePath: %d bytes exceed %d", len(p), maxValue)
	}
	return checkPathBytes("statePath", p)
}

func checkPathBytes(field, p string) error {
	for _, ch := range []byte(p) {
		if ch <= ' ' || ch >= 0x7f {
			return fmt.Errorf("%s %q: spaces, control characters and non-ASCII bytes are not allowed", field, p)
		}
	}
	return nil
}

// checkUUID: GPU- or MIG- then 8-4-4-4-12 hexadecimal digits.
func checkUUID(u string) error {
	if len(u) != 40 || (!strings.HasPrefix(u, "GPU-") && !strings.HasPrefix(u, "MIG-")) {
		return errors.New("want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
	}
	for i, ch := range u[4:] {
		dash := i == 8 || i == 13 || i == 18 || i == 23
		hex := (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F')
		if dash != (ch == '-') || (!dash && !hex) {
			return errors.New("want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
		}
	}
	return nil
}

// Burst lets the device allocate past its memory limit (the guarantee)
// up to ceilingMiB, from its GPU's budget file in BudgetDir.
func (d *Device) Burst(ceilingMiB uint64) {
	d.CeilingMiB, d.BudgetPath = ceilingMiB, path.Join(BudgetDir, d.UUID)
}

// BudgetDir is where the node agent mounts its budget files read-only in a
// container with a ceiling: one file per GPU, named by its UUID.
const BudgetDir = "/etc/tessera/burst"

// Budget is the content of one GPU's budget file, which the node agent
// writes on the host and every container with a ceiling on the GPU reads
// (read-only). The limiter lends a container past its guarantee at most
// UnguaranteedMiB minus what the other borrowers hold past theirs.
//
//	version=1
//	unguaranteed=4096m
//	borrower.0123456789abcdef=1024m
type Budget struct {
	// UnguaranteedMiB is the GPU's memory minus the guarantees of every
	// grant on it.
	UnguaranteedMiB uint64
	// Borrowed is what each container (by BorrowerName) held past its
	// guarantee when the agent last looked; containers within their
	// guarantee are not listed.
	Borrowed map[string]uint64
}

// EncodeBudget writes a budget file (borrowers in name order); names that
// are not BorrowerName's are an error.
func EncodeBudget(b Budget) ([]byte, error) {
	names := make([]string, 0, len(b.Borrowed))
	for n, mib := range b.Borrowed {
		if !isBorrower(n) {
			return nil, fmt.Errorf("budget file: borrower %q: want %d lower-case hex digits", n, BorrowerLen)
		}
		if mib > MaxMiB {
			return nil, fmt.Errorf("budget file: borrower %s: %d MiB exceeds %d", n, mib, uint64(MaxMiB))
		}
		names = append(names, n)
	}
	if b.UnguaranteedMiB > MaxMiB {
		return nil, fmt.Errorf("budget file: unguaranteedMiB %d exceeds %d", b.UnguaranteedMiB, uint64(MaxMiB))
	}
	sort.Strings(names)
	var out bytes.Buffer
	out.WriteString("# written by the Tessera node agent: GPU memory no container is guaranteed, and who borrows it\n")
	fmt.Fprintf(&out, "version=1\nunguaranteed=%dm\n", b.UnguaranteedMiB)
	for _, n := range names {
		fmt.Fprintf(&out, "borrower.%s=%dm\n", n, b.Borrowed[n])
	}
	if out.Len() > MaxBudgetBytes {
		return nil, fmt.Errorf("budget file: %d borrowers make %d bytes, more than the limiter reads (%d)", len(names), out.Len(), MaxBudgetBytes)
	}
	return out.Bytes(), nil
}

// MaxBudgetBytes bounds a budget file (the limiter's TL_BUDGET_MAX_BYTES).
const MaxBudgetBytes = 16384
