//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
)

// priorityClasses creates the preemption tests' PriorityClasses, deleted
// when the test ends: lab-low (10), lab-middle (500), lab-high (1000)
// and lab-high-never (1000, preemptionPolicy Never).
func priorityClasses(t *testing.T) {
	t.Helper()
	never := corev1.PreemptNever
	for _, pc := range []schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "lab-low"}, Value: 10},
		{ObjectMeta: metav1.ObjectMeta{Name: "lab-middle"}, Value: 500},
		{ObjectMeta: metav1.ObjectMeta{Name: "lab-high"}, Value: 1000},
		{ObjectMeta: metav1.ObjectMeta{Name: "lab-high-never"}, Value: 1000, PreemptionPolicy: &never},
	} {
		if _, err := client.SchedulingV1().PriorityClasses().Create(context.Background(), &pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.SchedulingV1().PriorityClasses().Delete(context.Background(), pc.Name, metav1.DeleteOptions{})
		})
	}
}

// preemptPod is a pod of the priority class asking res on node, with a
// short grace period: a victim's processes get SIGTERM and two seconds,
// as kube-scheduler's preemption deletes pods (gracefully).
func preemptPod(ns, name, class, node string, res map[string]string) *corev1.Pod {
	p := fixtures.MakePod().Namespace(ns).Name(name).PriorityClassName(class).Container("c", res).Obj()
	p.Spec.TerminationGracePeriodSeconds = new(int64)
	*p.Spec.TerminationGracePeriodSeconds = 2
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	p.Spec.Tolerations = []corev1.Toleration{{Key: modes.SharingTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	return p
}

// preempted waits until n of the pods are being deleted or gone, and
// returns them, sorted.
func preempted(t *testing.T, ns string, pods []string, n int) []string {
	t.Helper()
	var out []string
	testenv.WaitFor(t, fmt.Sprintf("%d of %d pods preempted", n, len(pods)), 2*time.Minute, func() bool {
		out = out[:0]
		for _, name := range pods {
			p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil {
				out = append(out, name)
			}
		}
		return len(out) >= n
	})
	sort.Strings(out)
	return out
}

// servedFirstTime checks that the preemptor runs and that the node agent
// never refused its Allocate (a refused Allocate fails the pod's
// admission: the kubelet does not ask again).
func servedFirstTime(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p := waitRunning(t, ns, name)
	evs, err := client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == deviceplugin.ReasonRefused || e.Reason == "UnexpectedAdmissionError" {
			t.Errorf("%s: %s event: %s", name, e.Reason, e.Message)
		}
	}
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("%s: container statuses %+v", name, p.Status.ContainerStatuses)
	}
	return p
}

