package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func shareRequest() map[string]string {
	return map[string]string{names.GPU: "1", names.Memory: "10000"}
}

// TestPreFilterNarrowsToThePolicysBest: PreFilter searches every node and
// hands kube-scheduler the policy's best Candidates nodes (ties in name
// order, whatever order the informers delivered the nodes in), so that the
// policy chooses among all nodes, not among kube-scheduler's sample; the
// node binpack prefers (a share already taken) is among them however late
// its name sorts.
func TestPreFilterNarrowsToThePolicysBest(t *testing.T) {
	var nodes, reversed []*corev1.Node
	for i := range Candidates + 8 {
		nodes = append(nodes, a100Node(fmt.Sprintf("n%02d", i), 1))
	}
	for i := range nodes {
		reversed = append(reversed, nodes[len(nodes)-1-i])
	}
	p, _ := newTestPlugin(t, api.ClusterConfig{}, reversed...)
	last := nodes[len(nodes)-1].Name
	first := fixtures.MakePod().Name("first").UID("u-first").Container("main", shareRequest()).Obj()
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(context.Background(), cs, first, nil); st != nil {
		t.Fatal(st)
	}
	if st := p.Reserve(context.Background(), cs, first, last); st != nil {
		t.Fatal(st)
	}
	pod := fixtures.MakePod().Name("second").UID("u-second").Container("main", shareRequest()).Obj()
	cs = framework.NewCycleState()
	res, st := p.PreFilter(context.Background(), cs, pod, nil)
	if st != nil {
		t.Fatal(st)
	}
	if res == nil || res.AllNodes() {
		t.Fatalf("PreFilter did not narrow the nodes: %+v", res)
	}
	if len(res.NodeNames) != Candidates {
		t.Fatalf("%d candidates, want %d: %v", len(res.NodeNames), Candidates, res.NodeNames.UnsortedList())
	}
	// binpack's best (the node already used), then the first nodes by
	// name.
	want := []string{last}
	for i := range Candidates - 1 {
		want = append(want, nodes[i].Name)
	}
	for _, n := range want {
		if !res.NodeNames.Has(n) {
			t.Errorf("candidate %s missing: %v", n, res.NodeNames.UnsortedList())
		}
	}
	// Score keeps the choice: the used node scores highest.
	ni := framework.NewNodeInfo()
	ni.SetNode(nodes[len(nodes)-1])
	best, _ := p.Score(context.Background(), cs, pod, ni)
	ni0 := framework.NewNodeInfo()
	ni0.SetNode(nodes[0])
	if st := p.Filter(context.Background(), cs, pod, ni0); st != nil {
		t.Fatalf("Filter rejected a candidate: %v", st)
	}
	other, _ := p.Score(context.Background(), cs, pod, ni0)
	if best <= other {
		t.Errorf("score of the used node %d, of an empty one %d: binpack prefers the used one", best, other)
	}
}

// TestPreFilterNoNarrowingWhenNothingFits: a pod no node fits is not
// narrowed, so Filter runs on every node and explains each failure.
func TestPreFilterNoNarrowingWhenNothingFits(t *testing.T) {
	p, _ := newTestPlugin(t, api.ClusterConfig{}, a100Node("a", 1), a100Node("b", 1))
	pod := fixtures.MakePod().Name("big").UID("u-big").Container("main", map[string]string{names.GPU: "2"}).Obj()
	res, st := p.PreFilter(context.Background(), framework.NewCycleState(), pod, nil)
	if st != nil {
		t.Fatal(st)
	}
	if !res.AllNodes() {
		t.Fatalf("narrowed to %v although no node fits", res.NodeNames.UnsortedList())
	}
}

