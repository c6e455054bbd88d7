package limiterstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Errors returned by Parse and ReadFile.
var (
	ErrShort   = errors.New("limiterstate: file shorter than the layout")
	ErrMagic   = errors.New("limiterstate: not a limiter state file (bad magic)")
	ErrVersion = errors.New("limiterstate: unsupported layout version")
	ErrLayout  = errors.New("limiterstate: layout sizes do not match")
	ErrNotInit = errors.New("limiterstate: file not initialised")
	ErrTorn    = errors.New("limiterstate: writer active, snapshot torn")
)

// Device is the accounting of one GPU: the limiter's device index, which is
// the CUDA device ordinal when the limits come from the environment, and the
// limits file's device.<i> (matched by UUID) when they come from the file
// (internal/limiterconf).
type Device struct {
	Index   int
	Limit   uint64 // bytes; 0 = no memory limit
	Used    uint64 // bytes charged by all live processes
	SMLimit uint32 // percent; 0 = no compute limit

	// Counters (version 4; zero and meaningless when the snapshot's
	// HasCounters is false). Monotone while the file exists: what exited
	// processes counted stays.
	ThrottledNs        uint64 // nanoseconds launches were held back by the compute pacing (summed over waiting launches)
	RefusedAllocations uint64 // allocation calls refused because of the memory limit
}

// Process is one registered process of the container.
type Process struct {
	PID          int32 // in the container's pid namespace
	HostPID      int32 // in the host pid namespace (as NVML reports it); 0 = not resolved yet
	PIDNamespace uint64
	Used         [MaxDevices]uint64
}

// Snapshot is a consistent copy of the shared state.
type Snapshot struct {
	Version uint32
	// HasCounters says the Devices' counters are recorded (version 4). A
	// version-3 file has none: they are absent, not zero.
	HasCounters        bool
	Seq                uint64
	Devices            [MaxDevices]Device
	Processes          []Process // live slots only
	ReclaimedProcesses uint64    // dead processes whose usage was reclaimed
}

var le = binary.LittleEndian

// Parse decodes a copy of the whole file (version 3 or 4). It fails with
// ErrTorn if the copy was taken while a writer was mid-update (odd sequence
// number).
func Parse(b []byte) (*Snapshot, error) {
	if len(b) < StateSizeV3 {
		return nil, ErrShort
	}
	if le.Uint64(b[OffMagic:]) != Magic {
		return nil, ErrMagic
	}
	v := le.Uint32(b[OffVersion:])
	switch {
	case v == VersionV3:
	case v == Version && len(b) < StateSize:
		return nil, ErrShort
	case v != Version:
		return nil, fmt.Errorf("%w: %d", ErrVersion, v)
	}
	if le.Uint32(b[OffHeaderSize:]) != HeaderSize || le.Uint32(b[OffSlotSize:]) != SlotSize ||
		le.Uint32(b[OffMaxDevices:]) != MaxDevices || le.Uint32(b[OffMaxProcs:]) != MaxProcs {
		return nil, ErrLayout
	}
	if le.Uint32(b[OffInitState:]) != InitReady {
		return nil, ErrNotInit
	}
	s := &Snapshot{Version: v, HasCounters: v == Version, Seq: le.Uint64(b[OffSeq:])}
	if s.Seq%2 == 1 {
		return nil, ErrTorn
	}
	for d := 0; d < MaxDevices; d++ {
		s.Devices[d] = Device{
			Index:   d,
			Limit:   le.Uint64(b[OffLimit+8*d:]),
			Used:    le.Uint64(b[OffTotalUsed+8*d:]),
			SMLimit: le.Uint32(b[OffSMLimit+4*d:]),
		}
		if s.HasCounters {
			s.Devices[d].ThrottledNs = le.Uint64(b[OffCounters+CountersOffThrottledNs+8*d:])
			s.Devices[d].RefusedAllocations = le.Uint64(b[OffCounters+CountersOffRefused+8*d:])
		}
	}
	s.ReclaimedProcesses = le.Uint64(b[OffReclaimed:])
	for i := 0; i < MaxProcs; i++ {
		o := OffSlots + i*SlotSize
		pid := int32(le.Uint32(b[o+SlotOffPID:]))
		if pid == 0 {
			continue
		}
		p := Process{PID: pid, HostPID: int32(le.Uint32(b[o+SlotOffHostPID:])), PIDNamespace: le.Uint64(b[o+SlotOffPIDNS:])}
		for d := 0; d < MaxDevices; d++ {
			p.Used[d] = le.Uint64(b[o+SlotOffUsed+8*d:])
		}
		s.Processes = append(s.Processes, p)
	}
	return s, nil
}

// ReadFile reads a consistent snapshot of the state file at path (version 3
// or 4), retrying while writers are active (sequence number odd or changed
// during the read). The counters are not covered by the sequence number
// (each is monotone on its own, added to without the lock).
// It never takes the writers' lock, so a stuck reader cannot block a GPU
// allocation. The file lives in a directory the container may write: a
// symbolic link is not followed, and anything but a regular file (a FIFO
// would block the reader) is refused.
func ReadFile(path string) (*Snapshot, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type())
	}
	buf := make([]byte, StateSize)
	var seq [8]byte
	var lastErr error
	for attempt := 0; attempt < 100; attempt++ {
		n, err := f.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		s, err := Parse(buf[:n]) // a version-3 file ends before the counters
		if err != nil {
			if errors.Is(err, ErrTorn) {
				lastErr = err
				continue
			}
			return nil, err
		}
		if _, err := f.ReadAt(seq[:], OffSeq); err != nil {
			return nil, err
		}
		if le.Uint64(seq[:]) == s.Seq {
			return s, nil
		}
		lastErr = ErrTorn
	}
	return nil, lastErr
}
