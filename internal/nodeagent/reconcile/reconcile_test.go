package reconcile

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/limiterstate"
	"github.com/tessera-gpu/tessera/internal/nodeagent/claimuse"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestParseCgroup(t *testing.T) {
	id := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		content string
		uid     types.UID
		ok      bool
	}{
		// cgroup v2, systemd driver, containerd
		{"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1d0c2e_3b7a_4c55_9a0e_2f8b1d7c9e01.slice/cri-containerd-" + id + ".scope\n", "6f1d0c2e-3b7a-4c55-9a0e-2f8b1d7c9e01", true},
		// cgroup v1, cgroupfs driver
		{"12:memory:/kubepods/besteffort/pod6f1d0c2e-3b7a-4c55-9a0e-2f8b1d7c9e01/" + id + "\n11:cpu:/\n", "6f1d0c2e-3b7a-4c55-9a0e-2f8b1d7c9e01", true},
		// CRI-O
		{"0::/kubepods.slice/kubepods-pod6f1d0c2e_3b7a_4c55_9a0e_2f8b1d7c9e01.slice/crio-" + id + ".scope", "6f1d0c2e-3b7a-4c55-9a0e-2f8b1d7c9e01", true},
		// the pod's sandbox-level cgroup, a host process
		{"0::/kubepods.slice/kubepods-pod6f1d0c2e_3b7a_4c55_9a0e_2f8b1d7c9e01.slice\n", "", false},
		{"0::/system.slice/tessera.service\n", "", false},
	} {
		uid, cid, ok := ParseCgroup(tc.content)
		if ok != tc.ok || uid != tc.uid || ok && cid != id {
			t.Errorf("%q: %s %s %v", tc.content, uid, cid, ok)
		}
	}
}

// world is a node: GPUs whose processes the test sets, a fake /proc, the
// ledger and the pods.
type world struct {
	t      *testing.T
	proc   string
	state  statedir.Dirs
	pods   []*v1.Pod
	mu     sync.Mutex
	procs  map[string][]nvml.ProcessInfo // GPU → processes
	killed []int
	gpus   []GPU
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, proc: t.TempDir(), state: statedir.Dirs{Root: t.TempDir()}, procs: map[string][]nvml.ProcessInfo{}}
	for i := 0; i < 2; i++ {
		uuid := fixtures.GPUUUID("n", i)
		w.gpus = append(w.gpus, GPU{UUID: uuid, MemoryMiB: 40960, Handle: &mock.Device{
			GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
				w.mu.Lock()
				defer w.mu.Unlock()
				return slices.Clone(w.procs[uuid]), nvml.SUCCESS
			},
			GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
		}})
	}
	return w
}

func cid(n int) string { return fmt.Sprintf("%064x", n) }

// container adds a pod with one container (container ID n), its grant in
// the ledger (nil: none) and its process pids in /proc.
func (w *world) container(ns, name string, n int, grant []api.DeviceGrant, pids ...int) *v1.Pod {
	uid := fmt.Sprintf("00000000-0000-0000-0000-%012d", n)
	p := fixtures.MakePod().Namespace(ns).Name(name).UID(uid).Node("n").Obj()
	p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + cid(n)}}
	w.pods = append(w.pods, p)
	if grant != nil {
		if _, err := w.state.Create(p.UID, "main"); err != nil {
			w.t.Fatal(err)
		}
		if err := w.state.WriteGrant(statedir.Grant{PodUID: p.UID, Namespace: ns, Pod: name, Container: "main", Devices: grant}); err != nil {
			w.t.Fatal(err)
		}
	}
	for _, pid := range pids {
		dir := filepath.Join(w.proc, fmt.Sprint(pid))
		_ = os.MkdirAll(dir, 0o755)
		cg := fmt.Sprintf("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope\n", strings.ReplaceAll(uid, "-", "_"), cid(n))
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			w.t.Fatal(err)
		}
	}
	return p
}

func (w *world) uses(gpu int, pid int, mib uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	u := w.gpus[gpu].UUID
	w.procs[u] = append(w.procs[u], nvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: mib << 20})
}

