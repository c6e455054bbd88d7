package limiterstate

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// buildDump compiles limiter/test/layout_dump.c with the limiter's own
// tl_state.c/h, so the numbers come from the C compiler, not from us.
func buildDump(t *testing.T) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("gcc is required for the layout test: %v", err)
	}
	root := filepath.Join("..", "..", "limiter")
	bin := filepath.Join(t.TempDir(), "layout_dump")
	cmd := exec.Command(gcc, "-O2", "-Wall", "-Werror", "-o", bin,
		filepath.Join(root, "test", "layout_dump.c"), filepath.Join(root, "src", "tl_state.c"), "-lpthread")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("compiling layout_dump: %v\n%s", err, out)
	}
	return bin
}

func TestLayoutMatchesC(t *testing.T) {
	out, err := exec.Command(buildDump(t)).Output()
	if err != nil {
		t.Fatalf("layout_dump: %v", err)
	}
	got := map[string][2]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			t.Fatalf("bad line %q", sc.Text())
		}
		a, err1 := strconv.ParseUint(f[1], 10, 64)
		b, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		got[f[0]] = [2]uint64{a, b}
	}
	want := map[string]uint64{
		"magic": Magic, "version": uint64(Version), "max_devices": MaxDevices, "max_procs": MaxProcs,
		"sizeof.state": StateSize, "sizeof.slot": SlotSize, "sizeof.state_v3": StateSizeV3,
		"version_v3": uint64(VersionV3), "slot_lock_base": SlotLockBase,
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("C did not print %s", name)
		} else if g[0] != w {
			t.Errorf("%s: C has %d, Go has %d", name, g[0], w)
		}
	}
	seen := 0
	for _, f := range Fields {
		g, ok := got[f.Name]
		if !ok {
			t.Errorf("C did not print field %s", f.Name)
			continue
		}
		seen++
		if int(g[0]) != f.Offset || int(g[1]) != f.Size {
			t.Errorf("%s: C offset %d size %d, Go offset %d size %d", f.Name, g[0], g[1], f.Offset, f.Size)
		}
	}
	// every field the C side printed must be known to Go
	for name := range got {
		if strings.HasPrefix(name, "state.") || strings.HasPrefix(name, "slot.") || strings.HasPrefix(name, "counters.") {
			found := false
			for _, f := range Fields {
				found = found || f.Name == name
			}
			if !found {
				t.Errorf("C field %s has no Go counterpart", name)
			}
		}
	}
	if seen != len(Fields) {
		t.Errorf("checked %d of %d fields", seen, len(Fields))
	}
	// the fields tile the header without overlap
	end := 0
	for _, f := range Fields {
		if !strings.HasPrefix(f.Name, "state.") {
			continue
		}
		if f.Offset < end {
			t.Errorf("%s overlaps the previous field", f.Name)
		}
		end = f.Offset + f.Size
	}
	if end != StateSize {
		t.Errorf("fields end at %d, state size %d", end, StateSize)
	}
	// the counters tile their block; version 3's layout is what precedes them
	end = 0
	for _, f := range Fields {
		if strings.HasPrefix(f.Name, "counters.") {
			if f.Offset != end {
				t.Errorf("%s at %d, want %d", f.Name, f.Offset, end)
			}
			end = f.Offset + f.Size
		}
	}
	if end != CountersSize || OffCounters != StateSizeV3 {
		t.Errorf("counters end at %d (want %d), begin at %d (want %d)", end, CountersSize, OffCounters, StateSizeV3)
	}
}

