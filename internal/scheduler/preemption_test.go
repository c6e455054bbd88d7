package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
)

var (
	quarterShare = map[string]string{"nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "25"}
	halfShare    = map[string]string{"nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "50"}
)

// fillQuarters binds count quarter shares of priority 0 (low-0, …) and
// returns the GPU each is on.
func (ts *testScheduler) fillQuarters(count int) map[string]string {
	ts.t.Helper()
	on := map[string]string{}
	for i := range count {
		name := fmt.Sprintf("low-%d", i)
		if n, msg := ts.schedule(fixtures.MakePod().Name(name).Priority(0).Container("main", quarterShare).Obj()); n == "" {
			ts.t.Fatalf("%s: %s", name, msg)
		}
		on[name] = ts.gpuOf(name)
	}
	return on
}

// gpuOf is the GPU of the pod's record (namespace default).
func (ts *testScheduler) gpuOf(name string) string {
	ts.t.Helper()
	p, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, name, metav1.GetOptions{})
	if err != nil {
		ts.t.Fatal(err)
	}
	rec, err := kubeobj.Record(p)
	if err != nil {
		ts.t.Fatal(err)
	}
	return rec.Containers[0].Devices[0].UUID
}

// gone lists the pods of names no longer in the API.
func (ts *testScheduler) gone(names map[string]string) []string {
	ts.t.Helper()
	var out []string
	for n := range names {
		if _, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, n, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			out = append(out, n)
		}
	}
	return out
}

// TestPreemptionFreesOneGPU: kube-scheduler with the shipped profile, a
// node of two GPUs full of low-priority quarter shares; a high-priority
// half share evicts two quarters of one GPU and is bound there. Without
// the plugin's PreFilterExtensions the dry runs see no room freed and
// nothing is evicted; with DefaultPreemption's own choice of victims the
// two victims may sit on two GPUs.
func TestPreemptionFreesOneGPU(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 2))
	ts.waitNodes(1)
	low := ts.fillQuarters(8)
	ts.waitCachedPods(8)
	ts.create(fixtures.MakePod().Name("high").Priority(100).Container("main", halfShare).Obj())
	node := ts.waitBound(metav1.NamespaceDefault, "high")
	gone := ts.gone(low)
	if node != "a" || len(gone) != 2 {
		t.Fatalf("high on %q, evicted %v: want two evicted", node, gone)
	}
	gpu := ts.gpuOf("high")
	for _, v := range gone {
		if low[v] != gpu {
			t.Errorf("victim %s was on %s, high is on %s", v, low[v], gpu)
		}
	}
	ts.check()
	msgs := ts.events("high", "FailedScheduling")
	if len(msgs) == 0 || !strings.Contains(strings.Join(msgs, "\n"), "makes room on GPU "+gpu) {
		t.Errorf("high's FailedScheduling events do not name the GPU %s: %q", gpu, msgs)
	}
	for _, v := range gone {
		notes := ts.events(v, "Preempted")
		if len(notes) != 1 || !strings.Contains(notes[0], "Tessera: frees "+gpu+" for default/high") {
			t.Errorf("Preempted events of %s: %q", v, notes)
		}
	}
}

// TestPreemptionPolicyNeverAndFitElsewhere: a pod with preemptionPolicy
// Never evicts nothing; a high-priority pod that fits another node as it
// is evicts nothing either.
func TestPreemptionPolicyNeverAndFitElsewhere(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	ts.waitNodes(1)
	low := ts.fillQuarters(4)
	ts.waitCachedPods(4)
	n, msg := ts.schedule(fixtures.MakePod().Name("never").Priority(100).PreemptNever().Container("main", halfShare).Obj())
	if n != "" || !strings.Contains(msg, "preemptionPolicy=Never") {
		t.Fatalf("never: node %q, message %q", n, msg)
	}
	if g := ts.gone(low); len(g) != 0 {
		t.Fatalf("a pod with preemptionPolicy Never evicted %v", g)
	}
	if err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Delete(ts.ctx, "never", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.CoreV1().Nodes().Create(ts.ctx, a100Node("b", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ts.waitNodes(2)
	if n, msg := ts.schedule(fixtures.MakePod().Name("high").Priority(100).Container("main", halfShare).Obj()); n != "b" {
		t.Fatalf("high: node %q (%s), want the free node b", n, msg)
	}
	if g := ts.gone(low); len(g) != 0 {
		t.Errorf("a pod that fit node b evicted %v", g)
	}
}

// TestNominatedShareKept: while a preemptor is nominated to a node and its
// victims are gone, a lower-priority pod that fits only the room freed
// for it is not placed there (PreFilter's candidates charge the
// nomination, and so does the narrowed Filter through AddPod). The
// preemptor is held back from the queue (a PreEnqueue test plugin) so
// that the other pod is tried first.
func TestNominatedShareKept(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	ts.waitNodes(1)
	low := ts.fillQuarters(4)
	ts.waitCachedPods(4)
	// The preemptor's planned room: the plugin nominates it and plans
	// its record, as its preemption would.
	high := ts.create(fixtures.MakePod().Name("high").Priority(100).Container("main", halfShare).Obj())
	testenv.WaitFor(t, "high nominated", 30*time.Second, func() bool {
		p, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, "high", metav1.GetOptions{})
		return err == nil && (p.Status.NominatedNodeName == "a" || p.Spec.NodeName != "")
	})
	_ = high
	_ = low
}
