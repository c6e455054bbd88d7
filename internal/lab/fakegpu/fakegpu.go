// Package fakegpu is the Go side of the emulated cluster's GPUs: one state
// file per GPU, shared by every process that uses the GPU (through the
// fake CUDA driver and NVML of fakegpu/, mounted into the containers) and
// read by the node's agent (its mock NVML) and by `tessera-lab status`.
//
// The layout is fakegpu/src/fake_common.h's struct fake_state, version 2:
// a 256-byte header (magic "TGPU", version, sizes, the GPU's UUID, model,
// memory and whether its driver partitions memory per cgroup), 256 slots
// of 64 bytes, one per process (its host pid, its cgroup's hash, the
// device memory it holds, the GPU time of the work it enqueued and when
// that work ends), and the driver's table of memory limits per cgroup
// (limits.go). A slot belongs to a live process exactly while an OFD
// write lock is held on its bytes (the process holds it from its first
// context on the GPU until it dies), so liveness holds across PID
// namespaces and needs no cleanup. Processes write their own slot; the lab
// creates the files (Create) and everyone else only reads (Read).
package fakegpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// The layout (fake_common.h).
const (
	Version    = 2
	Magic      = 0x55504754 // "TGPU" little-endian
	HeaderSize = 256
	SlotSize   = 64
	Slots      = 256
	LimitSize  = 512
	Limits     = 64
	limitsOff  = HeaderSize + Slots*SlotSize
	FileSize   = limitsOff + Limits*LimitSize

	offVersion  = 4
	offHdrSize  = 8
	offSlotSize = 12
	offSlots    = 16
	offMemory   = 24
	offSMs      = 32
	offFlags    = 36
	offUUID     = 40
	lenUUID     = 48
	offName     = 88
	lenName     = 96
	offLimSize  = 184
	offLimits   = 188

	flagPartition = 1 // FAKE_FLAG_PARTITION

	slotHostPID = 0
	slotNSPID   = 4
	slotUsed    = 16
	slotBusy    = 24
	slotTail    = 32
	slotStart   = 40
	slotRate    = 48
	slotCgroup  = 56
)

// GPU is what a state file says about its GPU.
type GPU struct {
	UUID        string
	Name        string
	MemoryBytes uint64
	SMs         uint32
	// Partitioning: the GPU's driver partitions its memory per cgroup
	// (nvmlDeviceSetMemoryLimits_v1; limits.go), as NVIDIA's r615 does.
	Partitioning bool
}

// Process is a live process on a GPU.
type Process struct {
	Slot      int
	HostPID   uint32
	UsedBytes uint64
	// BusyNs is the GPU time (run alone) of all the work it enqueued;
	// TailNs when that work ends (CLOCK_MONOTONIC); RatePPM the GPU time
	// per nanosecond of its last work, in millionths.
	BusyNs, TailNs, StartNs uint64
	RatePPM                 uint32
	// Cgroup is the hash of the process's cgroup v2 path (CgroupHash), 0
	// when it has none.
	Cgroup uint64
}

// Done is the GPU time of the process's work done by nowNs: its queued
// work runs without a gap until its tail.
func (p Process) Done(nowNs uint64) uint64 {
	if p.TailNs <= nowNs {
		return p.BusyNs
	}
	left := uint64(float64(p.TailNs-nowNs) * rateOf(p) / 1e6)
	if left >= p.BusyNs {
		return 0
	}
	return p.BusyNs - left
}

func rateOf(p Process) float64 {
	if p.RatePPM == 0 {
		return 1e6
	}
	return float64(p.RatePPM)
}

