package reconcile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/limiterstate"
	"github.com/tessera-gpu/tessera/internal/nodeagent/claimuse"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestChooseReclaims: the borrowers furthest above their guarantees go
// first, only as many as make the rest fit in the unguaranteed memory,
// never one within its guarantee.
func TestChooseReclaims(t *testing.T) {
	for _, tc := range []struct {
		name         string
		unguaranteed int64
		bs           []Borrower
		want         []int
	}{
		{"fits: nobody", 8192, []Borrower{{4096, 8192}, {4096, 6144}}, nil},
		{"fits within the slack", 6144, []Borrower{{4096, 8192}, {4096, 6144 + 64}}, nil},
		{"the furthest above first", 4096, []Borrower{{4096, 6144}, {1024, 5120}, {4096, 4096}}, []int{1}},
		{"then the next", 1024, []Borrower{{4096, 6144}, {1024, 5120}, {8192, 1024}}, []int{1, 0}},
		{"within guarantees: never, even over the GPU", 0, []Borrower{{4096, 4096}, {8192, 8000}}, nil},
		{"ties: the first", 2048, []Borrower{{1024, 3072}, {1024, 3072}}, []int{0}},
		{"no memory unguaranteed: every borrower", 0, []Borrower{{1024, 1025 + 64}, {1024, 3072}, {1024, 512}}, []int{1, 0}},
	} {
		if got := ChooseReclaims(tc.unguaranteed, 64, 0, tc.bs); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBurstPass: the budget file a pass writes for a GPU with a
// ceiling grant, and the reclaim when a guarantee comes to the GPU.
func TestBurstPass(t *testing.T) {
	w := newWorld(t)
	g0, g1 := w.gpus[0].UUID, w.gpus[1].UUID // 40960 MiB each
	budgets := t.TempDir()
	var reclaims []Reclaim
	r := New(Options{ProcRoot: w.proc, Kill: true, BudgetDir: budgets}, w.gpus, w.state,
		func() []*v1.Pod { return w.pods }, ktesting.NewLogger(t, ktesting.NewConfig()))
	r.kill = func(pid int) error { w.killed = append(w.killed, pid); return nil }
	r.Reclaimed = func(c Reclaim) { reclaims = append(reclaims, c) }

	// a bursting container: 8 GiB guaranteed, 32 GiB ceiling, holding
	// 24 GiB; a plain one within its 8 GiB; a burster within its
	// guarantee
	big := w.container("a", "big", 1, []api.DeviceGrant{{UUID: g0, MemoryMiB: 8192, CeilingMiB: 32768}}, 101)
	w.uses(0, 101, 24576)
	w.container("a", "plain", 2, []api.DeviceGrant{{UUID: g0, MemoryMiB: 8192}}, 201)
	w.uses(0, 201, 8000)
	small := w.container("a", "small", 3, []api.DeviceGrant{{UUID: g0, MemoryMiB: 4096, CeilingMiB: 8192}}, 301)
	w.uses(0, 301, 4000)
	// a GPU with no ceiling grant gets no budget file
	w.container("a", "other", 4, []api.DeviceGrant{{UUID: g1, MemoryMiB: 8192}}, 401)
	w.uses(1, 401, 1000)

	if b := r.Once(); len(b) != 0 {
		t.Fatalf("a container bursting within its ceiling is no breach: %v", b)
	}
	got, err := os.ReadFile(filepath.Join(budgets, g0))
	if err != nil {
		t.Fatal(err)
	}
	// 40960 - (8192 + 8192 + 4096) = 20480 unguaranteed; big borrows 16384
	want := "version=1\nunguaranteed=20480m\nborrower." + statedir.Borrower(big.UID, "main") + "=16384m\n"
	if !strings.HasSuffix(string(got), want) {
		t.Errorf("budget file of %s:\n%s\nwant it to end with\n%s", g0, got, want)
	}
	if _, err := os.Stat(filepath.Join(budgets, g1)); !os.IsNotExist(err) {
		t.Errorf("budget file of a GPU without ceilings: %v", err)
	}
	if len(reclaims) != 0 || len(w.killed) != 0 {
		t.Fatalf("nothing to reclaim: %v, killed %v", reclaims, w.killed)
	}

	// a 16 GiB guarantee is served on the GPU: 4096 MiB stay
	// unguaranteed, big borrows 16384: big is stopped, small (within its
	// guarantee) and plain are not
	w.container("b", "newcomer", 5, []api.DeviceGrant{{UUID: g0, MemoryMiB: 16384}})
	r.Admitted()
	if len(reclaims) != 1 || reclaims[0].Pod != big || reclaims[0].GPU != g0 || reclaims[0].GuaranteeMiB != 8192 ||
		reclaims[0].UsedMiB != 24576 || reclaims[0].UnguaranteedMiB != 4096 || !slices.Equal(w.killed, []int{101}) {
		t.Fatalf("reclaims %+v, killed %v; want big stopped (pid 101)", reclaims, w.killed)
	}
	if m := reclaims[0].String(); !strings.Contains(m, "GPU "+g0) || !strings.Contains(m, "guarantee of 8192 MiB") ||
		!strings.Contains(m, "held 24576 MiB") {
		t.Errorf("message: %s", m)
	}
	if big.Name == small.Name {
		t.Fatal("fixture")
	}
	// the next pass, big's process still listed (dying): not stopped
	// twice, nobody else stopped
	r.Once()
	if len(reclaims) != 1 {
		t.Errorf("a stopped container is chosen again while its memory comes back: %+v", reclaims[1:])
	}
	// the same container borrowing past its ceiling is a breach
	w.procs[g0] = nil
	w.uses(0, 301, 8192+1024)
	b := r.Once()
	if len(b) != 1 || b[0].Pod != small || b[0].Reason() != ReasonOverGrant {
		t.Errorf("past the ceiling: %v, want small's breach", b)
	}
}

// TestClaimBurst: a DRA claim request with a ceiling, shared by two
// pods, borrows as one (its borrower name, what its containers hold
// together past the one guarantee), is no breach within its ceiling, and
// when a guarantee needs the memory all its containers are stopped.
func TestClaimBurst(t *testing.T) {
	w := newWorld(t)
	g0 := w.gpus[0].UUID // 40960 MiB
	stateDir := t.TempDir()
	budgets := t.TempDir()
	const borrower = "0123456789abcdef"
	claims := []claimuse.Claim{{Namespace: "a", Name: "bursty", Requests: []claimuse.Request{{Request: "gpu", StateFile: filepath.Join(stateDir, "cache"),
		Borrower: borrower, Devices: []claimuse.Device{{UUID: g0, MemoryMiB: 4096, CeilingMiB: 16384}}}}}}
	one := w.claimPod("a", "one", 1, "bursty", 101)
	two := w.claimPod("a", "two", 2, "bursty", 201)
	w.uses(0, 101, 3000)
	w.uses(0, 201, 4000) // 7000 together: 2904 past the shared 4096
	b := limiterstate.Encode(&limiterstate.Snapshot{Processes: []limiterstate.Process{{PID: 1, HostPID: 101}, {PID: 1, HostPID: 201}}})
	if err := os.WriteFile(filepath.Join(stateDir, "cache"), b, 0o666); err != nil {
		t.Fatal(err)
	}
	r := w.reconciler(true)
	r.opts.Claims = func() []claimuse.Claim { return claims }
	r.opts.BudgetDir = budgets
	var reclaims []Reclaim
	r.Reclaimed = func(c Reclaim) { reclaims = append(reclaims, c) }
	if got := r.Once(); len(got) != 0 {
		t.Fatalf("a claim bursting within its ceiling is no breach: %v", got)
	}
	got, err := os.ReadFile(filepath.Join(budgets, g0))
	if err != nil {
		t.Fatal(err)
	}
	if want := "version=1\nunguaranteed=36864m\nborrower." + borrower + "=2904m\n"; !strings.HasSuffix(string(got), want) {
		t.Errorf("budget file:\n%s\nwant it to end with\n%s", got, want)
	}
	// a 34 GiB guarantee comes: 2048 MiB stay unguaranteed, the claim
	// borrows 2904: both its containers are stopped
	w.container("b", "newcomer", 5, []api.DeviceGrant{{UUID: g0, MemoryMiB: 34816}})
	r.Admitted()
	if len(reclaims) != 2 || reclaims[0].Claim != "a/bursty/gpu" || reclaims[0].UsedMiB != 7000 || reclaims[0].GuaranteeMiB != 4096 ||
		!slices.Equal([]*v1.Pod{reclaims[0].Pod, reclaims[1].Pod}, []*v1.Pod{one, two}) || !slices.Equal(w.killed, []int{101, 201}) {
		t.Fatalf("reclaims %+v, killed %v; want the claim's two containers stopped (pids 101, 201)", reclaims, w.killed)
	}
	if m := reclaims[0].String(); !strings.Contains(m, "with the other containers using DRA claim request a/bursty/gpu: they held 7000 MiB") {
		t.Errorf("message: %s", m)
	}
}