func (w *world) reconciler(kill bool) *Reconciler {
	r := New(Options{ProcRoot: w.proc, Kill: kill, Exempt: func(ns string) bool { return ns == "monitoring" }}, w.gpus, w.state,
		func() []*v1.Pod { return w.pods }, ktesting.NewLogger(w.t, ktesting.NewConfig()))
	r.kill = func(pid int) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.killed = append(w.killed, pid)
		return nil
	}
	return r
}

// TestBreaches: the limiter was evaded (a static binary, raw ioctls, a
// rewritten state file): what NVML reports from the host is over the
// grant, or on a GPU the container was not granted (NVIDIA_VISIBLE_DEVICES
// widened through envFrom). Each is a breach, reported and killed; what
// stays within its grant is left alone.
func TestBreaches(t *testing.T) {
	w := newWorld(t)
	g0, g1 := w.gpus[0].UUID, w.gpus[1].UUID
	w.container("a", "within", 1, []api.DeviceGrant{{UUID: g0, MemoryMiB: 4096, Cores: 10}}, 101)
	w.uses(0, 101, 4096+60) // within the tolerance
	over := w.container("a", "over", 2, []api.DeviceGrant{{UUID: g0, MemoryMiB: 4096, Cores: 10}}, 201, 202, 203)
	w.uses(0, 201, 3000)
	w.uses(0, 202, 3000) // 6000 MiB on a 4096 MiB grant; pid 203 holds nothing but goes too
	widened := w.container("a", "widened", 3, []api.DeviceGrant{{UUID: g0, MemoryMiB: 40960, Cores: 100, Exclusive: true}}, 301)
	w.uses(0, 301, 40000)
	w.uses(1, 301, 100) // on a GPU it was not granted
	squatter := w.container("b", "cpu-only", 4, nil, 401)
	w.uses(1, 401, 500)
	w.container("monitoring", "dcgm", 5, nil, 501)
	w.uses(1, 501, 10)
	w.uses(1, 999, 2000) // a host process: no pod cgroup

	var reported []Breach
	r := w.reconciler(true)
	r.Report = func(b Breach) { reported = append(reported, b) }
	got := r.Once()
	want := map[string]string{
		over.Name + "/" + g0:     "more than its grant of 4096 MiB",
		widened.Name + "/" + g1:  "which it was not granted",
		squatter.Name + "/" + g1: "which it was not granted",
	}
	if len(got) != len(want) || len(reported) != len(got) {
		t.Fatalf("breaches %v, want %v", got, want)
	}
	for _, b := range got {
		w := want[b.Pod.Name+"/"+b.GPU]
		if w == "" || !strings.Contains(b.String(), w) {
			t.Errorf("unexpected breach %s (%s)", b, b.Pod.Name)
		}
	}
	for _, b := range got {
		if b.Pod.Name == "over" && (b.UsedMiB != 6000 || fmt.Sprint(b.Killed) != "[201 202 203]" || b.Reason() != ReasonOverGrant) {
			t.Errorf("over: %+v", b)
		}
		if b.Pod.Name == "cpu-only" && b.Reason() != ReasonNotGranted {
			t.Errorf("cpu-only: %+v", b)
		}
	}
	if slices.Contains(w.killed, 101) || slices.Contains(w.killed, 501) || slices.Contains(w.killed, 999) {
		t.Errorf("killed %v: a process within its grant, exempt, or not a container's", w.killed)
	}
	// Without Kill, breaches are reported, nothing is killed.
	w.killed = nil
	if got := w.reconciler(false).Once(); len(got) != 3 || len(w.killed) != 0 {
		t.Errorf("report-only: %d breaches, killed %v", len(got), w.killed)
	}
}

// TestExclusiveAndTimeSlicing: a whole GPU, and a node without memory
// limits, breach only on GPUs they were not granted.
func TestExclusiveAndTimeSlicing(t *testing.T) {
	w := newWorld(t)
	g0 := w.gpus[0].UUID
	w.container("a", "shared", 1, []api.DeviceGrant{{UUID: g0, MemoryMiB: 1000, Cores: 10}}, 101)
	w.uses(0, 101, 30000)
	r := w.reconciler(false)
	if len(r.Once()) != 1 {
		t.Fatal("a shared grant over its memory on a shared node is a breach")
	}
	r.opts.Shared = func() bool { return false }
	if got := r.Once(); len(got) != 0 {
		t.Errorf("time-slicing node: %v", got)
	}
}