// TestPreemption: preemption on the lab's nodes, with their node agents
// and kubelets: the victims are deleted gracefully (their processes get
// SIGTERM), and the preemptor's Allocate, at the node agent, is served at
// the first attempt:
//
//   - shares: lab-gpu-04's eight GPUs are full (seven pods of a middle
//     priority hold a GPU whole, four low-priority quarter shares the
//     eighth); a high-priority 0.5 pod evicts two of the quarters and
//     runs in their room;
//   - mig-static: lab-mig's seven 1g.5gb devices held by low-priority
//     pods; a high-priority mig-1g.5gb pod evicts one and gets its device;
//   - mig-dynamic: lab-mig-dynamic's A100 full of 1g.5gb instances; a
//     high-priority pod asking a 3g.20gb's worth evicts the three at
//     slices 4-6, whose instances the agent destroys, and gets 3g.20gb@4.
func TestPreemption(t *testing.T) {
	const ns = "preempt"
	useNamespace(t, ns)
	ctx := context.Background()
	priorityClasses(t)

	t.Run("shares", func(t *testing.T) {
		const node = "lab-gpu-04"
		// The whole GPUs first, so that the quarters share the eighth.
		for _, batch := range [][2]string{{"whole", "lab-middle"}, {"quarter", "lab-low"}} {
			var pods []*corev1.Pod
			for i := range map[string]int{"whole": 7, "quarter": 4}[batch[0]] {
				res := map[string]string{"nvidia.com/gpu": map[string]string{"whole": "1", "quarter": "0.25"}[batch[0]]}
				pods = append(pods, preemptPod(ns, fmt.Sprintf("%s-%d", batch[0], i), batch[1], node, res))
			}
			createAll(t, pods)
			for _, p := range pods {
				waitRunning(t, ns, p.Name)
			}
		}
		quarters := []string{"quarter-0", "quarter-1", "quarter-2", "quarter-3"}
		createAll(t, []*corev1.Pod{preemptPod(ns, "half", "lab-high", node, map[string]string{"nvidia.com/gpu": "0.5"})})
		victims := preempted(t, ns, quarters, 2)
		p := servedFirstTime(t, ns, "half")
		if len(preempted(t, ns, quarters, 2)) != 2 {
			t.Errorf("more than two quarters evicted")
		}
		g := record(t, p).Containers[0].Devices[0]
		for _, q := range quarters {
			if !contains(victims, q) {
				qp, err := client.CoreV1().Pods(ns).Get(ctx, q, metav1.GetOptions{})
				if err != nil || record(t, qp).Containers[0].Devices[0].UUID != g.UUID {
					t.Errorf("quarter %s not on the half's GPU %s (%v)", q, g.UUID, err)
				}
			}
		}
		t.Logf("victims %v; half runs on %s %s", victims, p.Spec.NodeName, g.UUID)
	})

	t.Run("mig-static", func(t *testing.T) {
		const node = "lab-mig"
		waitAllocatable(t, node, "nvidia.com/mig-1g.5gb", 7)
		one := map[string]string{"nvidia.com/mig-1g.5gb": "1"}
		var pods []*corev1.Pod
		var names []string
		for i := range 7 {
			names = append(names, fmt.Sprintf("mig-%d", i))
			pods = append(pods, preemptPod(ns, names[i], "lab-low", node, one))
		}
		createAll(t, pods)
		devices := map[string]string{}
		for _, n := range names {
			devices[n] = record(t, waitRunning(t, ns, n)).Containers[0].Devices[0].MIG.Device
		}
		createAll(t, []*corev1.Pod{preemptPod(ns, "mig-high", "lab-high", node, one)})
		victims := preempted(t, ns, names, 1)
		p := servedFirstTime(t, ns, "mig-high")
		if got := record(t, p).Containers[0].Devices[0].MIG.Device; len(victims) != 1 || got != devices[victims[0]] {
			t.Errorf("mig-high holds %s; victims %v held %v", got, victims, devices)
		}
	})

	t.Run("mig-dynamic", func(t *testing.T) {
		const node = "lab-mig-dynamic"
		var pods []*corev1.Pod
		var names []string
		for i := range 7 {
			names = append(names, fmt.Sprintf("small-%d", i))
			pods = append(pods, preemptPod(ns, names[i], "lab-low", node, map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "10"}))
		}
		createAll(t, pods)
		starts := map[string]int{}
		for _, n := range names {
			starts[n] = record(t, waitRunning(t, ns, n)).Containers[0].Devices[0].MIG.Start
		}
		createAll(t, []*corev1.Pod{preemptPod(ns, "big", "lab-high", node, map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "18000", "nvidia.com/gpucores": "30"})})
		victims := preempted(t, ns, names, 3)
		for _, v := range victims {
			if starts[v] < 4 {
				t.Errorf("victim %s held slice %d, want the instances at 4-6", v, starts[v])
			}
		}
		p := servedFirstTime(t, ns, "big")
		if g := record(t, p).Containers[0].Devices[0].MIG; g == nil || g.Profile != "3g.20gb" || g.Start != 4 {
			t.Errorf("big's grant %+v, want 3g.20gb@4", g)
		}
		if n := len(preempted(t, ns, names, 3)); n != 3 {
			t.Errorf("%d pods evicted, want 3", n)
		}
	})
	checkInvariant(t)
	if t.Failed() {
		out, _ := kubectlIn(t, "", "get", "events", "-n", ns, "--sort-by=.lastTimestamp")
		t.Logf("events:\n%s", strings.TrimSpace(out))
	}
}