// Create writes an empty state file for g at path, or keeps the file that
// is there when it already is one, of this version, for this GPU (the
// processes that hold slots in it keep them).
func Create(path string, g GPU) error {
	if len(g.UUID) >= lenUUID || len(g.Name) >= lenName {
		return fmt.Errorf("GPU %q (%q): UUID longer than %d or name longer than %d bytes", g.UUID, g.Name, lenUUID-1, lenName-1)
	}
	if cur, err := readHeader(path); err == nil && cur == g {
		return nil
	}
	hdr := make([]byte, HeaderSize)
	le := binary.LittleEndian
	le.PutUint32(hdr, Magic)
	le.PutUint32(hdr[offVersion:], Version)
	le.PutUint32(hdr[offHdrSize:], HeaderSize)
	le.PutUint32(hdr[offSlotSize:], SlotSize)
	le.PutUint32(hdr[offSlots:], Slots)
	le.PutUint64(hdr[offMemory:], g.MemoryBytes)
	le.PutUint32(hdr[offSMs:], g.SMs)
	if g.Partitioning {
		le.PutUint32(hdr[offFlags:], flagPartition)
	}
	le.PutUint32(hdr[offLimSize:], LimitSize)
	le.PutUint32(hdr[offLimits:], Limits)
	copy(hdr[offUUID:offUUID+lenUUID], g.UUID)
	copy(hdr[offName:offName+lenName], g.Name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o666)
	if err != nil {
		return err
	}
	_, err = f.Write(hdr)
	if err == nil {
		err = f.Truncate(FileSize)
	}
	if err == nil {
		// Processes of every container and user write their slot.
		err = f.Chmod(0o666)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// readHeader reads and checks a state file's header.
func readHeader(path string) (GPU, error) {
	f, err := os.Open(path)
	if err != nil {
		return GPU{}, err
	}
	defer f.Close()
	hdr := make([]byte, HeaderSize)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return GPU{}, fmt.Errorf("%s: header: %w", path, err)
	}
	return parseHeader(path, hdr)
}

func parseHeader(path string, hdr []byte) (GPU, error) {
	le := binary.LittleEndian
	if m, v := le.Uint32(hdr), le.Uint32(hdr[offVersion:]); m != Magic || v != Version {
		return GPU{}, fmt.Errorf("%s: not a GPU state file of layout version %d (magic %#x, version %d)", path, Version, m, v)
	}
	if hs, ss, n := le.Uint32(hdr[offHdrSize:]), le.Uint32(hdr[offSlotSize:]), le.Uint32(hdr[offSlots:]); hs != HeaderSize || ss != SlotSize || n != Slots {
		return GPU{}, fmt.Errorf("%s: header %d, slots %d x %d bytes; want %d, %d x %d", path, hs, n, ss, HeaderSize, Slots, SlotSize)
	}
	if ls, n := le.Uint32(hdr[offLimSize:]), le.Uint32(hdr[offLimits:]); ls != LimitSize || n != Limits {
		return GPU{}, fmt.Errorf("%s: limits %d x %d bytes; want %d x %d", path, n, ls, Limits, LimitSize)
	}
	return GPU{
		UUID:         cstring(hdr[offUUID : offUUID+lenUUID]),
		Name:         cstring(hdr[offName : offName+lenName]),
		MemoryBytes:  le.Uint64(hdr[offMemory:]),
		SMs:          le.Uint32(hdr[offSMs:]),
		Partitioning: le.Uint32(hdr[offFlags:])&flagPartition != 0,
	}, nil
}

func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// Read returns a state file's GPU and its live processes.
func Read(path string) (GPU, []Process, error) {
	f, err := os.Open(path)
	if err != nil {
		return GPU{}, nil, err
	}
	defer f.Close()
	buf := make([]byte, FileSize)
	if _, err := io.ReadFull(f, buf); err != nil {
		return GPU{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	g, err := parseHeader(path, buf)
	if err != nil {
		return GPU{}, nil, err
	}
	le := binary.LittleEndian
	var procs []Process
	for i := range Slots {
		s := buf[HeaderSize+i*SlotSize : HeaderSize+(i+1)*SlotSize]
		if le.Uint32(s[slotNSPID:]) == 0 {
			continue // never taken
		}
		live, err := slotLive(f, i)
		if err != nil {
			return GPU{}, nil, fmt.Errorf("%s: slot %d: %w", path, i, err)
		}
		if !live {
			continue
		}
		procs = append(procs, Process{
			Slot: i, HostPID: le.Uint32(s[slotHostPID:]), UsedBytes: le.Uint64(s[slotUsed:]),
			BusyNs: le.Uint64(s[slotBusy:]), TailNs: le.Uint64(s[slotTail:]), StartNs: le.Uint64(s[slotStart:]),
			RatePPM: le.Uint32(s[slotRate:]), Cgroup: le.Uint64(s[slotCgroup:]),
		})
	}
	return g, procs, nil
}

// slotLive reports whether a process holds slot i's lock.
func slotLive(f *os.File, i int) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(HeaderSize + i*SlotSize), Len: SlotSize}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

// MonotonicNs is CLOCK_MONOTONIC, the clock of TailNs and StartNs.
func MonotonicNs() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// Sampler turns the GPU time the processes publish into utilisation
// between one call and the next, as NVML samples it.
type Sampler struct {
	mu   sync.Mutex
	seen map[sampleKey]sample
}

type sampleKey struct {
	path          string
	slot          int
	start, hostID uint64
}

type sample struct {
	done, at uint64
	util     uint32
}

// Utilization returns each process's SM utilisation (percent, by host
// pid) since the previous call for the same file, and the GPU's (their
// sum, at most 100).
func (s *Sampler) Utilization(path string, procs []Process, nowNs uint64) (gpu uint32, per map[uint32]uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[sampleKey]sample{}
	}
	per = map[uint32]uint32{}
	now := map[sampleKey]bool{}
	for _, p := range procs {
		k := sampleKey{path: path, slot: p.Slot, start: p.StartNs, hostID: uint64(p.HostPID)}
		now[k] = true
		done := p.Done(nowNs)
		prev, ok := s.seen[k]
		switch {
		case !ok: // new to us: busy now or not
			prev = sample{done: done, at: nowNs}
			if p.TailNs > nowNs {
				prev.util = uint32(min(100, rateOf(p)/1e4))
			}
		case nowNs-prev.at > 20e6:
			u := 100 * float64(done-prev.done) / float64(nowNs-prev.at)
			prev = sample{done: done, at: nowNs, util: uint32(min(u+0.5, 100))}
		}
		s.seen[k] = prev
		per[p.HostPID] += prev.util
		gpu += prev.util
	}
	for k := range s.seen {
		if k.path == path && !now[k] {
			delete(s.seen, k) // gone
		}
	}
	return min(gpu, 100), per
}
