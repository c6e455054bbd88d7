package mig

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func model(t *testing.T, name string) *Model {
	t.Helper()
	m, ok := ModelByName(name)
	if !ok {
		t.Fatalf("no model %s", name)
	}
	return m
}

func TestModelFor(t *testing.T) {
	for _, tc := range []struct {
		product string
		mib     int64
		want    string
	}{
		{"NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"},
		{"Mock NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"},
		{"NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"},
		{"NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"},
		{"NVIDIA A100 80GB PCIe", 81251, "A100-80GB"},
		{"NVIDIA H100 80GB HBM3", 81559, "H100-80GB"},
		{"NVIDIA H200", 143771, "H200-141GB"},
		{"NVIDIA H200 141GB HBM3e", 144384, "H200-141GB"},
		{"NVIDIA A30", 24576, "A30-24GB"},
		{"NVIDIA H100 NVL", 95830, ""},   // 94 GB variant: other profiles, not in the table
		{"NVIDIA A10", 23028, ""},        // no MIG
		{"NVIDIA GH100 80GB", 81559, ""}, // "H100" is not a word of it
	} {
		m, ok := ModelFor(tc.product, tc.mib)
		got := ""
		if ok {
			got = m.Name
		}
		if got != tc.want {
			t.Errorf("ModelFor(%q, %d) = %q, want %q", tc.product, tc.mib, got, tc.want)
		}
	}
}