func TestReadFileWrittenByC(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	out, err := exec.Command(buildDump(t), "write", path).Output()
	if err != nil {
		t.Fatalf("layout_dump write: %v (%s)", err, out)
	}
	var pid, slot int
	if _, err := parseWriteOutput(string(out), &pid, &slot); err != nil {
		t.Fatalf("parse %q: %v", out, err)
	}
	s, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d0, d1 := s.Devices[0], s.Devices[1]
	if d0.Limit != 1000 || d0.Used != 600 || d0.SMLimit != 30 {
		t.Errorf("device 0 = %+v, want limit 1000 used 600 sm 30", d0)
	}
	if d1.Limit != 2000 || d1.Used != 1500 || d1.SMLimit != 0 {
		t.Errorf("device 1 = %+v, want limit 2000 used 1500 sm 0", d1)
	}
	if len(s.Processes) != 1 {
		t.Fatalf("processes = %+v, want 1", s.Processes)
	}
	p := s.Processes[0]
	if int(p.PID) != pid || p.Used[0] != 600 || p.Used[1] != 1500 {
		t.Errorf("process = %+v, want pid %d used 600/1500", p, pid)
	}
	if s.Seq == 0 || s.Seq%2 != 0 {
		t.Errorf("seq = %d, want even and non-zero", s.Seq)
	}
	if s.Version != 4 || !s.HasCounters {
		t.Errorf("version %d, counters %v: want 4 with counters", s.Version, s.HasCounters)
	}
	if d0.RefusedAllocations != 2 || d0.ThrottledNs != 0 || d1.RefusedAllocations != 1 || d1.ThrottledNs != 2500000000 {
		t.Errorf("counters: device 0 %+v, device 1 %+v; want refused 2/1, throttled 0/2.5 s", d0, d1)
	}
}

// A version-3 file (what a limiter of the previous release writes): read,
// with the counters absent rather than zero.
func TestReadFileVersion3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	out, err := exec.Command(buildDump(t), "write3", path).Output()
	if err != nil {
		t.Fatalf("layout_dump write3: %v (%s)", err, out)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != StateSizeV3 {
		t.Fatalf("version-3 file: %v, size %v, want %d", err, fi, StateSizeV3)
	}
	s, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != 3 || s.HasCounters {
		t.Errorf("version %d, counters %v: want 3 without counters", s.Version, s.HasCounters)
	}
	if d := s.Devices[0]; d.Limit != 1000 || d.Used != 600 || d.SMLimit != 30 || d.RefusedAllocations != 0 {
		t.Errorf("device 0 = %+v", d)
	}
	if len(s.Processes) != 1 {
		t.Errorf("processes = %+v, want 1", s.Processes)
	}
}

func parseWriteOutput(s string, pid, slot *int) (int, error) {
	f := strings.Fields(s)
	if len(f) != 4 || f[0] != "pid" || f[2] != "slot" {
		return 0, errors.New("unexpected output")
	}
	var err error
	if *pid, err = strconv.Atoi(f[1]); err != nil {
		return 0, err
	}
	if *slot, err = strconv.Atoi(f[3]); err != nil {
		return 1, err
	}
	return 2, nil
}

func validBuf() []byte {
	b := make([]byte, StateSize)
	le.PutUint64(b[OffMagic:], Magic)
	le.PutUint32(b[OffVersion:], Version)
	le.PutUint32(b[OffHeaderSize:], HeaderSize)
	le.PutUint32(b[OffSlotSize:], SlotSize)
	le.PutUint32(b[OffMaxDevices:], MaxDevices)
	le.PutUint32(b[OffMaxProcs:], MaxProcs)
	le.PutUint32(b[OffInitState:], InitReady)
	le.PutUint64(b[OffSeq:], 4)
	return b
}

