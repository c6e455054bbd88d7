package scheduler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

// newTestPlugin builds the plugin alone and feeds it the nodes, for tests
// of single extension points; whole scheduling cycles run in
// kube-scheduler (newTestScheduler).
func newTestPlugin(t testing.TB, cfg api.ClusterConfig, nodes ...*corev1.Node) (*Plugin, map[string]fwk.NodeInfo) {
	t.Helper()
	p, err := newPlugin(cfg, policies.All())
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

func a100Node(name string, gpus int) *corev1.Node {
	return fixtures.Node(name, fixtures.Inventory(name, gpus, "NVIDIA A100-SXM4-40GB", 40960, 10), names)
}

func TestBinpackAndSpread(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 2), a100Node("b", 2))
	share := map[string]string{"nvidia.com/gpumem": "10000"}
	first, msg := ts.schedule(fixtures.MakePod().Name("p1").Container("main", share).Obj())
	if first == "" {
		t.Fatal(msg)
	}
	second, _ := ts.schedule(fixtures.MakePod().Name("p2").Container("main", share).Obj())
	if first != second {
		t.Errorf("binpack put p1 on %s and p2 on %s, want the same node", first, second)
	}
	spread := fixtures.MakePod().Name("p3").Annotation(api.AnnotationNodePolicy, "spread").Container("main", share).Obj()
	if third, _ := ts.schedule(spread); third == first {
		t.Errorf("spread put p3 on the fuller node %s", third)
	}
	ts.check()
}

func TestUnschedulableMessage(t *testing.T) {
	t4 := fixtures.Node("c", fixtures.Inventory("c", 1, "Tesla T4", 15360, 10), names)
	ts := newTestScheduler(t, nil, a100Node("a", 1), a100Node("b", 1), t4)
	// Fill the A100s half.
	for _, name := range []string{"fill0", "fill1"} {
		fill := fixtures.MakePod().Name(name).Annotation(api.AnnotationNodePolicy, "spread").Annotation(api.AnnotationUseGPUType, "A100").
			Container("main", map[string]string{"nvidia.com/gpumem": "20000"}).Obj()
		if n, msg := ts.schedule(fill); n == "" {
			t.Fatal(msg)
		}
	}
	node, msg := ts.schedule(fixtures.MakePod().Name("big").Container("main", map[string]string{"nvidia.com/gpumem": "30000"}).Obj())
	if node != "" {
		t.Fatalf("placed on %s", node)
	}
	for _, want := range []string{"0/3 nodes fit", `2 container "main" no GPU with 30000 MiB free (largest 20960 MiB)`, `1 container "main" asks 30000 MiB per GPU but the largest GPU has 15360 MiB`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	sel := fixtures.MakePod().Name("sel").Annotation("nvidia.com/use-gputype", "H100").Container("main", map[string]string{"nvidia.com/gpumem": "1000"}).Obj()
	if _, msg := ts.schedule(sel); !strings.Contains(msg, "not selected by use-gputype=H100") {
		t.Errorf("message %q does not name the selector", msg)
	}
	bad := fixtures.MakePod().Name("bad").Container("main", map[string]string{"nvidia.com/gpucores": "150"}).Obj()
	if _, msg := ts.schedule(bad); !strings.Contains(msg, "150") || !strings.Contains(msg, "100") {
		t.Errorf("invalid request message %q does not name value and limit", msg)
	}
}

// A pod without GPU resources is not the plugin's: it skips the pod, which
// DefaultBinder binds without a record. Once bound, its CPU and memory
// count in the placement core's view of the node (as NodeResourcesFit
// counts them), with no GPU charged.
func TestNonGPUPodSkips(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	if n, msg := ts.schedule(fixtures.MakePod().Name("cpu").Container("c", map[string]string{"cpu": "1"}).Obj()); n != "a" {
		t.Fatalf("CPU pod not bound: %q", msg)
	}
	got, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, "cpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Annotations[api.AnnotationAllocation]; ok {
		t.Errorf("the plugin placed a pod without GPU resources: %v", got.Annotations)
	}
	var cpu, mem int64
	var gpus []api.ContainerAllocation
	err = wait.PollUntilContextTimeout(ts.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		ts.plugin.st.mu.RLock()
		defer ts.plugin.st.mu.RUnlock()
		n := ts.plugin.st.cluster.Node("a")
		cpu, mem = n.CPUUsed, n.MemUsed
		if a := ts.plugin.st.cluster.Allocation("default/cpu"); a != nil {
			gpus = a.Containers
		}
		return cpu == 1000, nil
	})
	if err != nil || len(gpus) != 0 || mem != 0 {
		t.Errorf("node a in the placement core: %d millicores, %d MiB, GPUs %v used; want the CPU pod's 1000, 0, none", cpu, mem, gpus)
	}
}

