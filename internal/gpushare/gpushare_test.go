package gpushare

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestOfGrant(t *testing.T) {
	share := api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 10240, Cores: 30}
	if got, want := OfGrant(share, 40960, true), (Usage{MemoryMiB: 10240, Cores: 30, Shares: 1}); got != want {
		t.Errorf("share: %+v, want %+v", got, want)
	}
	whole := api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 40960, Cores: 100, Exclusive: true}
	// Overcommit 1.5: a whole GPU holds all it could have granted.
	if got, want := OfGrant(whole, 61440, true), (Usage{MemoryMiB: 61440, Cores: 100, Shares: 1, Exclusive: 1}); got != want {
		t.Errorf("whole GPU: %+v, want %+v", got, want)
	}
	if got, want := OfGrant(whole, 0, false), (Usage{MemoryMiB: 40960, Cores: 100, Shares: 1, Exclusive: 1}); got != want {
		t.Errorf("whole GPU of an unknown node: %+v, want %+v", got, want)
	}
}

func TestPodChargeAppAddsInitMax(t *testing.T) {
	var p Pod
	p.Take(Share(1000, 10), false)
	p.Take(Share(2000, 20), false)
	p.Take(Share(5000, 5), true)
	p.Take(Share(500, 50), true)
	// App: 3000 MiB, 30 %, 2 shares; largest init: 5000 MiB, 50 %, 1 share.
	if got, want := p.Charge(), (Usage{MemoryMiB: 5000, Cores: 50, Shares: 2}); got != want {
		t.Errorf("charge %+v, want %+v", got, want)
	}
	if got, want := p.WithApp(Share(1000, 30)), (Usage{MemoryMiB: 5000, Cores: 60, Shares: 3}); got != want {
		t.Errorf("with one more app share %+v, want %+v", got, want)
	}
	if got, want := p.WithInit(Share(6000, 10)), (Usage{MemoryMiB: 6000, Cores: 50, Shares: 2}); got != want {
		t.Errorf("with one more init share %+v, want %+v", got, want)
	}
	if p.Charge() != (Usage{MemoryMiB: 5000, Cores: 50, Shares: 2}) {
		t.Error("WithApp or WithInit changed the pod")
	}
	// Both say what Take and Charge would.
	for _, init := range []bool{false, true} {
		q := p
		q.Take(Share(7000, 5), init)
		want := p.WithApp(Share(7000, 5))
		if init {
			want = p.WithInit(Share(7000, 5))
		}
		if q.Charge() != want {
			t.Errorf("init %v: Take then Charge %+v, With… %+v", init, q.Charge(), want)
		}
	}
	// Two app containers naming the same GPU whole hold it whole once.
	var w Pod
	w.Take(Whole(40960), false)
	w.Take(Whole(40960), false)
	if got := w.Charge().Exclusive; got != 1 {
		t.Errorf("held whole %d times by one pod", got)
	}
}

