//go:build integration

package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/sim"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var (
	replayPolicies   = flag.String("replay-policies", "bestfit,fgd,tessera", "BenchmarkReplay: placement policies to replay, comma-separated")
	replaySeed       = flag.Int64("replay-seed", 1, "BenchmarkReplay: the simulator's arrival-order seed")
	replayPercentage = flag.Int("replay-percentage", -1, "BenchmarkReplay: percentageOfNodesToScore of the replayed profile; -1 keeps the shipped configuration's")
	replayNodes      = flag.String("replay-nodes", "", "BenchmarkReplay: openb node list CSV (default: the bundled default trace)")
	replayPods       = flag.String("replay-pods", "", "BenchmarkReplay: openb pod list CSV (default: the bundled default trace)")
	replayGPUOnly    = flag.Bool("replay-gpu-only", false, "BenchmarkReplay: leave the trace's CPU-only tasks out of both the simulator and the replay (they are placed by the policy in the simulator, not in the scheduler)")
)

// BenchmarkReplay replays an openb trace through the real scheduler: a
// kube-apiserver with the trace's nodes as Node objects (CPU, memory and
// the simulator's GPU inventory, sim.NodeInventory), the shipped scheduler
// configuration with placementPolicy set to each policy, and the trace's
// tasks created as pods one after another in the simulator's arrival order
// for the seed (sim.Trace.Arrivals), up to arrived = 100 % of the GPUs,
// with no departures. It reports the unallocated GPU % once every pod is
// bound or unschedulable, beside `tessera-sim`'s for the same seed and
// policy (sim.Run). Minutes per policy; not part of any default run:
//
//	go test -tags integration -run '^$' -bench BenchmarkReplay -benchtime=1x -timeout=60m \
//	    ./test/integration/ -replay-policies=bestfit,fgd,tessera -replay-seed=1 [-replay-percentage=100]
func BenchmarkReplay(b *testing.B) {
	trace, err := sim.LoadTrace(*replayNodes, *replayPods)
	if err != nil {
		b.Fatal(err)
	}
	if *replayGPUOnly {
		gpu := trace.Pods[:0:0]
		for _, p := range trace.Pods {
			if p.GPURequestMilli() > 0 {
				gpu = append(gpu, p)
			}
		}
		trace.Pods = gpu
	}
	for _, policy := range strings.Split(*replayPolicies, ",") {
		b.Run(policy, func(b *testing.B) {
			for range b.N {
				replay(b, trace, policy, *replaySeed, *replayPercentage, 0)
			}
		})
	}
}

