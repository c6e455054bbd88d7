//go:build integration

package integration

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestMain(m *testing.M) {
	// The in-process API server and scheduler log a lot at level 0; keep
	// errors only (set TESSERA_TEST_VERBOSE=1 to see everything).
	if os.Getenv("TESSERA_TEST_VERBOSE") == "" {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("alsologtostderr", "false")
		_ = fs.Set("stderrthreshold", "ERROR")
		klog.SetOutput(io.Discard)
	}
	os.Exit(m.Run())
}

// expectPlacement checks that the scheduler put a pod where the placement
// core says the policy wants it: given the records of the pods placed
// before it, the chosen node has the best policy score among the nodes
// that fit (ties allowed), and on that node the GPUs and shares are
// exactly the ones the core chooses.
func expectPlacement(t *testing.T, invs map[string]*api.NodeInventory, before map[string]*api.PodAllocation, pod *corev1.Pod, got *api.PodAllocation) {
	t.Helper()
	c := placement.NewCluster()
	for name, inv := range invs {
		n, err := placement.NewNode(name, placement.Unlimited, placement.Unlimited, inv)
		if err != nil {
			t.Fatal(err)
		}
		c.UpsertNode(n)
	}
	for key, rec := range before {
		if err := c.AssignRecord(key, 0, 0, rec); err != nil {
			t.Fatal(err)
		}
	}
	req, err := podrequest.FromPod(pod, names)
	if err != nil {
		t.Fatal(err)
	}
	cr, err := c.Compile(req)
	if err != nil {
		t.Fatal(err)
	}
	def, _ := policies.New(string(api.NodeBinpack), c, 1)
	pol := placement.PolicyFor(cr, def)
	ranker := placement.RankerFor(cr, pol)
	var s placement.Scratch
	var p placement.Placement
	best := math.Inf(-1)
	scores := map[string]float64{}
	var want *api.PodAllocation
	for _, n := range c.Nodes() {
		if r := cr.Fit(n, ranker, &s, &p); !r.OK() {
			continue
		}
		sc := pol.ScoreNode(cr, &p)
		scores[n.Name] = sc
		best = math.Max(best, sc)
		if n.Name == got.Node {
			want = p.Record(cr)
		}
	}
	if want == nil {
		t.Fatalf("pod %s placed on %s, where the core says it does not fit", pod.Name, got.Node)
	}
	if scores[got.Node] < best-1e-9 {
		t.Errorf("pod %s placed on %s (score %.4f) but %s prefers a node scoring %.4f: %v", pod.Name, got.Node, scores[got.Node], pol.Name(), best, scores)
	}
	// The scheduler binds the record to its pod and signs it.
	if got.PodUID != string(pod.UID) || got.Signature == "" {
		t.Errorf("pod %s: record names pod %q, signature %q", pod.Name, got.PodUID, got.Signature)
	}
	// The record on the pod is written at the lowest version that
	// expresses it; the core's record names the current one.
	bare := *got
	bare.APIVersion = want.APIVersion
	bare.PodUID, bare.Signature = "", ""
	if !reflect.DeepEqual(want, &bare) {
		t.Errorf("pod %s on %s got\n%+v\nthe core chooses\n%+v", pod.Name, got.Node, *got, *want)
	}
}

