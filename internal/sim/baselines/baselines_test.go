package baselines

import (
	"testing"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/policies/policytest"
)

func TestBestFitScore(t *testing.T) {
	// 32000m CPU free, 1500m GPU free; the pod takes 8000m and 300m:
	// left = 24000/128000·0.5 + 1200/8000·0.5 = 0.16875 → int(83.125).
	n := policytest.Node(t, 64000, 32000, "T4", 1000, 500)
	if got := BestFitScore(n, policies.Shape{CPUMilli: 8000, NumGPU: 1, GPUMilli: 300}); got != 83 {
		t.Errorf("BestFitScore = %d, want 83", got)
	}
}

func TestDotProductScore(t *testing.T) {
	// dot = 32000/128000·8000/128000 + 1500/8000·300/8000 = 0.02265625;
	// score = int(100·(1 − dot/2)) = 98.
	n := policytest.Node(t, 64000, 32000, "T4", 1000, 500)
	if got := DotProductScore(n, policies.Shape{CPUMilli: 8000, NumGPU: 1, GPUMilli: 300}); got != 98 {
		t.Errorf("DotProductScore = %d, want 98", got)
	}
}

func TestGPUPackingScore(t *testing.T) {
	share := policies.Shape{CPUMilli: 1000, NumGPU: 1, GPUMilli: 300}
	whole := policies.Shape{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}
	cases := []struct {
		name string
		free []int64
		s    policies.Shape
		want int64
	}{
		{"idle 8-GPU node", []int64{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}, whole, 25}, // max(33−8, 8)
		{"share on a used GPU", []int64{1000, 500}, share, 95},                                  // 100 − 50/10
		{"whole GPU on a used node", []int64{1000, 500}, whole, 49},                             // 50 − 1
		{"CPU-only pod", []int64{1000, 500}, policies.Shape{CPUMilli: 1000}, 0},
	}
	for _, c := range cases {
		n := policytest.Node(t, 64000, 0, "T4", c.free...)
		if got := GPUPackingScore(n, c.s); got != c.want {
			t.Errorf("%s: GPUPackingScore = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestGPUClusteringScore(t *testing.T) {
	share := policies.Shape{NumGPU: 1, GPUMilli: 300}
	cases := []struct {
		name  string
		kinds map[string]int
		left  int64
		s     policies.Shape
		want  int64
	}{
		{"idle node", map[string]int{}, 8000, share, 25},
		{"only shares", map[string]int{"share-gpu": 2}, 4000, share, 87}, // 25·4000/8000 + 75
		{"shares among others", map[string]int{"share-gpu": 1, "1-gpu": 1}, 4000, share, 62},
		{"other kinds only", map[string]int{"1-gpu": 1}, 4000, share, 12},
		{"CPU-only pod", map[string]int{}, 8000, policies.Shape{CPUMilli: 1000}, 0},
	}
	for _, c := range cases {
		if got := GPUClusteringScore(c.kinds, c.left, c.s); got != c.want {
			t.Errorf("%s: GPUClusteringScore = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestRandomIsDeterministicPerSeed(t *testing.T) {
	n := policytest.Node(t, 64000, 0, "T4", 1000, 500)
	a, b := &Random{base: base{seed: 1}}, &Random{base: base{seed: 1}}
	for i := 0; i < 3; i++ {
		x, y := a.tie(n, i), b.tie(n, i)
		if x != y || x < 0 || x >= 0.5 {
			t.Fatalf("tie(%d) = %v and %v, want equal values in [0, 0.5)", i, x, y)
		}
	}
	if (&Random{base: base{seed: 2}}).tie(n, 0) == a.tie(n, 0) {
		t.Errorf("different seeds gave the same draw")
	}
}

// Every baseline is made by name and calls itself by it.
func TestAll(t *testing.T) {
	c := placement.NewCluster()
	for _, name := range []string{NameRandom, NameDotProduct, NameGPUClustering, NameGPUPacking, NameBestFit} {
		p, err := All().New(name, c, 1)
		if err != nil {
			t.Fatal(err)
		}
		if p.Name() != name {
			t.Errorf("policy %s calls itself %s", name, p.Name())
		}
	}
}

// The baselines score without a policy-wide lock, as the scheduler's
// policies do (policytest.ConcurrentScoringMatchesSerial). Run with -race.
func TestConcurrentScoringMatchesSerial(t *testing.T) {
	for _, e := range All() {
		t.Run(e.Name, func(t *testing.T) { policytest.ConcurrentScoringMatchesSerial(t, e.New) })
	}
}