// limited gives container n of pod p a limits file (the agent wrote one:
// the container was given the limiter) and a limiter state file listing
// procs (nil: no state file).
func (w *world) limited(p *v1.Pod, procs []limiterstate.Process) {
	w.t.Helper()
	if err := w.state.WriteLimits(p.UID, "main", []byte("version=1\n")); err != nil {
		w.t.Fatal(err)
	}
	if procs == nil {
		return
	}
	b := limiterstate.Encode(&limiterstate.Snapshot{Processes: procs})
	if err := os.WriteFile(filepath.Join(w.state.StateDir(p.UID, "main"), statedir.LimiterStateFile), b, 0o666); err != nil {
		w.t.Fatal(err)
	}
}

// nsProc writes what /proc says of a process's own pid namespace.
func (w *world) nsProc(pid, nspid int, ns uint64) {
	w.t.Helper()
	dir := filepath.Join(w.proc, fmt.Sprint(pid))
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(fmt.Sprintf("Name:\tpython\nNSpid:\t%d\t%d\n", pid, nspid)), 0o644); err != nil {
		w.t.Fatal(err)
	}
	_ = os.MkdirAll(filepath.Join(dir, "ns"), 0o755)
	if err := os.Symlink(fmt.Sprintf("pid:[%d]", ns), filepath.Join(dir, "ns", "pid")); err != nil {
		w.t.Fatal(err)
	}
}

// TestProcessesWithoutTheLimiter: GPU memory held by a container's
// process that never registered with the limiter the container was given
// (a static binary talking to the driver, a glibc-compat loader that
// ignores /etc/ld.so.preload, the limiter's state removed between
// processes) went unnoticed while within the grant. Seen in two passes
// running, it is answered as a breach: an event reason of its own, the
// metric's label, and the configured kill. Registered processes (by host
// pid, or by pid and namespace before the limiter learnt its host pid),
// containers without the limiter, exempt namespaces and a state that is
// not the limiter's are left alone.
func TestProcessesWithoutTheLimiter(t *testing.T) {
	w := newWorld(t)
	g0 := w.gpus[0].UUID
	grant := []api.DeviceGrant{{UUID: g0, MemoryMiB: 4096, Cores: 10}}
	reg := w.container("a", "registered", 1, grant, 101, 102)
	w.nsProc(102, 7, 4026532001)
	w.limited(reg, []limiterstate.Process{{PID: 1, HostPID: 101}, {PID: 7, PIDNamespace: 4026532001}})
	w.uses(0, 101, 1000)
	w.uses(0, 102, 1000)
	static := w.container("a", "static", 2, grant, 201, 202)
	w.nsProc(202, 8, 4026532002)
	w.limited(static, []limiterstate.Process{{PID: 1, HostPID: 201}, {PID: 8, PIDNamespace: 4026532999}}) // 202 is pid 8 of another namespace
	w.uses(0, 201, 1000)
	w.uses(0, 202, 1000)
	removed := w.container("a", "removed", 3, grant, 301)
	w.limited(removed, nil) // its state file deleted
	w.uses(0, 301, 2000)
	plain := w.container("a", "no-limiter", 4, []api.DeviceGrant{{UUID: g0, MemoryMiB: 40960, Cores: 100, Exclusive: true}}, 401)
	_ = plain
	w.uses(0, 401, 1000)
	exempt := w.container("monitoring", "exporter", 5, grant, 501)
	w.limited(exempt, nil)
	w.uses(0, 501, 100)
	foreign := w.container("a", "hami", 6, grant, 601)
	w.limited(foreign, []limiterstate.Process{})
	if err := os.WriteFile(filepath.Join(w.state.StateDir(foreign.UID, "main"), statedir.LimiterStateFile), []byte("not the limiter's"), 0o666); err != nil {
		t.Fatal(err)
	}
	w.uses(0, 601, 100)

	var reported []Breach
	r := w.reconciler(true)
	r.Report = func(b Breach) { reported = append(reported, b) }
	if got := r.Once(); len(got) != 0 {
		t.Fatalf("first pass: %v (a process is reported when seen unregistered twice running)", got)
	}
	got := r.Once()
	byPod := map[string]Breach{}
	for _, b := range got {
		byPod[b.Pod.Name] = b
	}
	if len(got) != 2 || len(reported) != 2 {
		t.Fatalf("breaches %v, want the static binary and the removed state", got)
	}
	if b := byPod["static"]; fmt.Sprint(b.PIDs) != "[202]" || b.Reason() != ReasonWithoutLimiter || fmt.Sprint(b.Killed) != "[201 202]" ||
		!strings.Contains(b.String(), "never registered with its GPU limiter") || b.UsedMiB != 2000 || b.GrantedMiB != 4096 {
		t.Errorf("static: %+v %s", b, b)
	}
	if b := byPod["removed"]; fmt.Sprint(b.PIDs) != "[301]" || b.Reason() != ReasonWithoutLimiter {
		t.Errorf("removed: %+v", b)
	}
	for _, pid := range []int{101, 102, 401, 501, 601} {
		if slices.Contains(w.killed, pid) {
			t.Errorf("killed %d", pid)
		}
	}
	// A process that registers before the next pass is left alone; one
	// that was seen once and is gone the next pass was never reported.
	w.limited(static, []limiterstate.Process{{PID: 1, HostPID: 201}, {PID: 2, HostPID: 202}})
	w.limited(removed, []limiterstate.Process{{PID: 1, HostPID: 301}})
	if got := r.Once(); len(got) != 0 {
		t.Errorf("after registering: %v", got)
	}
}

