package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testenv"
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
	p, _ := newTestPlugin(t, api.ClusterConfig{PlacementPolicy: string(api.NodeBinpack)}, reversed...)
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
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), NarrowedRetry) {
		t.Fatalf("PostFilter of a narrowed pod: %v, want UnschedulableAndUnresolvable (no preemption among the candidates) %q", st, NarrowedRetry)
	}
	if len(activated) != 1 {
		t.Fatalf("pod not activated for its retry: %v", activated)
	}
	retry := framework.NewCycleState()
	res, st = p.PreFilter(context.Background(), retry, pod, nil)
	if st != nil || !res.AllNodes() {
		t.Fatalf("retry narrowed again: %v %v", res, st)
	}
	// The retry's PostFilter lets the chain go on (the DRA claim
	// clean-up, preemption over every node).
	if _, st = p.PostFilter(context.Background(), retry, pod, nil); st.Code() != fwk.Unschedulable {
		t.Fatalf("PostFilter of the retry: %v, want Unschedulable", st)
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

// TestCandidatesRespectPodsNodeRules: the candidates are the policy's
// best among the nodes the pod's nodeSelector, required node affinity
// and tolerations allow (kube-scheduler's NodeAffinity and
// TaintToleration filters), not among all nodes: a pod pinned outside the
// policy's first Candidates choices gets its node as a candidate, and
// nodes with a taint it does not tolerate are none.
func TestCandidatesRespectPodsNodeRules(t *testing.T) {
	var nodes []*corev1.Node
	for i := range Candidates + 4 {
		nodes = append(nodes, a100Node(fmt.Sprintf("n%02d", i), 1))
	}
	last := nodes[len(nodes)-1]
	last.Labels["pool"] = "pinned"
	// The first Candidates nodes are the policy's first choices (empty
	// nodes tie; their names break ties); taint them all
	// but n00.
	for _, n := range nodes[1:Candidates] {
		n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "train", Effect: corev1.TaintEffectNoSchedule}}
	}
	nodes[1].Spec.Taints[0].Effect = corev1.TaintEffectPreferNoSchedule // only a preference
	// n16 is cordoned (no taint: NodeUnschedulable checks the field).
	nodes[Candidates].Spec.Unschedulable = true
	p, infos := newTestPlugin(t, api.ClusterConfig{}, nodes...)
	var list []fwk.NodeInfo
	for _, n := range nodes {
		list = append(list, infos[n.Name])
	}
	candidatesOf := func(pod *corev1.Pod) []string {
		t.Helper()
		res, st := p.PreFilter(context.Background(), framework.NewCycleState(), pod, list)
		if st != nil {
			t.Fatal(st)
		}
		if res.AllNodes() {
			t.Fatalf("PreFilter of %s did not narrow", pod.Name)
		}
		return sets.List(res.NodeNames)
	}
	base := func(name string) *fixtures.PodWrapper {
		return fixtures.MakePod().Name(name).UID("u-"+name).Container("main", shareRequest())
	}
	plain := candidatesOf(base("plain").Obj())
	want := []string{"n00", "n01"}
	for i := Candidates + 1; i < len(nodes); i++ {
		want = append(want, nodes[i].Name)
	}
	if !slices.Equal(plain, want) {
		t.Errorf("candidates of a pod without tolerations: %v, want %v (n02-n15 have a NoSchedule taint it does not tolerate, n16 is cordoned)", plain, want)
	}
	tolerates := base("tolerates").Obj()
	tolerates.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	if got := candidatesOf(tolerates); len(got) != Candidates || slices.Contains(got, last.Name) {
		t.Errorf("candidates of a pod tolerating the taint: %v, want the first %d nodes", got, Candidates)
	}
	// A CPU-only pod (cpuonly.go) gets the same rules.
	cpu := fixtures.MakePod().Name("cpu").UID("u-cpu").Container("main", map[string]string{"cpu": "1"}).Obj()
	cpu.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists}}
	if got, want := candidatesOf(cpu), []string{"n00", "n01", "n16", "n17", "n18", "n19"}; !slices.Equal(got, want) {
		t.Errorf("candidates of a CPU-only pod tolerating a cordon: %v, want %v", got, want)
	}
	bySelector := base("selector").Obj()
	bySelector.Spec.NodeSelector = map[string]string{"pool": "pinned"}
	if got := candidatesOf(bySelector); !slices.Equal(got, []string{last.Name}) {
		t.Errorf("candidates of a pod with nodeSelector pool=pinned: %v, want [%s]", got, last.Name)
	}
	byAffinity := base("affinity").Obj()
	byAffinity.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{last.Name, "n05"}}},
		}}}}}
	if got := candidatesOf(byAffinity); !slices.Equal(got, []string{last.Name}) {
		t.Errorf("candidates of a pod with required affinity to %s and n05 (tainted): %v, want [%s]", last.Name, got, last.Name)
	}
}

