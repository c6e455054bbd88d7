package reconcile

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestParseNeed(t *testing.T) {
	const u = "GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8"
	n, err := ParseNeed([]byte("version=1\ndevice=" + u + "\nbytes=1048576\nused=5\nlater=x\n"))
	if err != nil || n != (Need{GPU: u, Bytes: 1 << 20}) {
		t.Errorf("ParseNeed = %+v, %v", n, err)
	}
	for _, bad := range []string{
		"",
		"device=" + u + "\nbytes=1\n",
		"version=2\ndevice=" + u + "\nbytes=1\n",
		"version=1\nbytes=1\n",
		"version=1\ndevice=" + u + "\n",
		"version=1\ndevice=" + u + "\nbytes=0\n",
		"version=1\ndevice=" + u + "\nbytes=-1\n",
		"version=1\ndevice=../../etc\nbytes=1\n",
		"version=1\ndevice=" + u + "\ndevice=" + u + "\nbytes=1\n",
		"version=1\ndevice=" + u + "\nbytes\n",
		"version=1\ndevice=" + u + "\nbytes=1\n#" + strings.Repeat("x", maxNeedFile),
	} {
		if n, err := ParseNeed([]byte(bad)); err == nil {
			t.Errorf("ParseNeed(%q) = %+v, want an error", bad, n)
		}
	}
}

// TestReclaimOnRefusal: a guaranteed container within its guarantee whose
// allocation the driver refused (memory the ledger does not know of, a
// host process, fills the GPU; the borrowers fit in the unguaranteed
// memory, so no pass reclaims) asks through its need file; the agent
// stops the borrower. A request is answered only from a container within
// its own guarantee, when the GPU lacks the memory, at most once per
// NeedInterval, and from a regular file.
func TestReclaimOnRefusal(t *testing.T) {
	w := newWorld(t)
	g0 := w.gpus[0].UUID // 40960 MiB
	var reclaims []Reclaim
	r := New(Options{ProcRoot: w.proc, Kill: true, BudgetDir: t.TempDir(), NeedInterval: time.Hour}, w.gpus, w.state,
		func() []*v1.Pod { return w.pods }, ktesting.NewLogger(t, ktesting.NewConfig()))
	r.kill = func(pid int) error { w.killed = append(w.killed, pid); return nil }
	r.Reclaimed = func(c Reclaim) { reclaims = append(reclaims, c) }

	// 8 GiB guaranteed, bursting to 28 GiB: 20 GiB past its guarantee,
	// within the 24 GiB no one is guaranteed
	big := w.container("a", "big", 1, []api.DeviceGrant{{UUID: g0, MemoryMiB: 8192, CeilingMiB: 32768}}, 101)
	w.limited(big, nil)
	w.uses(0, 101, 28672)
	// 8 GiB guaranteed, holding 4
	small := w.container("b", "small", 2, []api.DeviceGrant{{UUID: g0, MemoryMiB: 8192}}, 201)
	w.limited(small, nil)
	w.uses(0, 201, 4096)
	ask := func(p *v1.Pod, bytes uint64) {
		t.Helper()
		dir := w.state.StateDir(p.UID, "main")
		tmp := filepath.Join(dir, "need.tmp")
		if err := os.WriteFile(tmp, fmt.Appendf(nil, "version=1\ndevice=%s\nbytes=%d\nused=0\n", g0, bytes), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, statedir.NeedFile)); err != nil {
			t.Fatal(err)
		}
	}
	if r.Once(); len(reclaims) != 0 {
		t.Fatalf("the borrowers fit in the unguaranteed memory: %+v", reclaims)
	}

	// the GPU has 8 GiB free: nothing to stop
	ask(small, 2<<30)
	r.ServeNeeds()
	if len(reclaims) != 0 {
		t.Fatalf("a request the GPU's free memory covers: %+v", reclaims)
	}
	// a host process takes the rest; small asks again at once: too soon
	w.uses(0, 999, 8192)
	ask(small, 2<<30)
	r.ServeNeeds()
	if len(reclaims) != 0 {
		t.Fatalf("a second request within NeedInterval was answered: %+v", reclaims)
	}
	r.opts.NeedInterval = time.Nanosecond
	// the borrower asks: it holds past its guarantee, nothing is stopped
	ask(big, 2<<30)
	r.ServeNeeds()
	// a link in place of the file is not followed
	need := filepath.Join(w.state.StateDir(small.UID, "main"), statedir.NeedFile)
	elsewhere := filepath.Join(t.TempDir(), "need")
	if err := os.WriteFile(elsewhere, fmt.Appendf(nil, "version=1\ndevice=%s\nbytes=%d\n", g0, 2<<30), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(need); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, need); err != nil {
		t.Fatal(err)
	}
	r.ServeNeeds()
	if len(reclaims) != 0 || len(w.killed) != 0 {
		t.Fatalf("a request over the guarantee, or through a link, was answered: %+v, killed %v", reclaims, w.killed)
	}
	_ = os.Remove(need)

	// small, within its guarantee, is refused 2 GiB: big is stopped
	ask(small, 2<<30)
	r.ServeNeeds()
	if len(reclaims) != 1 || reclaims[0].Pod != big || reclaims[0].Trigger != TriggerRefusal || !slices.Equal(w.killed, []int{101}) {
		t.Fatalf("reclaims %+v, killed %v; want big stopped (pid 101) for the refusal", reclaims, w.killed)
	}
	if m := reclaims[0].String(); !strings.Contains(m, "refused memory to a container within its guarantee") ||
		strings.Contains(m, small.Name) {
		t.Errorf("message %q: want the refusal named, not the pod that asked", m)
	}
	// the same file read again asks nothing more
	r.ServeNeeds()
	if len(reclaims) != 1 {
		t.Errorf("one request answered twice: %+v", reclaims[1:])
	}
}

// TestChooseReclaimsForANeed: a refused guarantee's shortfall is freed by
// stopping borrowers, furthest above its guarantee first, as many as free
// it (all they hold), never one within its guarantee.
func TestChooseReclaimsForANeed(t *testing.T) {
	bs := []Borrower{{4096, 6144}, {1024, 5120}, {4096, 4096}}
	for _, tc := range []struct {
		need int64
		want []int
	}{
		{0, nil},
		{5120, []int{1}},
		{5121, []int{1, 0}},
		{1 << 20, []int{1, 0}},
	} {
		if got := ChooseReclaims(8192, 64, tc.need, bs); !slices.Equal(got, tc.want) {
			t.Errorf("need %d: %v, want %v", tc.need, got, tc.want)
		}
	}
}
