package scheduler

import (
	"context"
	"testing"

	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestNormalizeScoreKeepsThePolicysChoice: exactly one node gets the top
// score, and among nodes tied for the policy's best the node whose name
// sorts first wins (as the placement core's Search breaks ties on a node
// list in name order), whatever order the plugin saw the nodes in and
// kube-scheduler lists them in; kube-scheduler would otherwise pick among
// the tied nodes at random.
func TestNormalizeScoreKeepsThePolicysChoice(t *testing.T) {
	p, _ := newTestPlugin(t, api.ClusterConfig{}, a100Node("n2", 1), a100Node("n0", 1), a100Node("n3", 1), a100Node("n1", 1))
	for _, tc := range []struct {
		name   string
		scores fwk.NodeScoreList
		want   map[string]int64
	}{
		{"tie at the top", fwk.NodeScoreList{{Name: "n2", Score: 500}, {Name: "n1", Score: 500}, {Name: "n3", Score: 100}},
			map[string]int64{"n1": fwk.MaxScore, "n2": fwk.MaxScore - 1, "n3": 0}},
		{"all equal", fwk.NodeScoreList{{Name: "n3", Score: 7}, {Name: "n2", Score: 7}, {Name: "n0", Score: 7}},
			map[string]int64{"n0": fwk.MaxScore, "n2": fwk.MaxScore - 1, "n3": fwk.MaxScore - 1}},
		{"unique best", fwk.NodeScoreList{{Name: "n0", Score: 0}, {Name: "n1", Score: 999_999}, {Name: "n3", Score: 1_000_000}},
			map[string]int64{"n0": 0, "n1": fwk.MaxScore - 1, "n3": fwk.MaxScore}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if st := p.NormalizeScore(context.Background(), nil, nil, tc.scores); st != nil {
				t.Fatal(st)
			}
			for _, s := range tc.scores {
				if s.Score != tc.want[s.Name] {
					t.Errorf("%s: %d, want %d (all: %+v)", s.Name, s.Score, tc.want[s.Name], tc.scores)
				}
			}
		})
	}
}

// countingPolicy counts the pods a policy observes.
type countingPolicy struct {
	placement.Binpack
	observed int
}

func (c *countingPolicy) Observe(*placement.Compiled) { c.observed++ }

// TestRetriedPodObservedOnce: a pod that fit nowhere and is retried is
// learned once, not once per attempt; a new pod is learned again.
func TestRetriedPodObservedOnce(t *testing.T) {
	p, _ := newTestPlugin(t, api.ClusterConfig{}, a100Node("a", 1))
	pol := &countingPolicy{}
	p.policy = pol
	big := fixtures.MakePod().Name("big").UID("u-big").Container("main", map[string]string{names.GPU: "2"}).Obj()
	for range 3 {
		if _, st := p.PreFilter(context.Background(), framework.NewCycleState(), big, nil); st != nil {
			t.Fatal(st)
		}
	}
	if pol.observed != 1 {
		t.Fatalf("three attempts of one pod observed %d times, want 1", pol.observed)
	}
	other := fixtures.MakePod().Name("other").UID("u-other").Container("main", map[string]string{names.GPU: "1"}).Obj()
	if _, st := p.PreFilter(context.Background(), framework.NewCycleState(), other, nil); st != nil {
		t.Fatal(st)
	}
	// Deleted and recreated under the same name: a new pod.
	p.forget(big.UID)
	big2 := fixtures.MakePod().Name("big").UID("u-big-2").Container("main", map[string]string{names.GPU: "2"}).Obj()
	if _, st := p.PreFilter(context.Background(), framework.NewCycleState(), big2, nil); st != nil {
		t.Fatal(st)
	}
	if pol.observed != 3 {
		t.Fatalf("observed %d times, want 3 (big once, other, big recreated)", pol.observed)
	}
}

// fixedScores scores nodes by name.
type fixedScores struct {
	placement.Binpack
	score map[string]float64
}

func (f fixedScores) ScoreNode(_ *placement.Compiled, p *placement.Placement) float64 {
	return f.score[p.Node.Name]
}

// TestScoreKeepsSmallDifferences: nodes whose policy scores differ by
// far less than one millionth (tessera's CPU tie-break among multi-GPU
// placements moves a score by about 1e-10 per millicore) are not tied by
// Score's conversion to integers: the better one wins, as in the
// simulator, not the one whose name sorts first.
func TestScoreKeepsSmallDifferences(t *testing.T) {
	a, b := a100Node("a", 1), a100Node("b", 1)
	p, infos := newTestPlugin(t, api.ClusterConfig{}, a, b)
	p.policy = fixedScores{score: map[string]float64{"a": 97.5 - 3e-9, "b": 97.5 - 1e-9}}
	pod := fixtures.MakePod().Name("pod").UID("u-pod").Container("main", map[string]string{names.GPU: "1"}).Obj()
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(context.Background(), cs, pod, nil); st != nil {
		t.Fatal(st)
	}
	var scores fwk.NodeScoreList
	for _, n := range []string{"a", "b"} {
		if st := p.Filter(context.Background(), cs, pod, infos[n]); st != nil {
			t.Fatalf("%s: %v", n, st)
		}
		v, st := p.Score(context.Background(), cs, pod, infos[n])
		if st != nil {
			t.Fatal(st)
		}
		scores = append(scores, fwk.NodeScore{Name: n, Score: v})
	}
	if st := p.NormalizeScore(context.Background(), cs, pod, scores); st != nil {
		t.Fatal(st)
	}
	if scores[1].Score != fwk.MaxScore || scores[0].Score == fwk.MaxScore {
		t.Errorf("normalised scores %+v: b, 2e-9 better, must get %d alone", scores, fwk.MaxScore)
	}
}