// TestPinnedPodBoundInOneCycle runs kube-scheduler with the shipped
// profile: a pod whose nodeSelector matches only a node outside the
// policy's first Candidates choices is bound there at its first attempt,
// without the narrowed retry (a failed cycle and FailedScheduling event).
func TestPinnedPodBoundInOneCycle(t *testing.T) {
	var objs []runtime.Object
	for i := range Candidates + 4 {
		objs = append(objs, a100Node(fmt.Sprintf("n%02d", i), 1))
	}
	ts := newTestScheduler(t, nil, objs...)
	ts.waitNodes(len(objs))
	// The node to pin to: one the policy does not rank among its first
	// Candidates for this pod shape.
	pod := fixtures.MakePod().Name("pinned").Container("main", shareRequest()).Obj()
	free := ts.candidates(pod)
	target := ""
	for i := range Candidates + 4 {
		if n := fmt.Sprintf("n%02d", i); !free.Has(n) {
			target = n
		}
	}
	if free.Len() != Candidates || target == "" {
		t.Fatalf("candidates %v: want %d of %d nodes", sets.List(free), Candidates, Candidates+4)
	}
	node, err := ts.client.CoreV1().Nodes().Get(ts.ctx, target, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Labels["pool"] = "pinned"
	if _, err := ts.client.CoreV1().Nodes().Update(ts.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the label in kube-scheduler's cache", 10*time.Second, func() bool {
		ni := ts.sched.Cache.Dump().Nodes[target]
		return ni != nil && ni.Node().Labels["pool"] == "pinned"
	})
	retries := ts.countActivations()
	pod.Spec.NodeSelector = map[string]string{"pool": "pinned"}
	if got, msg := ts.schedule(pod); got != target {
		t.Fatalf("pinned pod bound to %q (%s), want %s", got, msg, target)
	}
	if n := retries(); n != 0 {
		t.Errorf("the pinned pod was retried over all nodes %d times, want 0 (bound at its first attempt)", n)
	}
	if evs := ts.events("pinned", "FailedScheduling"); len(evs) != 0 {
		t.Errorf("FailedScheduling events for a pod bound at its first attempt: %v", evs)
	}
}

// TestNarrowedAttemptPreemptsNothing runs kube-scheduler with the shipped
// profile: the policy's Candidates nodes all run a low-priority pod
// holding the host port the new pod asks, and the one other node is
// free. The narrowed attempt fails NodePorts on every candidate; its
// PostFilter must stop the chain before DefaultPreemption, which would
// otherwise evict a low-priority pod from a candidate although the pod
// fits the free node without evicting anyone. The pod is bound to the
// free node at its retry over all nodes, and no pod is evicted.
func TestNarrowedAttemptPreemptsNothing(t *testing.T) {
	var objs []runtime.Object
	for i := range Candidates + 1 {
		objs = append(objs, a100Node(fmt.Sprintf("n%02d", i), 1))
	}
	ts := newTestScheduler(t, nil, objs...)
	ts.waitNodes(len(objs))
	hostPort := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080, Protocol: corev1.ProtocolTCP}}
		return p
	}
	high := int32(1000)
	pod := hostPort(fixtures.MakePod().Name("web").Container("main", shareRequest()).Obj())
	pod.Spec.Priority = &high
	cands := ts.candidates(pod)
	if cands.Len() != Candidates {
		t.Fatalf("candidates %v, want %d of %d nodes", sets.List(cands), Candidates, Candidates+1)
	}
	// A low-priority pod without requests (the policy's view of the
	// nodes does not change) holds the port on every candidate.
	low := int32(0)
	for _, n := range sets.List(cands) {
		v := hostPort(fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("low-"+n).UID("uid-low-"+n).
			SchedulerName(api.SchedulerName).Node(n).Container("main", nil).Obj())
		v.Spec.Priority = &low
		ts.create(v)
	}
	ts.waitCachedPods(Candidates)
	testenv.WaitFor(t, "the low-priority pods in the plugin's state", 10*time.Second, func() bool {
		ts.plugin.st.mu.RLock()
		defer ts.plugin.st.mu.RUnlock()
		return len(ts.plugin.st.holders) == Candidates
	})
	if again := ts.candidates(pod); !again.Equal(cands) {
		t.Fatalf("the low-priority pods changed the candidates: %v, were %v", sets.List(again), sets.List(cands))
	}
	ts.create(pod)
	if node := ts.waitBound(metav1.NamespaceDefault, "web"); cands.Has(node) {
		t.Errorf("pod bound to %s, want the free node (not one of the candidates %v)", node, sets.List(cands))
	}
	for _, a := range ts.client.Actions() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "pods" {
			t.Errorf("pod %s evicted by preemption although the pod fit a free node", a.(k8stesting.DeleteAction).GetName())
		}
	}
	if evs := ts.events("web", "Preempted"); len(evs) != 0 {
		t.Errorf("preemption events: %v", evs)
	}
}