// TestMixedWorkload places whole, fractional, multi-GPU, multi-container
// and init-container pods one at a time and checks each placement against
// the policy.
func TestMixedWorkload(t *testing.T) {
	e := newEnv(t)
	e.addNodes("a100", 2, 4, "NVIDIA A100-SXM4-40GB", 40960)
	e.addNodes("t4", 1, 4, "Tesla T4", 15360)
	e.startScheduler()

	withInit := fixtures.MakePod().Namespace(gpuNS).Name("init").
		InitContainer("prep", map[string]string{names.Memory: "30000"}).
		Container("main", map[string]string{names.Memory: "8000", names.Cores: "20"}).Obj()
	multi := fixtures.MakePod().Namespace(gpuNS).Name("multi-container").
		Container("a", map[string]string{names.Memory: "4000", names.Cores: "25"}).
		Container("b", map[string]string{names.MemoryPercentage: "25", names.Cores: "25"}).
		Container("sidecar", map[string]string{"cpu": "100m"}).Obj()
	spread := fixtures.MakePod().Namespace(gpuNS).Name("spread").Container("main", map[string]string{names.Memory: "2000"}).Obj()
	spread.Annotations = map[string]string{api.AnnotationNodePolicy: "spread"}
	noT4 := fixtures.MakePod().Namespace(gpuNS).Name("no-t4").Container("main", map[string]string{names.Memory: "1000"}).Obj()
	noT4.Annotations = map[string]string{"nvidia.com/nouse-gputype": "T4"}
	onlyT4 := fixtures.MakePod().Namespace(gpuNS).Name("only-t4").Container("main", map[string]string{names.Memory: "1000"}).Obj()
	onlyT4.Annotations = map[string]string{"nvidia.com/use-gputype": "T4"}
	pods := []*corev1.Pod{
		fixtures.MakePod().Namespace(gpuNS).Name("whole").Container("main", map[string]string{names.GPU: "1"}).Obj(),
		fixtures.MakePod().Namespace(gpuNS).Name("half").Container("main", map[string]string{names.GPU: "0.5"}).Obj(),
		fixtures.MakePod().Namespace(gpuNS).Name("share").Container("main", map[string]string{names.Memory: "10240", names.Cores: "30"}).Obj(),
		fixtures.MakePod().Namespace(gpuNS).Name("two-gpus").Container("main", map[string]string{names.GPU: "2", names.Memory: "20000", names.Cores: "50"}).Obj(),
		multi,
		withInit,
		spread,
		noT4,
		onlyT4,
		fixtures.MakePod().Namespace(gpuNS).Name("percent").Container("main", map[string]string{names.MemoryPercentage: "40"}).Obj(),
		fixtures.MakePod().Namespace(gpuNS).Name("whole-two").Container("main", map[string]string{names.GPU: "2"}).Obj(),
	}
	invs, _, _ := e.published()
	placed := map[string]*api.PodAllocation{}
	for _, p := range pods {
		if _, err := e.create(p); err != nil {
			t.Fatalf("creating %s: %v", p.Name, err)
		}
		bound, rec := e.waitBound(p.Name)
		expectPlacement(t, invs, placed, bound, rec)
		placed[gpuNS+"/"+p.Name] = rec
	}
	// Spot checks of what the records say.
	if d := placed[gpuNS+"/half"].Containers[0].Devices[0]; d.MemoryMiB*2 > 40960 || d.Cores != 50 || d.Exclusive {
		t.Errorf("half a GPU granted as %+v", d)
	}
	if d := placed[gpuNS+"/two-gpus"].Containers[0].Devices; len(d) != 2 || d[0].UUID == d[1].UUID {
		t.Errorf("two-GPU container got %+v", d)
	}
	if cs := placed[gpuNS+"/init"].Containers; len(cs) != 2 || !cs[0].Init || cs[0].Name != "prep" {
		t.Errorf("init container record %+v", cs)
	}
	if cs := placed[gpuNS+"/multi-container"].Containers; len(cs) != 2 {
		t.Errorf("multi-container record has %d GPU containers, want 2", len(cs))
	}
	if n := placed[gpuNS+"/no-t4"].Node; strings.HasPrefix(n, "t4") {
		t.Errorf("no-t4 placed on %s", n)
	}
	if n := placed[gpuNS+"/only-t4"].Node; !strings.HasPrefix(n, "t4") {
		t.Errorf("only-t4 placed on %s", n)
	}
	if w := placed[gpuNS+"/whole"].Containers[0].Devices[0]; !w.Exclusive {
		t.Errorf("whole GPU not exclusive: %+v", w)
	}
	e.checkInvariant()

	// A pod that fits nowhere gets an event that says why per node group:
	// this one wants the whole GPU the whole-GPU pod holds, and no other.
	held := placed[gpuNS+"/whole"].Containers[0].Devices[0].UUID
	huge := fixtures.MakePod().Namespace(gpuNS).Name("too-big").Container("main", map[string]string{names.GPU: "1"}).Obj()
	huge.Annotations = map[string]string{"nvidia.com/use-gpuuuid": held}
	if _, err := e.create(huge); err != nil {
		t.Fatal(err)
	}
	msg := e.waitUnschedulable("too-big")
	for _, want := range []string{"0/3 nodes", "Tessera: 0/3 nodes fit", "2 no GPU allowed by the pod's GPU UUID selection", "1 container \"main\" "} {
		if !strings.Contains(msg, want) {
			t.Errorf("FailedScheduling message %q does not say %q", msg, want)
		}
	}
	// Deleting the holder frees the GPU: the waiting pod then fits.
	if err := e.cp.Client.CoreV1().Pods(gpuNS).Delete(context.Background(), "whole", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	e.waitBound("too-big")
	e.checkInvariant()
}

// waitUnschedulable waits for the scheduler's verdict on an unplaceable
// pod and returns its message, checking that a FailedScheduling event
// carries the same text.
func (e *env) waitUnschedulable(name string) string {
	e.t.Helper()
	var msg string
	ctx := context.Background()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		msg = unschedulableMessage(p)
		return msg != "", nil
	})
	if err != nil {
		e.t.Fatalf("pod %s never marked unschedulable: %v", name, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := e.cp.Client.CoreV1().Events(gpuNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == name && ev.Reason == "FailedScheduling" && ev.Message == msg {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Errorf("no FailedScheduling event for %s with the message %q: %v", name, msg, err)
	}
	return msg
}

// TestManyPodsWithRestart creates 500 mixed pods at once on 20 nodes × 8
// GPUs, kills the scheduler part-way and starts a new one. What the API
// server holds must never break the invariant, and every pod must end
// bound with a record or unschedulable with a reason.
func TestManyPodsWithRestart(t *testing.T) {
	e := newEnv(t)
	e.addNodes("node", 20, 8, "NVIDIA A100-SXM4-80GB", 81920)

	rng := rand.New(rand.NewPCG(4, 2))
	shapes := []map[string]string{
		{names.Memory: "8192", names.Cores: "10"},
		{names.Memory: "16384", names.Cores: "25"},
		{names.GPU: "0.25"},
		{names.GPU: "0.5"},
		{names.MemoryPercentage: "30", names.Cores: "30"},
		{names.GPU: "1"},
		{names.GPU: "2", names.Memory: "20000", names.Cores: "40"},
		{names.Memory: "4096"},
	}
	const total = 500
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int32
	sem := make(chan struct{}, 32)
	for i := range total {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int, shape map[string]string) {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name(fmt.Sprintf("p%03d", i)).Container("main", shape).Obj()); err != nil {
				failed.Add(1)
				t.Errorf("creating pod %d: %v", i, err)
			}
		}(i, shapes[rng.IntN(len(shapes))])
	}
	wg.Wait()
	t.Logf("created %d pods in %v", total, time.Since(start).Round(time.Millisecond))
	if failed.Load() > 0 {
		t.FailNow()
	}

	// Start the scheduler on the whole backlog and kill it part-way.
	w, err := e.cp.Client.CoreV1().Pods(gpuNS).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stop := e.startScheduler()
	seen := map[string]bool{}
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			seen[p.Name] = true
		}
		if len(seen) >= 100 {
			break
		}
	}
	stop()
	w.Stop()
	killedAt := e.checkInvariant()
	t.Logf("scheduler killed after %v with %d pods bound; invariant holds", time.Since(start).Round(time.Millisecond), killedAt)

	e.startScheduler()
	var bound, unschedulable int
	err = wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, recs, pods := e.published()
		bound, unschedulable = len(recs), 0
		for _, p := range pods {
			if p.Spec.NodeName == "" {
				if msg := unschedulableMessage(&p); strings.Contains(msg, "nodes fit") {
					unschedulable++
				} else {
					return false, nil
				}
			}
		}
		return bound+unschedulable == total, nil
	})
	if err != nil {
		t.Fatalf("after restart: %d bound, %d unschedulable with a reason, of %d: %v", bound, unschedulable, total, err)
	}
	if n := e.checkInvariant(); n != bound {
		t.Fatalf("records %d != bound %d", n, bound)
	}
	t.Logf("all %d pods settled in %v: %d bound, %d unschedulable with a reason; invariant holds",
		total, time.Since(start).Round(time.Millisecond), bound, unschedulable)
	if bound < killedAt {
		t.Errorf("fewer pods bound after the restart (%d) than before (%d)", bound, killedAt)
	}
}

func unschedulableMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}