func TestRebuildFromRecordsAndRelease(t *testing.T) {
	share := map[string]string{"nvidia.com/gpumem": "30000"}
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	if node, msg := ts.schedule(fixtures.MakePod().Name("p1").Container("main", share).Obj()); node != "a" {
		t.Fatal(msg)
	}
	bound, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// A restarted scheduler learns the allocation from the bound pod's
	// record before it places anything.
	q := newTestScheduler(t, nil, a100Node("a", 1), bound)
	if node, _ := q.schedule(fixtures.MakePod().Name("p2").Container("main", share).Obj()); node != "" {
		t.Fatalf("p2 placed on %s although p1's record holds the memory", node)
	}
	// An unbound pod with a record (PreBind without binding) holds nothing.
	unbound := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("p3").UID("uid-p3").Container("main", nil).Obj()
	unbound.Annotations = map[string]string{api.AnnotationAllocation: bound.Annotations[api.AnnotationAllocation]}
	q.plugin.st.observePod(klog.Background(), unbound)
	if q.held() != 1 {
		t.Fatalf("pods held: %d, want 1", q.held())
	}
	// Terminated pods release, and the waiting pod is placed.
	done := bound.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	if _, err := q.client.CoreV1().Pods(metav1.NamespaceDefault).UpdateStatus(q.ctx, done, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if node := q.waitBound(metav1.NamespaceDefault, "p2"); node != "a" {
		t.Fatalf("after release p2 is on %q", node)
	}
	if q.held() != 1 {
		t.Fatalf("pods held after p1 ended and p2 was placed: %d, want 1", q.held())
	}
	// Deletion (with a tombstone) releases too, and Unreserve is idempotent.
	p2, err := q.client.CoreV1().Pods(metav1.NamespaceDefault).Get(q.ctx, "p2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.plugin.st.deletePod(tombstone(p2))
	q.plugin.Unreserve(context.Background(), framework.NewCycleState(), p2, "a")
	if q.held() != 0 {
		t.Fatalf("pods held after delete: %d", q.held())
	}
	q.check()
}

func tombstone(p *corev1.Pod) any { return cacheTombstone(p) }

func TestUnreserve(t *testing.T) {
	p, infos := newTestPlugin(t, api.ClusterConfig{}, a100Node("a", 1))
	ctx := context.Background()
	pod := fixtures.MakePod().Namespace("default").Name("p").UID("uid-p").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj()
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

// A binding the API server refuses makes kube-scheduler unreserve: the
// GPUs are free again for the next pod.
func TestFailedBindingReleases(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	ts.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "binding" && a.(k8stesting.CreateAction).GetObject().(*corev1.Binding).Name == "refused" {
			return true, nil, apierrors.NewForbidden(corev1.Resource("pods/binding"), "refused", errors.New("not today"))
		}
		return false, nil, nil
	})
	ts.create(fixtures.MakePod().Name("refused").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj())
	// Between kube-scheduler's attempts (it retries the pod) nothing holds
	// the GPU.
	testenv.WaitFor(t, "the refused binding's GPU released", 30*time.Second, func() bool {
		return ts.bindAttempts("refused") > 0 && ts.held() == 0
	})
	if err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Delete(ts.ctx, "refused", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the refused pod gone", 30*time.Second, func() bool { return ts.held() == 0 })
	if node, msg := ts.schedule(fixtures.MakePod().Name("next").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj()); node != "a" {
		t.Fatalf("the whole GPU the refused pod reserved is still taken: %q", msg)
	}
	ts.check()
}

func TestBadArgs(t *testing.T) {
	if _, err := newPlugin(api.ClusterConfig{PlacementPolicy: "nope"}, policies.All()); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("err = %v", err)
	}
}