// TestStateFileNotFollowed: the state file is in a directory the
// container writes; a symbolic link in its place (to a FIFO, which would
// block the reader, or to a host file) is not followed.
func TestStateFileNotFollowed(t *testing.T) {
	w := newWorld(t)
	p := w.container("a", "link", 1, []api.DeviceGrant{{UUID: w.gpus[0].UUID, MemoryMiB: 4096, Cores: 10}}, 101)
	w.limited(p, nil)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(w.state.StateDir(p.UID, "main"), statedir.LimiterStateFile)
	if err := os.Symlink(fifo, state); err != nil {
		t.Fatal(err)
	}
	w.uses(0, 101, 100)
	r := w.reconciler(false)
	done := make(chan []Breach, 1)
	go func() { r.Once(); done <- r.Once() }()
	select {
	case got := <-done:
		if len(got) != 0 {
			t.Errorf("%v", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the reconciler blocked on the state file")
	}
	// A FIFO in place of the file: not a regular file, not read either.
	_ = os.Remove(state)
	if err := syscall.Mkfifo(state, 0o666); err != nil {
		t.Fatal(err)
	}
	go func() { done <- r.Once() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the reconciler blocked on a FIFO")
	}
}

// claimPod adds a pod whose container "main" uses the request "gpu" of
// its pod claim "gpu", the ResourceClaim claim (as a DRA pod names it),
// with its processes' pids in /proc.
func (w *world) claimPod(ns, name string, n int, claim string, pids ...int) *v1.Pod {
	p := w.container(ns, name, n, nil, pids...)
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	p.Spec.Containers = []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}
	return p
}

// TestClaimGrants: on a DRA node the device plugin's ledger has no entry;
// the grants are the prepared claims'. A container using a claim is held
// to its request's grant, together with every other container using the
// same request (they share one limiter state); a whole GPU or admin
// access only to its use. Before the reconciler read the claims, every
// DRA container holding GPU memory was "not granted" its GPU, and killed.
func TestClaimGrants(t *testing.T) {
	w := newWorld(t)
	g0, g1 := w.gpus[0].UUID, w.gpus[1].UUID
	stateDir := t.TempDir()
	claims := []claimuse.Claim{
		{Namespace: "a", Name: "share", Requests: []claimuse.Request{{Request: "gpu", StateFile: filepath.Join(stateDir, "cache"),
			Devices: []claimuse.Device{{UUID: g0, MemoryMiB: 4096, Cores: 20}}}}},
		{Namespace: "a", Name: "whole", Requests: []claimuse.Request{{Request: "gpu", Devices: []claimuse.Device{{UUID: g1, Whole: true}}}}},
		{Namespace: "a", Name: "within", Requests: []claimuse.Request{{Request: "gpu", StateFile: filepath.Join(stateDir, "other"),
			Devices: []claimuse.Device{{UUID: g1, MemoryMiB: 8192}}}}},
	}
	one := w.claimPod("a", "one", 1, "share", 101)
	two := w.claimPod("a", "two", 2, "share", 201)
	w.uses(0, 101, 3000)
	w.uses(0, 201, 2000) // each within 4096; together 5000 of the shared 4096
	w.claimPod("a", "whole", 3, "whole", 301)
	w.uses(1, 301, 40000)
	w.claimPod("a", "within", 4, "within", 401)
	w.uses(1, 401, 8000)
	b := limiterstate.Encode(&limiterstate.Snapshot{Processes: []limiterstate.Process{{PID: 1, HostPID: 101}, {PID: 1, HostPID: 201}, {PID: 1, HostPID: 401}}})
	for _, f := range []string{"cache", "other"} {
		if err := os.WriteFile(filepath.Join(stateDir, f), b, 0o666); err != nil {
			t.Fatal(err)
		}
	}

	// Without the claims: every one of them is a container on a GPU it
	// was not granted.
	if got := w.reconciler(false).Once(); len(got) != 4 {
		t.Fatalf("without the claims: %v, want the 4 DRA containers not granted their GPUs", got)
	}
	r := w.reconciler(true)
	r.opts.Claims = func() []claimuse.Claim { return claims }
	got := r.Once()
	if again := r.Once(); len(again) != len(got) { // the second pass would report processes without the limiter
		t.Errorf("second pass: %v", again)
	}
	if len(got) != 2 {
		t.Fatalf("breaches %v, want the two containers sharing claim a/share", got)
	}
	for _, b := range got {
		if b.Claim != "a/share/gpu" || b.UsedMiB != 5000 || b.GrantedMiB != 4096 || b.Reason() != ReasonOverGrant ||
			!strings.Contains(b.String(), "the containers using DRA claim request a/share/gpu") || (b.Pod != one && b.Pod != two) {
			t.Errorf("breach %+v: %s", b, b)
		}
	}
	if fmt.Sprint(w.killed[:2]) != "[101 201]" {
		t.Errorf("killed %v, want the claim's containers' processes", w.killed)
	}
}

// TestNothingDoneBeforeGrantsKnown: a restarted agent's reconciler runs
// before its DRA driver has read back the claims it prepared. Until the
// agent knows every grant (Options.Known), a pass acts on nothing: the
// DRA containers, whose claims it has not listed yet, keep running. Once
// it knows them, they are held to their claims' grants and a container
// on a GPU it was not granted is still caught.
func TestNothingDoneBeforeGrantsKnown(t *testing.T) {
	w := newWorld(t)
	g0 := w.gpus[0].UUID
	claims := []claimuse.Claim{{Namespace: "a", Name: "share", Requests: []claimuse.Request{{Request: "gpu",
		Devices: []claimuse.Device{{UUID: g0, MemoryMiB: 10240, Cores: 10}}}}}}
	w.claimPod("a", "r0", 1, "share", 101)
	w.uses(0, 101, 8192)
	stray := w.container("a", "stray", 2, nil, 201)
	w.uses(0, 201, 1024)
	var mu sync.Mutex
	known, listed := false, []claimuse.Claim(nil)
	r := w.reconciler(true)
	r.opts.Known = func() bool { mu.Lock(); defer mu.Unlock(); return known }
	r.opts.Claims = func() []claimuse.Claim { mu.Lock(); defer mu.Unlock(); return listed }
	for range 2 {
		if got := r.Once(); len(got) != 0 || len(w.killed) != 0 {
			t.Fatalf("before the grants are known: breaches %v, killed %v; want nothing done", got, w.killed)
		}
	}
	mu.Lock()
	known, listed = true, claims
	mu.Unlock()
	got := r.Once()
	if len(got) != 1 || got[0].Pod != stray || got[0].Reason() != ReasonNotGranted {
		t.Fatalf("grants known: breaches %v, want only the stray container's use of a GPU it was not granted", got)
	}
	if fmt.Sprint(w.killed) != "[201]" {
		t.Errorf("killed %v, want only the stray container's process", w.killed)
	}
}
