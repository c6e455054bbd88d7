package placement

import (
	"strings"
	"testing"
)

// burst is a one-GPU container guaranteed mem MiB with a ceiling of ceil.
func burst(name string, mem, ceil int64) Container {
	return Container{Name: name, GPUs: 1, MemoryMiB: mem, CeilingMiB: ceil}
}

// TestCeilingPacksByGuarantee: a GPU is charged the guarantees only, the
// record carries each grant's ceiling, and guarantees never add up past
// the GPU's memory, whatever the ceilings.
func TestCeilingPacksByGuarantee(t *testing.T) {
	c, n := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	for i := range 4 {
		rec := place(t, c, pod("p"+string(rune('0'+i)), burst("main", 10240, 40960)))
		if d := rec.Containers[0].Devices[0]; d.MemoryMiB != 10240 || d.CeilingMiB != 40960 {
			t.Fatalf("grant %+v, want a guarantee of 10240 MiB with a ceiling of 40960", d)
		}
	}
	if got := n.GPUs[0].Used.MemoryMiB; got != 40960 {
		t.Fatalf("charged %d MiB, want the four guarantees (40960)", got)
	}
	if r := fitOn(t, c, n, pod("more", burst("main", 1, 2))); r.Kind != ReasonGPUMemory {
		t.Fatalf("a fifth guarantee on a full GPU: %v, want %v", r, ReasonGPUMemory)
	}
	// A share without a ceiling records none (a v2 record).
	c2, _ := oneNodeCluster(t, inventory(1, "A100", 40960, 10))
	if d := place(t, c2, pod("plain", share("main", 4096, 10))).Containers[0].Devices[0]; d.CeilingMiB != 0 {
		t.Fatalf("grant %+v has a ceiling nobody asked", d)
	}
	checkInvariants(t, c)
}

// TestCeilingNeedsAGPUThatLarge: the ceiling, not only the guarantee,
// must fit the GPU's physical memory.
func TestCeilingNeedsAGPUThatLarge(t *testing.T) {
	c := NewCluster()
	small := mustNode(t, "small", inventory(1, "A100", 40960, 10))
	big := mustNode(t, "big", inventory(1, "H100", 81920, 10))
	c.UpsertNode(small)
	c.UpsertNode(big)
	r := fitOn(t, c, small, pod("p", burst("main", 8192, 65536)))
	if r.Kind != ReasonGPUMemoryPhysical || r.Need != 65536 || r.Have != 40960 {
		t.Fatalf("on the 40 GiB GPU: %+v, want %v asking 65536 of 40960", r, ReasonGPUMemoryPhysical)
	}
	if rec := place(t, c, pod("p", burst("main", 8192, 65536))); rec.Node != "big" {
		t.Fatalf("placed on %s, want the 80 GiB GPU's node", rec.Node)
	}
}

// TestCeilingRefusedWhereMemoryIsOvercommitted: on a node whose memory is
// overcommitted a guarantee is not one, so a pod asking a ceiling is not
// placed there; a pod without one still is.
func TestCeilingRefusedWhereMemoryIsOvercommitted(t *testing.T) {
	inv := inventory(2, "A100", 40960, 10)
	inv.MemoryOvercommit = 1.5
	c, n := oneNodeCluster(t, inv)
	r := fitOn(t, c, n, pod("p", burst("main", 4096, 8192)))
	if r.Kind != ReasonMemoryOvercommitted {
		t.Fatalf("reason %v, want %v", r, ReasonMemoryOvercommitted)
	}
	if !strings.Contains(r.String(), "memory ceiling of 8192 MiB") || !r.Kind.Text().Unresolvable {
		t.Errorf("reason %q (unresolvable %v)", r, r.Kind.Text().Unresolvable)
	}
	place(t, c, pod("plain", share("main", 4096, 10)))
}

func TestCeilingValidation(t *testing.T) {
	for _, tc := range []struct {
		c    Container
		want string
	}{
		{Container{Name: "c", GPUs: 1, MemoryPercent: 20, CeilingMiB: 8192}, `container "c": GPU memory ceiling 8192 MiB needs a guarantee of at most that much in MiB`},
		{burst("c", 8192, 4096), "needs a guarantee of at most that much"},
		{Container{Name: "c", GPUs: 1, MemoryMiB: 4096, Cores: 100, CeilingMiB: 8192}, "on a whole GPU, which has nothing to borrow"},
		{burst("c", 4096, -1), "GPU memory ceiling -1 MiB outside"},
		{Container{Name: "c", GPUs: 1, MIGProfile: "1g.5gb", CeilingMiB: 8192}, "the profile fixes both"},
	} {
		err := pod("p", tc.c).Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
}
