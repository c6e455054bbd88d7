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

	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
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
//     with no FailedScheduling event: before, its candidates ignored the
//     selector, all failed NodeAffinity, and it was bound only at the
//     retry over every node.
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
	if _, err := e.create(pinned(fixtures.MakePod().Name("pinned").Container("main", share).Obj(), extra)); err != nil {
		t.Fatal(err)
	}
	if p, _ := e.waitBound("pinned"); p.Spec.NodeName != extra {
		t.Errorf("pinned bound to %s, want %s", p.Spec.NodeName, extra)
	}
	time.Sleep(time.Second) // events are written asynchronously
	evs, err := e.cp.Client.CoreV1().Events(gpuNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name == "pinned" && ev.Reason == "FailedScheduling" {
			t.Errorf("FailedScheduling event for a pod bound at its first attempt: %s", ev.Message)
		}
	}
}
