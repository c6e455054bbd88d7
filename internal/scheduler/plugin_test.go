package scheduler

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

func newTestPlugin(t *testing.T, cfg api.ClusterConfig, nodes ...*corev1.Node) (*Plugin, map[string]fwk.NodeInfo) {
	t.Helper()
	p, err := newPlugin(cfg)
	if err != nil {
		t.Fatal(err)
	}
	infos := map[string]fwk.NodeInfo{}
	for _, n := range nodes {
		p.st.upsertNode(klog.Background(), n)
		ni := framework.NewNodeInfo()
		ni.SetNode(n)
		infos[n.Name] = ni
	}
	return p, infos
}

// schedule runs the plugin's extension points the way kube-scheduler does
// and returns the chosen node, or "" and the PostFilter message.
func schedule(t *testing.T, p *Plugin, infos map[string]fwk.NodeInfo, order []string, pod *corev1.Pod) (string, string) {
	t.Helper()
	ctx := context.Background()
	cs := framework.NewCycleState()
	list := make([]fwk.NodeInfo, 0, len(order))
	for _, n := range order {
		list = append(list, infos[n])
	}
	if _, st := p.PreFilter(ctx, cs, pod, list); !st.IsSuccess() {
		if st.IsSkip() {
			return "skip", ""
		}
		return "", st.Message()
	}
	var feasible []string
	for _, n := range order {
		if st := p.Filter(ctx, cs, pod, infos[n]); st.IsSuccess() {
			feasible = append(feasible, n)
		}
	}
	if len(feasible) == 0 {
		_, st := p.PostFilter(ctx, cs, pod, nil)
		return "", st.Message()
	}
	scores := fwk.NodeScoreList{}
	for _, n := range feasible {
		s, st := p.Score(ctx, cs, pod, infos[n])
		if !st.IsSuccess() {
			t.Fatal(st)
		}
		scores = append(scores, fwk.NodeScore{Name: n, Score: s})
	}
	p.NormalizeScore(ctx, cs, pod, scores)
	best := scores[0]
	for _, s := range scores[1:] {
		if s.Score > best.Score {
			best = s
		}
	}
	if best.Score < 0 || best.Score > fwk.MaxScore {
		t.Fatalf("normalized score %d outside [0, %d]", best.Score, fwk.MaxScore)
	}
	if st := p.Reserve(ctx, cs, pod, best.Name); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	client := fake.NewSimpleClientset(pod)
	p.client = client
	if st := p.PreBind(ctx, cs, pod, best.Name); !st.IsSuccess() {
		t.Fatalf("PreBind: %v", st)
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := api.DecodeAllocation([]byte(got.Annotations[api.AnnotationAllocation]))
	if err != nil {
		t.Fatalf("record written by PreBind: %v", err)
	}
	if rec.Node != best.Name {
		t.Fatalf("record names node %s, chosen %s", rec.Node, best.Name)
	}
	return best.Name, ""
}

func gpuPod(name string, res map[string]string) *corev1.Pod {
	p := fixtures.Pod("default", name, SchedulerName, fixtures.Container("main", res))
	p.UID = types.UID("uid-" + name)
	return p
}

func TestBinpackAndSpread(t *testing.T) {
	a := fixtures.Node("a", fixtures.Inventory("a", 2, "NVIDIA A100-SXM4-40GB", 40960, 10), names)
	b := fixtures.Node("b", fixtures.Inventory("b", 2, "NVIDIA A100-SXM4-40GB", 40960, 10), names)
	p, infos := newTestPlugin(t, api.ClusterConfig{}, a, b)
	order := []string{"a", "b"}
	first, _ := schedule(t, p, infos, order, gpuPod("p1", map[string]string{"nvidia.com/gpumem": "10000"}))
	second, _ := schedule(t, p, infos, order, gpuPod("p2", map[string]string{"nvidia.com/gpumem": "10000"}))
	if first != second {
		t.Errorf("binpack put p1 on %s and p2 on %s, want the same node", first, second)
	}
	spread := gpuPod("p3", map[string]string{"nvidia.com/gpumem": "10000"})
	spread.Annotations = map[string]string{api.AnnotationNodePolicy: "spread"}
	if third, _ := schedule(t, p, infos, order, spread); third == first {
		t.Errorf("spread put p3 on the fuller node %s", third)
	}
	if err := p.st.cluster.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestUnschedulableMessage(t *testing.T) {
	var nodes []*corev1.Node
	var order []string
	for i, model := range []string{"NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "Tesla T4"} {
		name := string(rune('a' + i))
		mem := int64(40960)
		if model == "Tesla T4" {
			mem = 15360
		}
		nodes = append(nodes, fixtures.Node(name, fixtures.Inventory(name, 1, model, mem, 10), names))
		order = append(order, name)
	}
	p, infos := newTestPlugin(t, api.ClusterConfig{}, nodes...)
	// Fill the A100s half.
	for i := range 2 {
		fill := gpuPod("fill"+string(rune('0'+i)), map[string]string{"nvidia.com/gpumem": "20000"})
		fill.Annotations = map[string]string{api.AnnotationNodePolicy: "spread", api.AnnotationUseGPUType: "A100"}
		if n, msg := schedule(t, p, infos, order, fill); n == "" {
			t.Fatal(msg)
		}
	}
	big := gpuPod("big", map[string]string{"nvidia.com/gpumem": "30000"})
	node, msg := schedule(t, p, infos, order, big)
	if node != "" {
		t.Fatalf("placed on %s", node)
	}
	for _, want := range []string{"0/3 nodes fit", `2 container "main" no GPU with 30000 MiB free (largest 20960 MiB)`, `1 container "main" asks 30000 MiB per GPU but the largest GPU has 15360 MiB`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	sel := gpuPod("sel", map[string]string{"nvidia.com/gpumem": "1000"})
	sel.Annotations = map[string]string{"nvidia.com/use-gputype": "H100"}
	if _, msg := schedule(t, p, infos, order, sel); !strings.Contains(msg, "not selected by use-gputype=H100") {
		t.Errorf("message %q does not name the selector", msg)
	}
	bad := gpuPod("bad", map[string]string{"nvidia.com/gpucores": "150"})
	if _, msg := schedule(t, p, infos, order, bad); !strings.Contains(msg, "150") || !strings.Contains(msg, "100") {
		t.Errorf("invalid request message %q does not name value and limit", msg)
	}
}

func TestNonGPUPodSkips(t *testing.T) {
	p, infos := newTestPlugin(t, api.ClusterConfig{})
	if n, _ := schedule(t, p, infos, nil, fixtures.Pod("default", "cpu", "", fixtures.Container("c", map[string]string{"cpu": "1"}))); n != "skip" {
		t.Errorf("got %q, want skip", n)
	}
}

func TestRebuildFromRecordsAndRelease(t *testing.T) {
	n := fixtures.Node("a", fixtures.Inventory("a", 1, "NVIDIA A100-SXM4-40GB", 40960, 10), names)
	p, infos := newTestPlugin(t, api.ClusterConfig{}, n)
	pod := gpuPod("p1", map[string]string{"nvidia.com/gpumem": "30000"})
	if node, msg := schedule(t, p, infos, []string{"a"}, pod); node != "a" {
		t.Fatal(msg)
	}
	rec := p.st.cluster.Allocation("default/p1")
	data, _ := api.EncodeAllocation(rec)

	// A restarted plugin learns the allocation from the bound pod's record.
	q, infos := newTestPlugin(t, api.ClusterConfig{}, n)
	bound := pod.DeepCopy()
	bound.Spec.NodeName = "a"
	bound.Annotations = map[string]string{api.AnnotationAllocation: string(data)}
	q.st.observePod(klog.Background(), bound)
	if node, _ := schedule(t, q, infos, []string{"a"}, gpuPod("p2", map[string]string{"nvidia.com/gpumem": "30000"})); node != "" {
		t.Fatalf("p2 placed on %s although p1's record holds the memory", node)
	}
	// An unbound pod with a record (PreBind without binding) holds nothing.
	unbound := gpuPod("p3", nil)
	unbound.Annotations = map[string]string{api.AnnotationAllocation: string(data)}
	q.st.observePod(klog.Background(), unbound)
	if q.st.cluster.PodCount() != 1 {
		t.Fatalf("pods held: %d, want 1", q.st.cluster.PodCount())
	}
	// Terminated pods release.
	done := bound.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	if !q.st.observePod(klog.Background(), done) {
		t.Fatal("succeeded pod did not release")
	}
	if node, msg := schedule(t, q, infos, []string{"a"}, gpuPod("p2", map[string]string{"nvidia.com/gpumem": "30000"})); node != "a" {
		t.Fatalf("after release: %s", msg)
	}
	// Deletion (with a tombstone) releases too, and Unreserve is idempotent.
	q.st.deletePod(tombstone(gpuPod("p2", nil)))
	q.Unreserve(context.Background(), framework.NewCycleState(), gpuPod("p2", nil), "a")
	if q.st.cluster.PodCount() != 0 {
		t.Fatalf("pods held after delete: %d", q.st.cluster.PodCount())
	}
	if err := q.st.cluster.Check(); err != nil {
		t.Fatal(err)
	}
}

func tombstone(p *corev1.Pod) any { return cacheTombstone(p) }

func TestUnreserve(t *testing.T) {
	n := fixtures.Node("a", fixtures.Inventory("a", 1, "NVIDIA A100-SXM4-40GB", 40960, 10), names)
	p, infos := newTestPlugin(t, api.ClusterConfig{}, n)
	ctx := context.Background()
	pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, []fwk.NodeInfo{infos["a"]}); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Reserve(ctx, cs, pod, "a"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Filter(ctx, framework.NewCycleState(), pod, infos["a"]); !st.IsSuccess() {
		t.Fatal("Filter without PreFilter state must pass")
	}
	p.Unreserve(ctx, cs, pod, "a")
	p.Unreserve(ctx, cs, pod, "a")
	if got := p.st.cluster.Node("a").GPUs[0].Used; got != (placement.Usage{}) {
		t.Fatalf("GPU still charged after Unreserve: %+v", got)
	}
}

func TestBadArgs(t *testing.T) {
	if _, err := newPlugin(api.ClusterConfig{PlacementPolicy: "nope"}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("err = %v", err)
	}
}
