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
// and sm (percent 0..100; 0 and 100: no compute limit). Keys are unique;
// unknown keys, spaces, control characters and non-ASCII bytes outside
// comments are errors; the file is at most 64 KiB. The C parser is
// limiter/src/tl_config.c; TestParityWithC runs both on the same files.
//
// The package uses the standard library and pkg/api only.
package limiterconf

import (
	"bytes"
	"errors"
	"fmt"
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
	}
	return nil
}

// Encode writes c in the file format, after Validate.
func Encode(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("limiter limits file: %w", err)
	}
	var b bytes.Buffer
	b.WriteString("# written by the Tessera node agent; read-only in the container\n")
	fmt.Fprintf(&b, "version=%d\nstate=%s\n", Version, c.StatePath)
	if c.Elastic {
		b.WriteString("elastic=1\n")
	}
	if c.ContextReserveMiB != nil {
		fmt.Fprintf(&b, "context_reserve=%dm\n", *c.ContextReserveMiB)
	}
	for i, d := range c.Devices {
		fmt.Fprintf(&b, "device.%d.uuid=%s\ndevice.%d.memory=%dm\ndevice.%d.sm=%d\n", i, d.UUID, i, d.MemoryMiB, i,
			d.SMPercent)
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
		have int // bits: 1 uuid, 2 memory, 4 sm
	}
	var devs [MaxDevices]dev
	seenVersion, seenState, seenElastic, seenReserve := false, false, false, false
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
		case strings.HasPrefix(key, "device."):
			idx, field, ok := strings.Cut(key[len("device."):], ".")
			i, err := parseUint(idx, MaxDevices-1)
			if !ok || err != nil {
				return fail(line, "%q: want device.<0..%d>.<uuid|memory|sm>", key, MaxDevices-1)
			}
			bit := map[string]int{"uuid": 1, "memory": 2, "sm": 4}[field]
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
		if i < n && devs[i].have != 7 {
			return fail(0, "device.%d needs uuid, memory and sm", i)
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
	for _, ch := range []byte(p) {
		if ch <= ' ' || ch >= 0x7f {
			return fmt.Errorf("statePath %q: spaces, control characters and non-ASCII bytes are not allowed", p)
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
