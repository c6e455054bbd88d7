//go:build integration

package lab_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// claimNode is the lab's DRA node of one A100-80GB (labNodeGroups),
// tainted with claimKey so that only TestPreemptClaims places pods there.
const (
	claimNode = "lab-dra-02"
	claimKey  = "tessera.io/test-claim-preemption"
)

// claimPreemptPod is a pod of the priority class on claimNode whose
// container fills the GPU memory its claim allows and holds it; a
// victim gets SIGTERM and a second, as kube-scheduler's preemption
// deletes pods (gracefully).
func claimPreemptPod(ns, name, class, claim string) *corev1.Pod {
	p := fixtures.MakePod().Namespace(ns).Name(name).PriorityClassName(class).SchedulerName(api.SchedulerName).
		Container("main", nil).UsesClaim(claim).Obj()
	p.Spec.Containers[0].Image = "cuda"
	p.Spec.Containers[0].Command = []string{"gpu-fill", "--hold", "forever"}
	p.Spec.TerminationGracePeriodSeconds = new(int64)
	*p.Spec.TerminationGracePeriodSeconds = 1
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": claimNode}
	p.Spec.Tolerations = []corev1.Toleration{{Key: claimKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	return p
}

// preparedOn lists what the node's DRA driver holds for the claim: its
// CDI spec and claim directory (named after its UID) and its entry in the
// driver's checkpoint.
func preparedOn(node string, uid string) []string {
	nd := dir.Node(node)
	var out []string
	for _, f := range leftovers(nd) {
		if strings.Contains(filepath.Base(f), uid) {
			out = append(out, f)
		}
	}
	if b, err := os.ReadFile(filepath.Join(nd.Claims(), "checkpoint.json")); err == nil && strings.Contains(string(b), uid) {
		out = append(out, "checkpoint.json")
	}
	return out
}

// TestPreemptClaims: Tessera's scheduler preempts for ResourceClaims on
// lab-dra-02's one 80 GB GPU, with the node's kubelet (its DRA manager),
// agent (the DRA driver) and runtime. The GPU is full: a 40 Gi claim
// shared by shared-high (priority 1000) and shared-low (10), and the
// 20 Gi claims of low-0 and low-1 (10).
//
//   - never: a 40 Gi claim of a pod with preemptionPolicy Never is
//     reported unschedulable, and nothing is evicted or nominated;
//   - two: a 40 Gi claim of priority 1000 evicts low-0 and low-1; their
//     claims are deallocated and unprepared on the node (no CDI spec,
//     claim directory or checkpoint entry left), and the preemptor runs
//     with its 40 Gi. Evicting shared-low alone would free nothing (the
//     claim stays reserved for shared-high), so the shared claim is never
//     a victim's: shared-low and shared-high keep running, untouched.
func TestPreemptClaims(t *testing.T) {
	const ns = "preempt-claims"
	// The test's containers hold most of an 80 GB GPU: once their pods
	// are deleted (draNamespace's clean-up, which runs before this one),
	// wait until their processes have exited, so that no later test's
	// check of the lab finds GPU memory held by a pod that is gone.
	var started []int
	t.Cleanup(func() {
		testenv.WaitFor(t, "the containers of "+ns+" stopped", 2*time.Minute, func() bool {
			for _, pid := range started {
				if supervisor.ProcessAlive(pid) {
					return false
				}
			}
			return true
		})
	})
	draNamespace(t, ns)
	priorityClasses(t)
	ctx := context.Background()
	for name, mem := range map[string]string{"shared": "40Gi", "low-0": "20Gi", "low-1": "20Gi", "never": "40Gi", "big": "40Gi"} {
		if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, fixtures.Claim(ns, name, mem), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The shared claim first, so that the GPU is the one it is on.
	holders := []*corev1.Pod{
		claimPreemptPod(ns, "shared-high", "lab-high", "shared"),
		claimPreemptPod(ns, "shared-low", "lab-low", "shared"),
		claimPreemptPod(ns, "low-0", "lab-low", "low-0"),
		claimPreemptPod(ns, "low-1", "lab-low", "low-1"),
	}
	// The shared claim's two containers fill 20 Gi each, its 40 Gi.
	for _, p := range holders[:2] {
		p.Spec.Containers[0].Command = append(p.Spec.Containers[0].Command, "--max", "20480")
	}
	createAll(t, holders[:2])
	for _, p := range holders[:2] {
		waitRunning(t, ns, p.Name)
	}
	createAll(t, holders[2:])
	pids := map[string]int{}
	uids := map[string]string{}
	for _, p := range holders {
		waitRunning(t, ns, p.Name)
		c, _ := draContainerOn(t, claimNode, ns, p.Name, "main")
		pids[p.Name] = c.PID
		started = append(started, c.PID)
	}
	for _, p := range holders {
		mem := map[string]string{"shared-high": "40960", "shared-low": "40960"}[p.Name]
		if mem == "" {
			mem = "20480"
		}
		logsContain(t, ns, p.Name, "total "+mem+" MiB")
	}
	for _, name := range []string{"shared", "low-0", "low-1"} {
		c, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[name] = string(c.UID)
		// What is checked gone below is there now.
		if got := preparedOn(claimNode, uids[name]); len(got) < 3 {
			t.Fatalf("claim %s prepared on %s as %v, want its CDI spec, claim directory and checkpoint entry", name, claimNode, got)
		}
	}
	checkCapacities(t, claimNode)
	defer func() {
		if t.Failed() {
			out, _ := kubectlIn(t, "", "get", "events", "-n", ns, "--sort-by=.lastTimestamp")
			t.Logf("events:\n%s", strings.TrimSpace(out))
		}
	}()
	// untouched fails the test if a holder is being deleted or its
	// container is not the one it started with.
	untouched := func(t *testing.T, names ...string) {
		t.Helper()
		for _, name := range names {
			p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				t.Errorf("%s evicted (%v)", name, err)
				continue
			}
			c, _ := draContainerOn(t, claimNode, ns, name, "main")
			if c.PID != pids[name] || !supervisor.ProcessAlive(c.PID) {
				t.Errorf("%s: container pid %d (alive %v), was %d", name, c.PID, supervisor.ProcessAlive(c.PID), pids[name])
			}
		}
	}

	t.Run("never", func(t *testing.T) {
		createAll(t, []*corev1.Pod{claimPreemptPod(ns, "never", "lab-high-never", "never")})
		// The scheduler reports the pod unschedulable once its
		// preemption has run (PostFilter): nothing is evicted by then,
		// and nothing can be later.
		testenv.WaitFor(t, "never reported unschedulable after its preemption ran", 2*time.Minute, func() bool {
			for _, e := range eventsOf(t, ns, "never") {
				if strings.HasPrefix(e, "FailedScheduling: ") && strings.Contains(e, "preemptionPolicy=Never") {
					return true
				}
			}
			return false
		})
		untouched(t, "shared-high", "shared-low", "low-0", "low-1")
		for _, name := range []string{"shared-low", "low-0", "low-1"} {
			for _, e := range eventsOf(t, ns, name) {
				if strings.HasPrefix(e, "Preempted: ") {
					t.Errorf("%s: %s", name, e)
				}
			}
		}
		p, err := client.CoreV1().Pods(ns).Get(ctx, "never", metav1.GetOptions{})
		if err != nil || p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
			t.Fatalf("never: bound to %q, nominated to %q (%v), want neither", p.Spec.NodeName, p.Status.NominatedNodeName, err)
		}
		// Out of the way of the next case: it would take the room freed.
		zero := int64(0)
		if err := client.CoreV1().Pods(ns).Delete(ctx, "never", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "never deleted", time.Minute, func() bool {
			_, err := client.CoreV1().Pods(ns).Get(ctx, "never", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	})

	t.Run("two", func(t *testing.T) {
		createAll(t, []*corev1.Pod{claimPreemptPod(ns, "big", "lab-high", "big")})
		victims := preempted(t, ns, []string{"low-0", "low-1", "shared-low"}, 2)
		if strings.Join(victims, ",") != "low-0,low-1" {
			t.Fatalf("victims %v, want low-0 and low-1", victims)
		}
		t.Logf("victims %v", victims)
		p := servedFirstTime(t, ns, "big")
		if p.Spec.NodeName != claimNode {
			t.Errorf("big runs on %s, want %s", p.Spec.NodeName, claimNode)
		}
		// The limiter holds the container at its claim's 40 Gi.
		logsContain(t, ns, "big", "total 40960 MiB")
		bc, gpu := draContainerOn(t, claimNode, ns, "big", "main")
		started = append(started, bc.PID)
		_, was := draContainerOn(t, claimNode, ns, "shared-high", "main")
		if gpu == "" || gpu != was {
			t.Errorf("big sees GPU %q, the victims' was %q", gpu, was)
		}
		for _, v := range victims {
			testenv.WaitFor(t, v+" gone", time.Minute, func() bool {
				_, err := client.CoreV1().Pods(ns).Get(ctx, v, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			})
			c, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, v, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 {
				t.Errorf("victim's claim %s still allocated (%v) or reserved for %v", v, c.Status.Allocation != nil, c.Status.ReservedFor)
			}
			// The kubelet unprepared it before the preemptor's claim
			// was prepared (big runs): nothing of it is left.
			if got := preparedOn(claimNode, uids[v]); len(got) > 0 {
				t.Errorf("victim's claim %s still prepared on %s: %v", v, claimNode, got)
			}
		}
		untouched(t, "shared-high", "shared-low")
		c, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, "shared", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation == nil || len(c.Status.ReservedFor) != 2 {
			t.Errorf("the shared claim: allocated %v, reserved for %v; want it kept for both pods", c.Status.Allocation != nil, c.Status.ReservedFor)
		}
		if got := preparedOn(claimNode, uids["shared"]); len(got) < 3 {
			t.Errorf("the shared claim prepared on %s as %v, want it kept", claimNode, got)
		}
		checkCapacities(t, claimNode)
	})
}
