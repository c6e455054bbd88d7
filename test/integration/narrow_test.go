//go:build integration

package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestNarrowedCandidatesRealCluster plays two findings of the review of
// PreFilter's candidates against a real API server and the shipped
// profile (placementPolicy binpack, writeSchedulerConfig), on
// scheduler.Candidates+2 nodes of one GPU. A low-priority share pod holds
// host port 8080 on each of the first 16 nodes (pinned there by
// nodeSelector), so binpack ranks those 16 first for a new share pod and
// the 2 free nodes are no candidates:
//
//   - a pod that asks the same port at high priority fails NodePorts on
//     every candidate. It must be bound to a free node with no pod
//     evicted: before, DefaultPreemption ran after the narrowed attempt,
//     over the candidates alone, and evicted a low-priority pod there.
//   - a pod whose nodeSelector names the other free node (17 nodes with
//     a share rank before it) must be bound there at its first attempt,
//     with no failed attempt (no FailedScheduling event): before, its
//     candidates ignored the selector, all failed NodeAffinity, and it was
//     bound only at the retry over every node.
func TestNarrowedCandidatesRealCluster(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	high := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "narrow-high"}, Value: 1000}
	if _, err := e.cp.Client.SchedulingV1().PriorityClasses().Create(ctx, high, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodes := e.addNodes("nw", scheduler.Candidates+2, 1, "NVIDIA A100-SXM4-40GB", 40960)
	free := map[string]bool{nodes[scheduler.Candidates]: true, nodes[scheduler.Candidates+1]: true}
	e.startScheduler()
	bound := 0 // pods this test had bound
	base := scheduleAttempts(t)
	share := map[string]string{names.Memory: "10000"}
	hostPort := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080, Protocol: corev1.ProtocolTCP}}
		return p
	}
	pinned := func(p *corev1.Pod, node string) *corev1.Pod {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		return p
	}
	for i, n := range nodes[:scheduler.Candidates] {
		name := fmt.Sprintf("low-%02d", i)
		if _, err := e.create(pinned(hostPort(fixtures.MakePod().Name(name).Container("main", share).Obj()), n)); err != nil {
			t.Fatal(err)
		}
		if p, _ := e.waitBound(name); p.Spec.NodeName != n {
			t.Fatalf("%s bound to %s, want %s", name, p.Spec.NodeName, n)
		}
		bound++
	}

	web := hostPort(fixtures.MakePod().Name("web").Container("main", share).Obj())
	web.Spec.PriorityClassName = high.Name
	if _, err := e.create(web); err != nil {
		t.Fatal(err)
	}
	p, _ := e.waitBound("web")
	if !free[p.Spec.NodeName] {
		t.Errorf("web bound to %s, want a free node %v", p.Spec.NodeName, free)
	}
	delete(free, p.Spec.NodeName)
	bound++
	pods, err := e.cp.Client.CoreV1().Pods(gpuNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			t.Errorf("pod %s evicted (preempted) although web fit the free node", p.Name)
		}
	}
	if n := len(pods.Items); n != scheduler.Candidates+1 {
		t.Errorf("%d pods left, want %d: a low-priority pod was evicted", n, scheduler.Candidates+1)
	}

	var extra string
	for n := range free {
		extra = n
	}
	// Every attempt so far counted (each bound pod's scheduled one is
	// counted after its Binding): any further failed attempt is pinned's.
	before := waitScheduled(t, base, bound)
	if _, err := e.create(pinned(fixtures.MakePod().Name("pinned").Container("main", share).Obj(), extra)); err != nil {
		t.Fatal(err)
	}
	if p, _ := e.waitBound("pinned"); p.Spec.NodeName != extra {
		t.Errorf("pinned bound to %s, want %s", p.Spec.NodeName, extra)
	}
	bound++
	// kube-scheduler counts a failed attempt (and emits its
	// FailedScheduling event) before the pod's next attempt starts, and
	// the successful one after its Binding: once pinned's is counted, a
	// failed attempt of pinned would be too.
	after := waitScheduled(t, base, bound)
	if n := after["unschedulable"] + after["error"] - before["unschedulable"] - before["error"]; n != 0 {
		t.Errorf("pinned failed %v attempts (FailedScheduling) before it was bound, want it bound at its first", n)
	}
}

// scheduleAttempts is kube-scheduler's count of the attempts of Tessera's
// profile in this test process, by result (scheduled, unschedulable,
// error): its metric scheduler_schedule_attempts_total, counted in the
// attempt itself, where the FailedScheduling events reach the API server
// later and in no order.
func scheduleAttempts(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "scheduler_schedule_attempts_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["profile"] == api.SchedulerName {
				out[labels["result"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// waitScheduled waits until the scheduler has counted n more successful
// attempts than in base, and returns the counts then.
func waitScheduled(t *testing.T, base map[string]float64, n int) map[string]float64 {
	t.Helper()
	var now map[string]float64
	testenv.WaitFor(t, fmt.Sprintf("%d scheduled attempts counted", n), 30*time.Second, func() bool {
		now = scheduleAttempts(t)
		return now["scheduled"]-base["scheduled"] >= float64(n)
	})
	if d := now["scheduled"] - base["scheduled"]; d != float64(n) {
		t.Fatalf("%v scheduled attempts counted, want %d (another scheduler of the profile in this process?)", d, n)
	}
	return now
}