// TestNarrowedPodRetriedOverAllNodes: when every candidate fails a
// Filter (another plugin's, here simulated by PostFilter being reached),
// the pod is activated at once and its next attempt is not narrowed, so
// a pod that fits some other node is never stuck; once bound or deleted
// (forget) a pod of the same name is narrowed again.
func TestNarrowedPodRetriedOverAllNodes(t *testing.T) {
	p, _ := newTestPlugin(t, api.ClusterConfig{}, a100Node("a", 1), a100Node("b", 1))
	var activated []string
	p.activate = func(_ klog.Logger, pods map[string]*corev1.Pod) {
		for k := range pods {
			activated = append(activated, k)
		}
	}
	pod := fixtures.MakePod().Name("p").UID("u-p").Container("main", shareRequest()).Obj()
	cs := framework.NewCycleState()
	res, st := p.PreFilter(context.Background(), cs, pod, nil)
	if st != nil || res.AllNodes() {
		t.Fatalf("first attempt not narrowed: %v %v", res, st)
	}
	_, st = p.PostFilter(context.Background(), cs, pod, nil)
	if st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), NarrowedRetry) {
		t.Fatalf("PostFilter of a narrowed pod: %v, want Unschedulable %q", st, NarrowedRetry)
	}
	if len(activated) != 1 {
		t.Fatalf("pod not activated for its retry: %v", activated)
	}
	res, st = p.PreFilter(context.Background(), framework.NewCycleState(), pod, nil)
	if st != nil || !res.AllNodes() {
		t.Fatalf("retry narrowed again: %v %v", res, st)
	}
	p.forget(pod.UID)
	res, _ = p.PreFilter(context.Background(), framework.NewCycleState(), pod, nil)
	if res.AllNodes() {
		t.Fatal("a forgotten pod is not narrowed again")
	}
}

// TestPolicySeesNodeCPUAndMemory: the placement core holds each node's
// allocatable CPU and memory, so the policy (and PreFilter's candidates)
// leave out a node whose CPU the pod's request exceeds, as the simulator
// does, instead of leaving that to NodeResourcesFit on a sample.
func TestPolicySeesNodeCPUAndMemory(t *testing.T) {
	small := a100Node("small", 1)
	small.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	p, _ := newTestPlugin(t, api.ClusterConfig{}, small, a100Node("big", 1))
	req := shareRequest()
	req["cpu"] = "4"
	pod := fixtures.MakePod().Name("p").UID("u-p").Container("main", req).Obj()
	res, st := p.PreFilter(context.Background(), framework.NewCycleState(), pod, nil)
	if st != nil {
		t.Fatal(st)
	}
	if res.AllNodes() || res.NodeNames.Has("small") || !res.NodeNames.Has("big") {
		t.Fatalf("candidates %v, want only big (small has 2 CPUs allocatable, the pod asks 4)", res)
	}
}

// TestCPUOnlyPodPlacedByPolicy: a pod that asks no GPU is narrowed to the
// policy's candidates by its CPU and memory (as the simulator places a
// trace's CPU-only tasks), Reserve charges its CPU so the next pod sees
// it, and it gets no record: PreBind and Bind leave it to DefaultBinder.
func TestCPUOnlyPodPlacedByPolicy(t *testing.T) {
	small := a100Node("small", 1)
	small.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	p, _ := newTestPlugin(t, api.ClusterConfig{}, small, a100Node("big", 1))
	pod := fixtures.MakePod().Name("cpu").UID("u-cpu").Container("main", map[string]string{"cpu": "4"}).Obj()
	cs := framework.NewCycleState()
	res, st := p.PreFilter(context.Background(), cs, pod, nil)
	if st != nil {
		t.Fatalf("PreFilter of a CPU-only pod: %v", st)
	}
	if res.AllNodes() || res.NodeNames.Has("small") || !res.NodeNames.Has("big") {
		t.Fatalf("candidates %v, want only big (small has 2 CPUs, the pod asks 4)", res)
	}
	if st := p.Reserve(context.Background(), cs, pod, "big"); st != nil {
		t.Fatal(st)
	}
	if got := p.st.cluster.Node("big").CPUUsed; got != 4000 {
		t.Errorf("big's CPU used after Reserve: %d, want 4000", got)
	}
	if st := p.Bind(context.Background(), cs, pod, "big"); st.Code() != fwk.Skip {
		t.Errorf("Bind of a CPU-only pod: %v, want Skip (DefaultBinder binds it, without a record)", st)
	}
	if _, st := p.PreBindPreFlight(context.Background(), cs, pod, "big"); st.Code() != fwk.Skip {
		t.Errorf("PreBindPreFlight of a CPU-only pod: %v, want Skip", st)
	}
	p.Unreserve(context.Background(), cs, pod, "big")
	if got := p.st.cluster.Node("big").CPUUsed; got != 0 {
		t.Errorf("big's CPU used after Unreserve: %d, want 0", got)
	}
}
