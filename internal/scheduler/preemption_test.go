package scheduler

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8stesting "k8s.io/client-go/testing"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/testenv/schedhold"
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

// TestPreemptionPDB: the two quarters a half share would evict are
// covered by a PodDisruptionBudget that allows no disruption: two others,
// again of one GPU, are evicted instead.
func TestPreemptionPDB(t *testing.T) {
	zero := intstr.FromInt32(0)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "keep"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"keep": "yes"}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, ExpectedPods: 2, CurrentHealthy: 2, DesiredHealthy: 2},
	}
	ts := newTestScheduler(t, nil, a100Node("a", 2), pdb)
	ts.waitNodes(1)
	low := map[string]string{}
	for i := range 8 {
		name := fmt.Sprintf("low-%d", i)
		w := fixtures.MakePod().Name(name).Priority(0).Container("main", quarterShare)
		if i == 2 || i == 3 {
			// The least important pods of the first GPU: the victims
			// without the budget (TestPreemptionFreesOneGPU).
			w = w.Label("keep", "yes")
		}
		if n, msg := ts.schedule(w.Obj()); n == "" {
			t.Fatalf("%s: %s", name, msg)
		}
		low[name] = ts.gpuOf(name)
	}
	ts.waitCachedPods(8)
	ts.create(fixtures.MakePod().Name("high").Priority(100).Container("main", halfShare).Obj())
	ts.waitBound(metav1.NamespaceDefault, "high")
	gone := ts.gone(low)
	sort.Strings(gone)
	if len(gone) != 2 || slices.Contains(gone, "low-2") || slices.Contains(gone, "low-3") || low[gone[0]] != low[gone[1]] {
		t.Fatalf("evicted %v, want two pods of one GPU, neither low-2 nor low-3 (the budget's)", gone)
	}
	if gpu := ts.gpuOf("high"); low[gone[0]] != gpu {
		t.Errorf("high on %s, the victims were on %s", gpu, low[gone[0]])
	}
	ts.check()
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

// holdProfile enables the test plugin schedhold in the profile: at
// preEnqueue, first at preFilter and postFilter, at reserve.
func holdProfile(prof *schedconfig.KubeSchedulerProfile) {
	pl := prof.Plugins
	pl.PreEnqueue.Enabled = append(pl.PreEnqueue.Enabled, schedconfig.Plugin{Name: schedhold.Name})
	pl.PreFilter.Enabled = append([]schedconfig.Plugin{{Name: schedhold.Name}}, pl.PreFilter.Enabled...)
	pl.PostFilter.Enabled = append([]schedconfig.Plugin{{Name: schedhold.Name}}, pl.PostFilter.Enabled...)
	pl.Reserve.Enabled = append(pl.Reserve.Enabled, schedconfig.Plugin{Name: schedhold.Name})
}

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// gracefulDeletes makes the fake API server delete pods as a real one
// deletes bound pods: it marks them (deletionTimestamp) and the pods stay
// until finish removes them, the kubelet's part once their containers
// have stopped.
func (ts *testScheduler) gracefulDeletes() {
	ts.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteAction)
		obj, err := ts.client.Tracker().Get(podsGVR, d.GetNamespace(), d.GetName())
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if pod.DeletionTimestamp == nil {
			now := metav1.Now()
			pod.DeletionTimestamp = &now
			if err := ts.client.Tracker().Update(podsGVR, pod, pod.Namespace); err != nil {
				return true, nil, err
			}
		}
		return true, nil, nil
	})
}

