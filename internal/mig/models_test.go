package mig

import (
	"strings"
	"testing"
)

// TestChoosePerModel is the dynamic-MIG choice on every documented model:
// the smallest profile that satisfies a request, by memory and by
// compute, on an empty GPU.
func TestChoosePerModel(t *testing.T) {
	for _, tc := range []struct {
		model string
		need  Need
		want  string
	}{
		{"A100-40GB", Need{MemoryMiB: 4000}, "1g.5gb"},
		{"A100-40GB", Need{MemoryMiB: 9000}, "1g.10gb"},
		{"A100-40GB", Need{MemoryMiB: 9000, Cores: 20}, "2g.10gb"},
		{"A100-40GB", Need{MemoryMiB: 19968, Cores: 50}, "4g.20gb"},
		{"A100-40GB", Need{MemoryMiB: 30000}, "7g.40gb"},
		{"A100-80GB", Need{MemoryMiB: 9728}, "1g.10gb"},
		{"A100-80GB", Need{MemoryMiB: 9729}, "1g.20gb"},
		{"A100-80GB", Need{MemoryMiB: 30000, Cores: 30}, "3g.40gb"},
		{"A100-80GB", Need{MemoryMiB: 80896}, "7g.80gb"},
		{"A100-80GB", Need{MemoryMiB: 80897}, ""},
		{"H100-80GB", Need{Cores: 12}, "1g.10gb"},  // 16 of 132 SMs = 12.1 %
		{"H100-80GB", Need{Cores: 13}, "1g.20gb"},  // 26 SMs = 19.7 %, one compute slice
		{"H100-80GB", Need{Cores: 20}, "2g.20gb"},  // 32 SMs = 24.2 %
		{"H100-80GB", Need{Cores: 46}, "4g.40gb"},  // 3g has 60 SMs = 45.5 %
		{"H100-80GB", Need{Cores: 100}, "7g.80gb"}, // the full profile has every SM
		{"H200-141GB", Need{MemoryMiB: 17000}, "1g.18gb"},
		{"H200-141GB", Need{MemoryMiB: 18000}, "1g.35gb"},
		{"H200-141GB", Need{MemoryMiB: 40000, Cores: 40}, "3g.71gb"},
		{"H200-141GB", Need{MemoryMiB: 100000}, "7g.141gb"},
		{"A30-24GB", Need{MemoryMiB: 5000}, "1g.6gb"},
		{"A30-24GB", Need{MemoryMiB: 6000}, "2g.12gb"},
		{"A30-24GB", Need{Cores: 30}, "2g.12gb"},
		{"A30-24GB", Need{Cores: 51}, "4g.24gb"},
		{"A30-24GB", Need{MemoryMiB: 24000}, ""},
	} {
		m := model(t, tc.model)
		c, ok := m.Choose(nil, tc.need)
		got := ""
		if ok {
			got = c.Profile.Name
		}
		if got != tc.want {
			t.Errorf("%s: Choose(%+v) = %q, want %q", tc.model, tc.need, got, tc.want)
		}
	}
}

// TestFillPerModel: on every model, the smallest profile fills the GPU to
// its documented count; the full profile then cannot be placed and the
// explanation names instances that block it; removing every instance lets
// it in.
func TestFillPerModel(t *testing.T) {
	for i := range Models {
		m := &Models[i]
		small := m.bySize()[0]
		var insts []Instance
		for range small.MaxInstances {
			c, ok := m.Choose(insts, Need{MemoryMiB: small.MemoryMiB})
			if !ok || c.Profile != small {
				t.Fatalf("%s: instance %d beside %v: %v %v", m.Name, len(insts), insts, c, ok)
			}
			insts = append(insts, c.Instance())
		}
		if _, ok := m.Choose(insts, Need{MemoryMiB: small.MemoryMiB}); ok {
			t.Errorf("%s: more than %d %s instances", m.Name, small.MaxInstances, small.Name)
		}
		full := m.Full()
		need := Need{MemoryMiB: full.MemoryMiB}
		msg := m.Explain(insts, need)
		if !strings.Contains(msg, full.Name) || !strings.Contains(msg, insts[0].String()) {
			t.Errorf("%s: explanation %q names neither %s nor %s", m.Name, msg, full.Name, insts[0])
		}
		if c, ok := m.Choose(nil, need); !ok || c.Profile != full || c.Start != 0 {
			t.Errorf("%s: full profile on an empty GPU: %v %v", m.Name, c, ok)
		}
	}
}

// TestProfileLookups: NVML constants and IDs find the documented profile.
func TestProfileLookups(t *testing.T) {
	a100 := model(t, "A100-40GB")
	if p, ok := a100.ProfileByNVML(NVMLProfile1SliceRev2); !ok || p.Name != "1g.10gb" {
		t.Errorf("ProfileByNVML(1SliceRev2) = %v", p)
	}
	if p, ok := a100.ProfileByID(14); !ok || p.Name != "2g.10gb" {
		t.Errorf("ProfileByID(14) = %v", p)
	}
	if a100.MaxInstances() != 7 || model(t, "A30-24GB").MaxInstances() != 4 {
		t.Error("MaxInstances")
	}
	if got := a100.CorePercent(mustProfile(t, a100, "3g.20gb")); got != 38 {
		t.Errorf("3g.20gb cores %d%%, want 38", got)
	}
}
