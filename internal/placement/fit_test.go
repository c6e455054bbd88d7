package placement

import (
	"math/rand"
	"testing"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// lastRule is the highest bit of failures; a rule added after it must be
// added here and given a case below.
const lastRule = noShares

// Every rule of a GPU share has a case where it alone keeps the pod off
// the node, and the reason given comes from that rule: Fit and the
// explanation decide from the same rules.
func TestEveryFitRuleIsExplained(t *testing.T) {
	exclusiveMode := inventory(1, "A100", 40960, 10)
	exclusiveMode.GPUs[0].Sharing, exclusiveMode.GPUs[0].MaxShares = api.SharingExclusive, 1
	cases := []struct {
		rule   failures
		inv    *api.NodeInventory
		before []*Request // placed first
		pod    *Request
		want   ReasonKind
	}{
		{heldWhole, inventory(1, "A100", 40960, 10), []*Request{pod("w", whole("main", 1))},
			pod("p", share("main", 1000, 10)), ReasonHeldWhole},
		{notIdle, inventory(1, "A100", 40960, 10), []*Request{pod("s", share("main", 1000, 10))},
			pod("p", whole("main", 1)), ReasonWholeGPUs},
		{sharingMode, exclusiveMode, nil,
			pod("p", share("main", 1000, 10)), ReasonSharingMode},
		// The pod's own app container holds the only GPU whole: the
		// share's memory rule names it too.
		{ownWhole, inventory(1, "A100", 40960, 10), nil,
			pod("p", whole("train", 1), share("side", 1000, 10)), ReasonGPUMemory},
		{tooSmall, inventory(1, "A100", 40960, 10), nil,
			pod("p", share("main", 50000, 10)), ReasonGPUMemoryPhysical},
		{noMemory, inventory(1, "A100", 40960, 10), []*Request{pod("s", share("main", 30000, 10))},
			pod("p", share("main", 20000, 10)), ReasonGPUMemory},
		{noCores, inventory(1, "A100", 40960, 10), []*Request{pod("s", share("main", 1000, 80))},
			pod("p", share("main", 1000, 30)), ReasonGPUCores},
		{noShares, inventory(1, "A100", 40960, 1), []*Request{pod("s", share("main", 1000, 10))},
			pod("p", share("main", 1000, 10)), ReasonShares},
	}
	covered := map[failures]bool{}
	for _, tc := range cases {
		c, n := oneNodeCluster(t, tc.inv)
		for _, r := range tc.before {
			place(t, c, r)
		}
		cr := mustCompile(t, c, tc.pod)
		var s Scratch
		var p Placement
		reason := cr.Fit(n, nil, &s, &p)
		if reason.Kind != tc.want {
			t.Errorf("rule %b: reason %v (%s), want %v", tc.rule, reason.Kind, reason, tc.want)
			continue
		}
		// The scratch holds the pod as it was when the container failed.
		for k := range cr.gpu {
			cc := &cr.gpu[k]
			if cc.c.Name != reason.Container {
				continue
			}
			g := &n.GPUs[0]
			if f := s.rules(g, 0, cc, cc.demandOn(g), true); f&tc.rule == 0 {
				t.Errorf("rule %b: the failing container breaks %b, not the rule", tc.rule, f)
			}
		}
		covered[tc.rule] = true
	}
	for f := failures(1); f <= lastRule; f <<= 1 {
		if !covered[f] {
			t.Errorf("rule %b has no case: say here which reason explains it", f)
		}
	}
}

// Fit may stop at the first rule a GPU breaks; what it decides is what
// all the rules decide, and what it reports is among them.
func TestRulesStopEarlyAlike(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	for range 200 {
		c := randomCluster(rng)
		for _, n := range c.nodes {
			var s Scratch
			for i := range n.GPUs {
				g := &n.GPUs[i]
				s.pod[i] = gpushare.Pod{
					App:  gpushare.Usage{MemoryMiB: rng.Int63n(g.MemoryMiB), Cores: rng.Intn(60), Shares: rng.Intn(3), Exclusive: rng.Intn(4) / 3},
					Init: gpushare.Usage{MemoryMiB: rng.Int63n(g.MemoryMiB), Cores: rng.Intn(60), Shares: rng.Intn(2)},
				}
				g.Used = Usage{MemoryMiB: rng.Int63n(g.MemoryCap), Cores: rng.Intn(101), Shares: rng.Intn(g.MaxShares + 1), Exclusive: rng.Intn(5) / 4}
				c := randomContainer(rng, "c")
				cc := new(compileContainer(c, rng.Intn(3) == 0, 0))
				if cc.c.GPUs == 0 {
					continue
				}
				d := cc.demandOn(g)
				early, all := s.rules(g, i, cc, d, false), s.rules(g, i, cc, d, true)
				if (early == 0) != (all == 0) || early&^all != 0 {
					t.Fatalf("GPU %+v, pod %+v, container %+v: early %b, all %b", g, s.pod[i], cc, early, all)
				}
			}
		}
	}
}