// terminating lists the pods of names being deleted.
func (ts *testScheduler) terminating(names map[string]string) []string {
	ts.t.Helper()
	var out []string
	for n := range names {
		p, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, n, metav1.GetOptions{})
		if err == nil && p.DeletionTimestamp != nil {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// finish removes the pods (namespace default) from the fake API server.
func (ts *testScheduler) finish(names ...string) {
	ts.t.Helper()
	for _, n := range names {
		if err := ts.client.Tracker().Delete(podsGVR, metav1.NamespaceDefault, n); err != nil {
			ts.t.Fatal(err)
		}
	}
}

// TestNominatedShareKept: a node of one GPU full of quarter shares; a
// high-priority half share preempts two, which terminate (gracefully)
// while it waits, nominated to the node. A priority-0 pod asking the same
// half share, created meanwhile, must not get the room once the victims
// are gone, although the preemptor is held out of the queue when the
// room frees (as DefaultPreemption's PreEnqueue holds a preemptor while
// its asynchronous preemption runs): PreFilter's candidates charge the
// nomination, and so does Filter through AddPod. Then the preemptor is
// bound there.
func TestNominatedShareKept(t *testing.T) {
	hold, reg := schedhold.New()
	ts := newTestSchedulerWith(t, reg, holdProfile, a100Node("a", 1))
	ts.gracefulDeletes()
	ts.waitNodes(1)
	low := ts.fillQuarters(4)
	ts.waitCachedPods(4)
	ts.create(fixtures.MakePod().Name("high").Priority(100).Container("main", halfShare).Obj())
	var victims []string
	testenv.WaitFor(t, "two victims terminating and high nominated", 30*time.Second, func() bool {
		p, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, "high", metav1.GetOptions{})
		victims = ts.terminating(low)
		return err == nil && p.Status.NominatedNodeName == "a" && len(victims) == 2
	})
	if err := hold.Hold(ts.ctx, "default/high", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ts.create(fixtures.MakePod().Name("mid").Priority(0).Container("main", halfShare).Obj())
	if node, err := hold.WaitAttempt(ts.ctx, "default/mid", 0, 30*time.Second); err != nil || node != "" {
		t.Fatalf("mid, while the victims terminate: placed on %q (%v)", node, err)
	}
	ts.finish(victims...)
	// Once the plugin has released the victims, mid is tried again (an
	// attempt that starts after the release).
	testenv.WaitFor(t, "the victims released", 30*time.Second, func() bool {
		ts.plugin.st.mu.RLock()
		defer ts.plugin.st.mu.RUnlock()
		for _, v := range victims {
			if _, held := ts.plugin.st.holders["default/"+v]; held {
				return false
			}
		}
		return true
	})
	tried := hold.Started("default/mid")
	if err := hold.Kick("default/mid"); err != nil {
		t.Fatal(err)
	}
	node, err := hold.WaitAttempt(ts.ctx, "default/mid", tried, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if node != "" {
		t.Fatalf("mid (priority 0) took the room freed for high (priority 100) on %s", node)
	}
	if ts.plugin.wide(types.UID("uid-default-mid")) {
		// Its candidates were [a], which the narrowed Filter then
		// refused: PreFilter did not charge the nomination.
		t.Error("mid's candidates all failed a Filter (its attempt was retried over every node)")
	}
	hold.Release("default/high")
	if n := ts.waitBound(metav1.NamespaceDefault, "high"); n != "a" {
		t.Fatalf("high bound to %s", n)
	}
	if n := hold.Placed("default/mid"); n != "" {
		t.Errorf("mid placed on %s", n)
	}
	ts.check()
}

// TestPDBProtectedInOrder: a budget that allows one disruption protects
// the second of its pods, in the order given (most important first), as
// DefaultPreemption counts; a pod the budget counts as disrupted already
// costs it nothing, and an empty selector matches no pod.
func TestPDBProtectedInOrder(t *testing.T) {
	pod := func(name string, labels map[string]string) fwk.PodInfo {
		w := fixtures.MakePod().Namespace("ns").Name(name)
		for k, v := range labels {
			w = w.Label(k, v)
		}
		pi, err := framework.NewPodInfo(w.Obj())
		if err != nil {
			t.Fatal(err)
		}
		return pi
	}
	app := map[string]string{"app": "x"}
	one := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "one"},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: app}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1, DisruptedPods: map[string]metav1.Time{"gone": metav1.Now()}},
	}
	empty := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "empty"}, Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{}}}
	got := pdbProtected([]fwk.PodInfo{pod("gone", app), pod("a", app), pod("other", nil), pod("b", app)}, []*policyv1.PodDisruptionBudget{one, empty})
	if want := []bool{false, false, false, true}; !slices.Equal(got, want) {
		t.Errorf("protected %v, want %v", got, want)
	}
}