func TestCharges(t *testing.T) {
	rec := &api.PodAllocation{Node: "n", Containers: []api.ContainerAllocation{
		{Name: "fetch", Init: true, Devices: []api.DeviceGrant{{UUID: "GPU-b", MemoryMiB: 8000, Cores: 10}}},
		{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-a", MemoryMiB: 3000, Cores: 20}, {UUID: "GPU-b", MemoryMiB: 3000, Cores: 20}}},
		{Name: "side", Devices: []api.DeviceGrant{{UUID: "GPU-b", MemoryMiB: 2000, Cores: 30}}},
		{Name: "train", Devices: []api.DeviceGrant{{UUID: "GPU-c", MemoryMiB: 40960, Cores: 100, Exclusive: true}}},
	}}
	caps := map[string]int64{"GPU-c": 81920}
	got := Charges(rec, func(u string) (int64, bool) { c, ok := caps[u]; return c, ok })
	want := []Charge{
		{"GPU-b", Usage{MemoryMiB: 8000, Cores: 50, Shares: 2}}, // max(init 8000/10/1, app 5000/50/2)
		{"GPU-a", Usage{MemoryMiB: 3000, Cores: 20, Shares: 1}},
		{"GPU-c", Usage{MemoryMiB: 81920, Cores: 100, Shares: 1, Exclusive: 1}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("charges\n%+v\nwant\n%+v", got, want)
	}
	if got := Charges(rec, nil); got[2].Usage.MemoryMiB != 40960 {
		t.Errorf("whole GPU without capacities charges %d MiB, want the granted 40960", got[2].Usage.MemoryMiB)
	}
}

// Adding and then subtracting any charges leaves nothing behind.
func TestAddSubInverse(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var total Usage
	var added []Usage
	for range 1000 {
		u := Usage{MemoryMiB: rng.Int64N(1 << 20), Cores: rng.IntN(101), Shares: rng.IntN(3), Exclusive: rng.IntN(2)}
		added = append(added, u)
		total.Add(u)
	}
	for _, u := range added {
		total.Sub(u)
	}
	if total != (Usage{}) {
		t.Errorf("left %+v", total)
	}
}

func TestOvercommit(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 1: 1, 1.5: 1.5, api.MaxMemoryOvercommit: api.MaxMemoryOvercommit} {
		if got, err := Overcommit(in); err != nil || got != want {
			t.Errorf("Overcommit(%v) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []float64{0.5, -1, api.MaxMemoryOvercommit + 0.1, math.NaN(), math.Inf(1)} {
		_, err := Overcommit(in)
		if err == nil || !strings.Contains(err.Error(), "outside [1,") {
			t.Errorf("Overcommit(%v): %v, want an error naming the range", in, err)
		}
	}
}

func TestCapacityOf(t *testing.T) {
	g := api.GPU{UUID: "GPU-a", MemoryMiB: 40961, Sharing: api.SharingShared, MaxShares: 10}
	if got, want := CapacityOf(g, 1.5), (Capacity{MemoryMiB: 40961, MemoryCap: 61441, MaxShares: 10}); got != want {
		t.Errorf("shared: %+v, want %+v (memory × overcommit, rounded down)", got, want)
	}
	g.Sharing = api.SharingExclusive
	if got := CapacityOf(g, 1).MaxShares; got != 1 {
		t.Errorf("exclusive mode: %d shares, want 1", got)
	}
	g.Sharing, g.MaxShares = api.SharingShared, 0
	if got := CapacityOf(g, 1).MaxShares; got != 1 {
		t.Errorf("no share count: %d shares, want 1", got)
	}
}

func TestExceeded(t *testing.T) {
	c := Capacity{MemoryMiB: 40960, MemoryCap: 40960, MaxShares: 4}
	for _, tc := range []struct {
		u    Usage
		want Limit
	}{
		{Usage{MemoryMiB: 40960, Cores: 100, Shares: 4, Exclusive: 1}, 0},
		{Usage{MemoryMiB: 40961}, LimitMemory},
		{Usage{Cores: 101}, LimitCores},
		{Usage{Shares: 5}, LimitShares},
		{Usage{Shares: 2, Exclusive: 2}, LimitWhole},
		{Usage{MemoryMiB: 50000, Cores: 150, Shares: 9, Exclusive: 2}, LimitMemory | LimitCores | LimitShares | LimitWhole},
	} {
		if got := c.Exceeded(tc.u); got != tc.want {
			t.Errorf("Exceeded(%+v) = %04b, want %04b", tc.u, got, tc.want)
		}
	}
	// WithinAdding is Exceeded's verdict on the sum.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		u := Usage{MemoryMiB: rng.Int64N(30000), Cores: rng.IntN(70), Shares: rng.IntN(4), Exclusive: rng.IntN(2)}
		a := Usage{MemoryMiB: rng.Int64N(30000), Cores: rng.IntN(70), Shares: rng.IntN(4), Exclusive: rng.IntN(2)}
		sum := u
		sum.Add(a)
		if c.WithinAdding(u, a) != (c.Exceeded(sum) == 0) {
			t.Fatalf("%+v + %+v: WithinAdding %v, Exceeded %04b", u, a, c.WithinAdding(u, a), c.Exceeded(sum))
		}
	}
	if !c.Holds(40960) || c.Holds(40961) {
		t.Error("Holds: a share may ask the GPU's physical memory and no more")
	}
}
