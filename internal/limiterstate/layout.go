// Package limiterstate reads the shared-state file that the Tessera GPU
// limiter (limiter/, a C library preloaded into GPU containers) uses to share
// one memory budget among the processes of a container. The node agent uses it
// for metrics: per-device limits and usage, and per-process usage.
//
// The file layout is defined by limiter/src/tl_state.h. This package mirrors
// it with explicit byte offsets (little-endian, LP64); TestLayoutMatchesC
// compiles a C program against that header and checks every offset and size.
// The package uses the standard library only and no cgo.
package limiterstate

// Layout constants of version 4 of the shared-state file. Version 2 turned the
// reserved slot.flags into slot.host_pid; version 3 kept the layout and
// changed liveness: a live process holds an open-file-description lock on
// byte SlotLockBase+i of the file for its slot i (a process of version 2
// holds none, so the two must not share a file). Version 4 appends per-device
// counters after the slots (every offset of version 3 unchanged, the lock
// bytes too): the time launches were held back by the compute pacing and the
// allocations refused by the memory limit. The reader accepts version 3
// files (Snapshot.HasCounters false) and version 4.
const (
	Magic     uint64 = 0x314D494C53534554 // "TESSLIM1" little-endian
	Version   uint32 = 4
	VersionV3 uint32 = 3

	MaxDevices = 16
	MaxProcs   = 1024

	// InitReady is the value of the init_state field once the file is set up.
	InitReady uint32 = 2

	OffMagic         = 0
	OffVersion       = 8
	OffHeaderSize    = 12
	OffSlotSize      = 16
	OffMaxDevices    = 20
	OffMaxProcs      = 24
	OffInitState     = 28
	OffSeq           = 32
	OffLimit         = 40  // [MaxDevices]uint64, bytes, 0 = unlimited
	OffTotalUsed     = 168 // [MaxDevices]uint64, bytes
	OffSMLimit       = 296 // [MaxDevices]uint32, percent, 0 = unlimited
	OffReclaimed     = 360 // uint64
	OffLastReclaimNs = 368 // uint64, CLOCK_MONOTONIC of the writer's host
	OffLock          = 376 // pthread_mutex_t, padded
	LockSize         = 64
	OffSlots         = 440 // [MaxProcs]slot

	SlotOffPID     = 0  // int32, 0 = free slot
	SlotOffHostPID = 4  // int32, the pid in the host pid namespace (as NVML reports it), 0 = unknown
	SlotOffPIDNS   = 8  // uint64, inode of the pid namespace
	SlotOffUsed    = 16 // [MaxDevices]uint64
	SlotSize       = 144

	HeaderSize = OffSlots
	// StateSizeV3 is the size of a version-3 file, where the counters of
	// version 4 begin; SlotLockBase is the first slot lock byte in both.
	StateSizeV3  = OffSlots + MaxProcs*SlotSize
	SlotLockBase = StateSizeV3

	OffCounters = StateSizeV3
	// CountersOffThrottledNs: [MaxDevices]uint64, nanoseconds launches were held back
	// by the compute pacing, summed over the waiting launches (threads).
	CountersOffThrottledNs = 0
	// CountersOffRefused: [MaxDevices]uint64, allocation calls refused because of
	// the memory limit.
	CountersOffRefused = 8 * MaxDevices
	CountersSize       = 16 * MaxDevices

	StateSize = OffCounters + CountersSize
)

// Field describes one field of the C layout, for the layout test.
type Field struct {
	Name   string // "state.<field>", "slot.<field>" or "counters.<field>", as in tl_state.h
	Offset int
	Size   int
}

// Fields lists every field of tl_state, tl_proc_slot and tl_counters.
var Fields = []Field{
	{"state.magic", OffMagic, 8},
	{"state.version", OffVersion, 4},
	{"state.header_size", OffHeaderSize, 4},
	{"state.slot_size", OffSlotSize, 4},
	{"state.max_devices", OffMaxDevices, 4},
	{"state.max_procs", OffMaxProcs, 4},
	{"state.init_state", OffInitState, 4},
	{"state.seq", OffSeq, 8},
	{"state.limit", OffLimit, 8 * MaxDevices},
	{"state.total_used", OffTotalUsed, 8 * MaxDevices},
	{"state.sm_limit", OffSMLimit, 4 * MaxDevices},
	{"state.reclaimed_procs", OffReclaimed, 8},
	{"state.last_reclaim_ns", OffLastReclaimNs, 8},
	{"state.lock", OffLock, LockSize},
	{"state.slots", OffSlots, MaxProcs * SlotSize},
	{"state.counters", OffCounters, CountersSize},
	{"slot.pid", SlotOffPID, 4},
	{"slot.host_pid", SlotOffHostPID, 4},
	{"slot.pidns", SlotOffPIDNS, 8},
	{"slot.used", SlotOffUsed, 8 * MaxDevices},
	{"counters.throttled_ns", CountersOffThrottledNs, 8 * MaxDevices},
	{"counters.refused_allocs", CountersOffRefused, 8 * MaxDevices},
}
