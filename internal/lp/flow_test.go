package lp

import (
	"math/rand/v2"
	"testing"
)

// MaxFlow against the textbook network (CLRS fig. 26.6: value 23) and
// against brute-force minimum cuts of random small networks.
func TestMaxFlow(t *testing.T) {
	g := NewNetwork(6)
	for _, a := range [][3]int64{{0, 1, 16}, {0, 2, 13}, {1, 3, 12}, {2, 1, 4}, {2, 4, 14}, {3, 2, 9}, {3, 5, 20}, {4, 3, 7}, {4, 5, 4}} {
		g.AddArc(int(a[0]), int(a[1]), a[2])
	}
	if f := g.MaxFlow(0, 5); f != 23 {
		t.Fatalf("max flow %d, want 23", f)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		n := 2 + rng.IntN(6)
		type arc struct {
			u, v int
			c    int64
		}
		var arcs []arc
		g := NewNetwork(n)
		for k := rng.IntN(3 * n); k > 0; k-- {
			a := arc{rng.IntN(n), rng.IntN(n), int64(rng.IntN(10))}
			if a.u == a.v {
				continue
			}
			arcs = append(arcs, a)
			g.AddArc(a.u, a.v, a.c)
		}
		// Reuse the network with new capacities, as the floors do.
		idx := 0
		for i := range arcs {
			if rng.IntN(2) == 0 {
				arcs[i].c = int64(rng.IntN(10))
			}
			g.SetCap(idx, arcs[i].c)
			idx += 2
		}
		want := int64(-1)
		for mask := 0; mask < 1<<n; mask++ {
			if mask&1 == 0 || mask&(1<<(n-1)) != 0 {
				continue // s = 0 on the source side, t = n-1 not
			}
			var cut int64
			for _, a := range arcs {
				if mask&(1<<a.u) != 0 && mask&(1<<a.v) == 0 {
					cut += a.c
				}
			}
			if want < 0 || cut < want {
				want = cut
			}
		}
		if got := g.MaxFlow(0, n-1); got != want {
			t.Fatalf("trial %d: max flow %d, minimum cut %d", trial, got, want)
		}
		side := g.SourceSide(0)
		var cut int64
		for _, a := range arcs {
			if side[a.u] && !side[a.v] {
				cut += a.c
			}
		}
		if cut != want || side[n-1] {
			t.Fatalf("trial %d: source side cuts %d (t inside: %v), want %d", trial, cut, side[n-1], want)
		}
	}
}