func TestParseRejects(t *testing.T) {
	cases := []struct {
		name string
		mod  func([]byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:100] }, ErrShort},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, ErrMagic},
		{"version", func(b []byte) []byte { le.PutUint32(b[OffVersion:], Version+1); return b }, ErrVersion},
		{"version 2", func(b []byte) []byte { le.PutUint32(b[OffVersion:], 2); return b }, ErrVersion},
		{"version 4 cut before its counters", func(b []byte) []byte { return b[:StateSizeV3] }, ErrShort},
		{"version 3 cut short", func(b []byte) []byte {
			le.PutUint32(b[OffVersion:], VersionV3)
			return b[:StateSizeV3-1]
		}, ErrShort},
		{"slot size", func(b []byte) []byte { le.PutUint32(b[OffSlotSize:], 8); return b }, ErrLayout},
		{"not ready", func(b []byte) []byte { le.PutUint32(b[OffInitState:], 1); return b }, ErrNotInit},
		{"torn", func(b []byte) []byte { le.PutUint64(b[OffSeq:], 7); return b }, ErrTorn},
	}
	for _, c := range cases {
		if _, err := Parse(c.mod(validBuf())); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := Parse(validBuf()); err != nil {
		t.Errorf("valid buffer: %v", err)
	}
	v3 := validBuf()[:StateSizeV3]
	le.PutUint32(v3[OffVersion:], VersionV3)
	if s, err := Parse(v3); err != nil || s.HasCounters || s.Version != VersionV3 {
		t.Errorf("version-3 buffer: %+v, %v", s, err)
	}
}

func TestParseSlots(t *testing.T) {
	b := validBuf()
	le.PutUint64(b[OffLimit+8*2:], 4<<30)
	le.PutUint64(b[OffTotalUsed+8*2:], 3<<30)
	for i, pid := range []int32{0, 42, 0, 77} {
		o := OffSlots + (i*300)*SlotSize
		le.PutUint32(b[o+SlotOffPID:], uint32(pid))
		le.PutUint32(b[o+SlotOffHostPID:], uint32(pid)+100000)
		le.PutUint64(b[o+SlotOffUsed+8*2:], uint64(i)<<30)
	}
	s, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if s.Devices[2].Limit != 4<<30 || s.Devices[2].Used != 3<<30 {
		t.Errorf("device 2 = %+v", s.Devices[2])
	}
	if len(s.Processes) != 2 || s.Processes[0].PID != 42 || s.Processes[1].PID != 77 ||
		s.Processes[0].Used[2] != 1<<30 || s.Processes[1].Used[2] != 3<<30 ||
		s.Processes[0].HostPID != 100042 || s.Processes[1].HostPID != 100077 {
		t.Errorf("processes = %+v", s.Processes)
	}
}

func TestReadFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("tiny"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(short); !errors.Is(err, ErrShort) {
		t.Errorf("short file: %v", err)
	}
	torn := filepath.Join(dir, "torn")
	b := validBuf()
	le.PutUint64(b[OffSeq:], 9)
	if err := os.WriteFile(torn, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(torn); !errors.Is(err, ErrTorn) {
		t.Errorf("permanently torn file: %v", err)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	in := &Snapshot{Version: Version, HasCounters: true, Seq: 4, ReclaimedProcesses: 3}
	in.Devices[0] = Device{Index: 0, Limit: 10 << 30, Used: 3 << 30, SMLimit: 30, ThrottledNs: 7e9, RefusedAllocations: 5}
	in.Devices[1] = Device{Index: 1, Limit: 5 << 30}
	for d := 2; d < MaxDevices; d++ {
		in.Devices[d].Index = d
	}
	p := Process{PID: 7, HostPID: 4242, PIDNamespace: 99}
	p.Used[0] = 3 << 30
	in.Processes = []Process{p}
	out, err := Parse(Encode(in))
	if err != nil {
		t.Fatal(err)
	}
	if out.Seq != in.Seq || out.Devices != in.Devices || out.ReclaimedProcesses != 3 || len(out.Processes) != 1 ||
		out.Processes[0] != p || !out.HasCounters || out.Version != Version {
		t.Errorf("round trip: got %+v, want %+v", out, in)
	}
	// as version 3: no counters, the rest the same
	in.Version = VersionV3
	b := Encode(in)
	out, err = Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != StateSizeV3 || out.HasCounters || out.Devices[0].RefusedAllocations != 0 || out.Devices[0].Limit != 10<<30 {
		t.Errorf("version-3 round trip: %d bytes, %+v", len(b), out)
	}
}