// replay replays the arrivals up to arrived = 100 % (the first limit of
// them when limit > 0) and returns how many the scheduler placed on
// another node than the simulator (learning online, for a policy the
// simulator gives the trace's shapes).
func replay(b testing.TB, trace *sim.Trace, policy string, seed int64, percentage, limit int) int {
	bench, _ := b.(*testing.B)
	start := time.Now()
	cv, err := sim.Run(trace, policy, seed)
	if err != nil {
		b.Fatal(err)
	}
	capacity := trace.CapacityMilli()
	// The arrivals of the simulator's run up to arrived = 100 %.
	var order []int
	var arrived int64
	for _, i := range trace.Arrivals(seed, sim.Inflation) {
		g := trace.Pods[i].GPURequestMilli()
		if arrived+g > capacity {
			break
		}
		arrived += g
		order = append(order, i)
	}
	if limit > 0 && len(order) > limit {
		order = order[:limit]
	}
	// What the simulator left unallocated after the last arrival replayed
	// (Unallocated(100) when every arrival up to 100 % is).
	unallocated := func(cv *sim.Curve) float64 {
		return 100 - float64(cv.Allocated[len(order)-1])*100/float64(capacity)
	}
	want := unallocated(cv)
	simDropped := 0
	for k := range order {
		var before int64
		if k > 0 {
			before = cv.Allocated[k-1]
		}
		if cv.Allocated[k] == before && trace.Pods[order[k]].GPURequestMilli() > 0 {
			simDropped++
		}
	}
	replayLog(b, "%s seed %d: simulator: %.2f %% unallocated, %d GPU tasks dropped of %d arrivals (%v)", policy, seed, want, simDropped, len(order), time.Since(start).Round(time.Millisecond))
	// A policy given the trace's shapes up front in the simulator (FGD, as
	// published) learns them online in the scheduler: the simulator's run
	// learning online too is the scheduler's exact counterpart.
	online, err := sim.RunOnline(context.Background(), trace, policy, seed)
	if err != nil {
		b.Fatal(err)
	}
	learns := !slices.Equal(online.Node, cv.Node)
	if learns {
		replayLog(b, "%s seed %d: simulator learning the workload online as the scheduler does: %.2f %% unallocated", policy, seed, unallocated(online))
	}

	cp := testenv.StartControlPlane(b)
	ctx := context.Background()
	const ns = "replay"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	createParallel(b, len(trace.Nodes), func(i int) error {
		_, err := cp.Client.CoreV1().Nodes().Create(ctx, traceNode(trace.Nodes[i]), metav1.CreateOptions{})
		return err
	})
	replayLog(b, "%d nodes created in %v", len(trace.Nodes), time.Since(start).Round(time.Millisecond))

	raw, err := deploy.SchedulerConfigFor(cp.Kubeconfig, 5000, 10000)
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	prof := cfg["profiles"].([]any)[0].(map[string]any)
	if percentage >= 0 {
		prof["percentageOfNodesToScore"] = percentage
	}
	for _, pc := range prof["pluginConfig"].([]any) {
		if pc := pc.(map[string]any); pc["name"] == scheduler.Name {
			args := pc["args"].(map[string]any)
			args["placementPolicy"] = policy
			// The namespace of the record-signing key: without it the
			// scheduler cannot start.
			if rs, ok := args["recordSigning"].(map[string]any); ok {
				keyNS, _ := rs["namespace"].(string)
				if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: keyNS}}, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	if raw, err = yaml.Marshal(cfg); err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	// An informer follows every pod until it is bound or found
	// unschedulable. An unschedulable pod is deleted at once: nothing
	// departs, so it could never fit later, and its retries would only
	// slow the replay down (the simulator drops it for good as well).
	var mu sync.Mutex
	decided := map[string]bool{}
	var bound, unschedulable int
	var alloc int64
	placed := make([]string, len(order)) // the node of each arrival, "" when unschedulable
	var badName string
	allDecided, firstDecided := make(chan struct{}), make(chan struct{})
	toDelete := make(chan string, len(order))
	handle := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if decided[p.Name] {
			return
		}
		var k int
		if _, err := fmt.Sscanf(p.Name, "a%06d", &k); err != nil || k >= len(order) {
			badName = p.Name
			return
		}
		switch {
		case p.Spec.NodeName != "":
			bound++
			placed[k] = p.Spec.NodeName
			alloc += sim.PlacedMilli(trace.Pods[order[k]])
		case isUnschedulable(p):
			unschedulable++
			toDelete <- p.Name
		default:
			return
		}
		decided[p.Name] = true
		if k == 0 {
			close(firstDecided)
		}
		if len(decided) == len(order) {
			close(allDecided)
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cp.Client, 0, informers.WithNamespace(ns))
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		b.Fatal(err)
	}
	stopInformer := make(chan struct{})
	defer close(stopInformer)
	factory.Start(stopInformer)
	zero := int64(0)
	deleted := make(chan error, 1)
	go func() {
		for name := range toDelete {
			if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				deleted <- err
				return
			}
		}
	}()

	// The pods are created one by one in arrival order once the scheduler
	// runs: its pod informer hears of them in that order, so its queue
	// (PrioritySort: equal priorities, first queued first) takes them in
	// the simulator's arrival order. Pods that exist before the scheduler
	// starts are not queued in name order: the informer's initial list
	// (a watch-list stream gathered in a map) hands them over in random
	// order. The first pod is decided before the next is created, so that
	// every later one reaches the scheduler through its watch.
	if bench != nil {
		bench.ResetTimer()
	}
	start = time.Now()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	// The simulator's catalogue: the baselines too (bestfit), which the
	// shipped scheduler does not run.
	go func() { done <- scheduler.RunInProcess(sctx, path, scheduler.WithPolicies(sim.Policies())) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("scheduler: %v", err)
		}
	}()
	create := func(k int) {
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, tracePod(ns, k, trace.Pods[order[k]]), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	create(0)
	select {
	case <-firstDecided:
	case <-time.After(5 * time.Minute):
		b.Fatalf("after 5 minutes the first pod is neither bound nor unschedulable")
	}
	for k := 1; k < len(order); k++ {
		create(k)
	}
	created := time.Since(start)

	select {
	case <-allDecided:
	case err := <-deleted:
		b.Fatal(err)
	case <-time.After(30 * time.Minute):
		b.Fatalf("after 30 minutes not every pod is bound or unschedulable")
	}
	mu.Lock()
	defer mu.Unlock()
	if badName != "" {
		b.Fatalf("unexpected pod %s", badName)
	}
	elapsed := time.Since(start)
	if bench != nil {
		bench.StopTimer()
	}
	got := 100 - float64(alloc)*100/float64(capacity)
	pct := "shipped"
	if percentage >= 0 {
		pct = fmt.Sprint(percentage)
	}
	replayLog(b, "%s seed %d: scheduler (percentageOfNodesToScore %s): %.2f %% unallocated, %d bound, %d unschedulable of %d pods (all created in %v, all decided in %v, from the scheduler's start); simulator %.2f %%; difference %+.2f points",
		policy, seed, pct, got, bound, unschedulable, len(order), created.Round(time.Second), elapsed.Round(time.Second), want, got-want)
	differ := replayDivergence(b, "simulator", trace, order, cv.Node, placed)
	if learns {
		replayLog(b, "%s seed %d: simulator learning online %.2f %%; difference %+.2f points", policy, seed, unallocated(online), got-unallocated(online))
		differ = replayDivergence(b, "simulator learning online", trace, order, online.Node, placed)
	}
	if bench != nil {
		if learns {
			bench.ReportMetric(got-unallocated(online), "diff-online-points")
		}
		bench.ReportMetric(got, "unalloc%")
		bench.ReportMetric(want, "sim-unalloc%")
		bench.ReportMetric(got-want, "diff-points")
		bench.ReportMetric(float64(len(order))/elapsed.Seconds(), "pods/s")
	}
	return differ
}