func TestArrange(t *testing.T) {
	a100 := model(t, "A100-40GB")
	for _, tc := range []struct {
		counts map[string]int
		err    string
	}{
		{map[string]int{"1g.5gb": 7}, ""},
		{map[string]int{"2g.10gb": 3}, ""},
		{map[string]int{"3g.20gb": 2}, ""},
		{map[string]int{"7g.40gb": 1}, ""},
		{map[string]int{"4g.20gb": 1, "3g.20gb": 1}, ""},
		{map[string]int{"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}, ""},
		{map[string]int{"2g.10gb": 2, "1g.10gb": 1, "1g.5gb": 1}, ""},
		{map[string]int{"1g.5gb+me": 1, "1g.5gb": 6}, ""},
		{map[string]int{"1g.5gb": 8}, "holds at most 7"},
		{map[string]int{"1g.5gb+me": 2}, "holds at most 1"},
		{map[string]int{"3g.20gb": 1, "2g.10gb": 2, "1g.5gb": 1}, "does not fit"},
		{map[string]int{"4g.20gb": 1, "2g.10gb": 2}, "does not fit"},
		{map[string]int{"7g.40gb": 1, "1g.5gb": 1}, "does not fit"},
		{map[string]int{"1g.6gb": 1}, `has no profile "1g.6gb"`},
		{map[string]int{"1c.3g.20gb": 1}, "compute instance"},
		{map[string]int{"1g.5gb": -1}, "negative"},
	} {
		insts, err := a100.Arrange(tc.counts)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("Arrange(%v): %v", tc.counts, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Arrange(%v) = %v, %v; want an error with %q", tc.counts, insts, err, tc.err)
		case err == nil:
			if verr := a100.Validate(insts); verr != nil {
				t.Errorf("Arrange(%v) = %v, invalid: %v", tc.counts, insts, verr)
			}
			n := 0
			for _, c := range tc.counts {
				n += c
			}
			if len(insts) != n {
				t.Errorf("Arrange(%v) placed %d instances, want %d", tc.counts, len(insts), n)
			}
		}
	}
	a30 := model(t, "A30-24GB")
	if _, err := a30.Arrange(map[string]int{"1g.6gb": 4}); err != nil {
		t.Error(err)
	}
	if _, err := a30.Arrange(map[string]int{"2g.12gb": 1, "1g.6gb": 3}); err == nil {
		t.Error("A30: 2g.12gb + 3×1g.6gb arranged, but it needs 5 compute slices of 4")
	}
}

func TestValidate(t *testing.T) {
	m := model(t, "A100-40GB")
	for insts, want := range map[*[]Instance]string{
		{{"1g.5gb", 7}}:                      "cannot start at memory slice 7",
		{{"2g.10gb", 6}}:                     "cannot start at memory slice 6",
		{{"3g.20gb", 0}, {"1g.5gb", 3}}:      "overlap",
		{{"4g.20gb", 0}, {"3g.20gb", 4}}:     "",
		{{"1g.9gb", 0}}:                      "has no MIG profile",
		{{"1g.5gb+me", 0}, {"1g.5gb+me", 1}}: "at most 1",
		{{"3g.20gb", 4}, {"1g.5gb", 0}, {"1g.5gb", 1}, {"1g.5gb", 2}, {"1g.5gb", 3}}: "",
		{{"3g.20gb", 4}, {"2g.10gb", 0}, {"1g.10gb", 2}}:                             "",
	} {
		err := m.Validate(*insts)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(%v) = %v, want %q", *insts, err, want)
		}
	}
}

// TestDynamicFill is the dynamic-MIG acceptance in the pure core: seven 1g
// requests fill an A100's seven slices, a 3g request then fails naming the
// instances in its way, and freeing four of them lets it fit.
func TestDynamicFill(t *testing.T) {
	m := model(t, "A100-40GB")
	var insts []Instance
	for i := range 7 {
		c, ok := m.Choose(insts, Need{MemoryMiB: 4000, Cores: 10})
		if !ok {
			t.Fatalf("pod %d: no 1g instance beside %v: %s", i, insts, m.Explain(insts, Need{MemoryMiB: 4000, Cores: 10}))
		}
		if c.Profile.Name != "1g.5gb" {
			t.Fatalf("pod %d got %s, want the smallest profile 1g.5gb", i, c.Profile.Name)
		}
		insts = append(insts, c.Instance())
	}
	if err := m.Validate(insts); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Choose(insts, Need{MemoryMiB: 4000}); ok {
		t.Fatal("an eighth 1g instance was placed")
	}
	need3g := Need{MemoryMiB: 18000, Cores: 30}
	if c, ok := m.Choose(insts, need3g); ok {
		t.Fatalf("3g placed as %v on a full GPU", c)
	}
	msg := m.Explain(insts, need3g)
	if !strings.Contains(msg, "3g.20gb") || !strings.Contains(msg, "1g.5gb@0") || !strings.Contains(msg, "1g.5gb@6") {
		t.Errorf("explanation %q does not name the profile and the blocking instances", msg)
	}
	// Free the instances on slices 0-3.
	var left []Instance
	for _, in := range insts {
		if in.Start >= 4 {
			left = append(left, in)
		}
	}
	c, ok := m.Choose(left, need3g)
	if !ok || c.Profile.Name != "3g.20gb" || c.Start != 0 {
		t.Fatalf("after freeing slices 0-3: %v %v, want 3g.20gb@0 (%s)", c, ok, m.Explain(left, need3g))
	}
}

func TestChooseSmallestThatSatisfies(t *testing.T) {
	m := model(t, "A100-40GB")
	for _, tc := range []struct {
		need Need
		want string
	}{
		{Need{}, "1g.5gb"},
		{Need{MemoryMiB: 4864}, "1g.5gb"},
		{Need{MemoryMiB: 4865}, "1g.10gb"}, // two memory slices, one compute slice
		{Need{MemoryMiB: 5000, Cores: 20}, "2g.10gb"},
		{Need{Cores: 13}, "2g.10gb"}, // a 1g has 14 of 108 SMs = 12.96 %
		{Need{Cores: 12}, "1g.5gb"},
		{Need{MemoryMiB: 10000}, "3g.20gb"},
		{Need{Cores: 40}, "4g.20gb"},
		{Need{Cores: 60}, "7g.40gb"},
		{Need{MemoryMiB: 40193}, ""},
	} {
		c, ok := m.Choose(nil, tc.need)
		got := ""
		if ok {
			got = c.Profile.Name
		}
		if got != tc.want {
			t.Errorf("Choose(%+v) = %q, want %q", tc.need, got, tc.want)
		}
	}
	if msg := m.Explain(nil, Need{MemoryMiB: 50000}); !strings.Contains(msg, "no A100-40GB MIG profile has 50000 MiB") {
		t.Errorf("Explain for an impossible request: %q", msg)
	}
}

// TestChooseKeepsLargeProfilesPlaceable: a first small instance must not
// land where it blocks both 3g placements.
func TestChooseKeepsLargeProfilesPlaceable(t *testing.T) {
	m := model(t, "A100-40GB")
	c, _ := m.Choose(nil, Need{})
	insts := []Instance{c.Instance()}
	if len(m.FreeStarts(insts, mustProfile(t, m, "4g.20gb"))) != 1 || len(m.FreeStarts(insts, mustProfile(t, m, "3g.20gb"))) != 1 {
		t.Errorf("first 1g at %d: 4g.20gb or 3g.20gb no longer placeable", c.Start)
	}
	// A 3g at 4 then a 2g: the 2g must leave room for another 2g (0 or 2).
	insts = []Instance{{"3g.20gb", 4}}
	c, _ = m.Choose(insts, Need{MemoryMiB: 9000, Cores: 20})
	insts = append(insts, c.Instance())
	if len(m.FreeStarts(insts, mustProfile(t, m, "2g.10gb"))) != 1 {
		t.Errorf("2g at %d beside 3g@4 leaves no room for a second 2g", c.Start)
	}
}

func mustProfile(t *testing.T, m *Model, name string) *Profile {
	t.Helper()
	p, ok := m.Profile(name)
	if !ok {
		t.Fatalf("%s has no %s", m.Name, name)
	}
	return p
}

// TestRandomChurnStaysValid creates and removes instances at random on
// every model: every layout reached is valid, and Choose fails only when
// no profile satisfying the request has a free start.
func TestRandomChurnStaysValid(t *testing.T) {
	for i := range Models {
		m := &Models[i]
		rng := rand.New(rand.NewPCG(1, uint64(i)))
		var insts []Instance
		for step := range 2000 {
			if len(insts) > 0 && rng.IntN(3) == 0 {
				k := rng.IntN(len(insts))
				insts = append(insts[:k], insts[k+1:]...)
				continue
			}
			big := m.bySize()[len(m.Profiles)-1]
			need := Need{MemoryMiB: rng.Int64N(big.MemoryMiB + 1), Cores: rng.IntN(101)}
			c, ok := m.Choose(insts, need)
			share, _ := m.ShareProfile(need)
			if !ok {
				for _, p := range m.bySize() {
					if !p.Media && m.Satisfies(p, need) && p.MemoryMiB <= share.MemoryMiB && len(m.FreeStarts(insts, p)) > 0 {
						t.Fatalf("%s step %d: Choose(%+v) failed but %s fits beside %v", m.Name, step, need, p.Name, insts)
					}
				}
				continue
			}
			if !m.Satisfies(c.Profile, need) {
				t.Fatalf("%s step %d: %s does not satisfy %+v", m.Name, step, c.Profile.Name, need)
			}
			// Never more memory than the share is sized (and charged) to.
			if c.Profile.MemoryMiB > share.MemoryMiB {
				t.Fatalf("%s step %d: %s (%d MiB) for %+v, sized to %s (%d MiB)", m.Name, step, c.Profile.Name, c.Profile.MemoryMiB, need, share.Name, share.MemoryMiB)
			}
			insts = append(insts, c.Instance())
			if err := m.Validate(insts); err != nil {
				t.Fatalf("%s step %d: %v", m.Name, step, err)
			}
		}
	}
}