// TestReplayMatchesSimulator: the real scheduler, in the shipped
// configuration, places the first 1,500 arrivals of the openb trace (seed
// 2, CPU-only tasks included) each on the node `tessera-sim` places
// it on, for the shipped policy, a baseline and FGD (against the simulator
// learning online, as the scheduler does): the policy measured is the
// policy run. BenchmarkReplay runs the whole trace.
func TestReplayMatchesSimulator(t *testing.T) {
	trace, err := sim.LoadTrace("", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{"tessera", "bestfit", "fgd"} {
		t.Run(policy, func(t *testing.T) {
			if differ := replay(t, trace, policy, 2, -1, 1500); differ != 0 {
				t.Errorf("%s: %d of 1,500 arrivals placed on another node than the simulator's (log above: the first)", policy, differ)
			}
		})
	}
}

// replayDivergence logs where the scheduler first placed an arrival
// elsewhere than the simulator (everything after it may differ as a
// consequence) and returns how many arrivals differ in all.
func replayDivergence(b testing.TB, what string, trace *sim.Trace, order []int, simNode, schedNode []string) int {
	b.Helper()
	first, differ := -1, 0
	for k := range order {
		if simNode[k] != schedNode[k] {
			differ++
			if first < 0 {
				first = k
			}
		}
	}
	if first < 0 {
		replayLog(b, "every arrival placed on the node of the %s", what)
		return 0
	}
	row := trace.Pods[order[first]]
	replayLog(b, "%d of %d arrivals placed elsewhere than by the %s; first: arrival %d (%s: %d GPU x %d milli, %d mCPU, %d MiB, spec %q): simulator %q, scheduler %q",
		differ, len(order), what, first, row.Name, row.NumGPU, row.GPUMilli, row.CPUMilli, row.MemMiB, row.Spec, simNode[first], schedNode[first])
	return differ
}

// replayLog logs to the benchmark and to stderr (a benchmark's log is
// cut short in go test's output).
func replayLog(b testing.TB, format string, args ...any) {
	b.Helper()
	b.Logf(format, args...)
	fmt.Fprintf(os.Stderr, "REPLAY "+format+"\n", args...)
}

// isUnschedulable: found unschedulable, not merely retried over every
// node because the plugin's candidates all failed (scheduler.NarrowedRetry).
func isUnschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
			!strings.Contains(c.Message, scheduler.NarrowedRetry) {
			return true
		}
	}
	return false
}

// createParallel runs create(0..n-1) from 16 goroutines.
func createParallel(b testing.TB, n int, create func(i int) error) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := create(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// traceNode is a trace's node as a Node object: its CPU and memory, the
// simulator's GPU inventory in the inventory annotation and the share
// slots the node agent would advertise.
func traceNode(r sim.NodeRow) *corev1.Node {
	n := fixtures.Node(r.Name, sim.NodeInventory(r), names)
	for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		l[corev1.ResourceCPU] = *resource.NewMilliQuantity(r.CPUMilli, resource.DecimalSI)
		l[corev1.ResourceMemory] = *resource.NewQuantity(r.MemMiB<<20, resource.BinarySI)
	}
	return n
}

// tracePod is the k-th arrival, a trace task, as a pod: the request
// sim.Request places, in the resources and annotations users write.
func tracePod(ns string, k int, row sim.PodRow) *corev1.Pod {
	req := sim.Request(row, row.Name)
	res := map[string]string{}
	for _, c := range req.Containers {
		res[names.GPU] = fmt.Sprint(c.GPUs)
		res[names.MemoryPercentage] = fmt.Sprint(c.MemoryPercent)
		res[names.Cores] = fmt.Sprint(c.Cores)
	}
	w := fixtures.MakePod().Namespace(ns).Name(fmt.Sprintf("a%06d", k)).SchedulerName(api.SchedulerName)
	if len(req.IncludeModels) > 0 {
		w = w.Annotation(api.AnnotationUseGPUType, strings.Join(req.IncludeModels, ","))
	}
	pod := w.Container("main", res).Obj()
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(row.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(row.MemMiB<<20, resource.BinarySI),
	}
	return pod
}
