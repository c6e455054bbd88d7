package preflight

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func daemonSet(name string, strategy appsv1.DaemonSetUpdateStrategyType, desired, ready, updated int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "tessera-system", Generation: 2, Labels: map[string]string{"app.kubernetes.io/instance": "tessera"}},
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: strategy},
		},
		Status: appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: desired, NumberReady: ready, UpdatedNumberScheduled: updated},
	}
}

func TestRolledOut(t *testing.T) {
	for _, c := range []struct {
		name string
		ds   *appsv1.DaemonSet
		want bool
	}{
		// helm's --wait takes this one as ready (1 desired less
		// maxUnavailable 1): the case the hook exists for.
		{"one node, not ready", daemonSet("a", appsv1.RollingUpdateDaemonSetStrategyType, 1, 0, 1), false},
		{"one node, ready", daemonSet("a", appsv1.RollingUpdateDaemonSetStrategyType, 1, 1, 1), true},
		{"no GPU node yet", daemonSet("a", appsv1.RollingUpdateDaemonSetStrategyType, 0, 0, 0), true},
		{"ready, old template", daemonSet("a", appsv1.RollingUpdateDaemonSetStrategyType, 2, 2, 1), false},
		{"OnDelete, ready, old template", daemonSet("a", appsv1.OnDeleteDaemonSetStrategyType, 2, 2, 1), true},
		{"OnDelete, not ready", daemonSet("a", appsv1.OnDeleteDaemonSetStrategyType, 2, 1, 2), false},
	} {
		if got := rolledOut(c.ds); got != c.want {
			t.Errorf("%s: rolledOut = %v, want %v", c.name, got, c.want)
		}
	}
	stale := daemonSet("a", appsv1.RollingUpdateDaemonSetStrategyType, 1, 1, 1)
	stale.Status.ObservedGeneration = 1
	if rolledOut(stale) {
		t.Error("a status of the previous generation counts as rolled out")
	}
}

func TestWaitRolledOut(t *testing.T) {
	ctx := context.Background()
	const sel = "app.kubernetes.io/instance=tessera"
	ready := daemonSet("tessera-kubelet-shim", appsv1.OnDeleteDaemonSetStrategyType, 1, 1, 1)
	shimPod := func(readyFor time.Duration) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "tessera-kubelet-shim-x1", Namespace: "tessera-system", Labels: map[string]string{"app": "tessera-kubelet-shim"}},
			Spec:       corev1.PodSpec{NodeName: "gpu-1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{
				Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(time.Now().Add(-readyFor)),
			}}},
		}
	}
	client := fake.NewClientset(ready, shimPod(time.Minute))
	if err := WaitRolledOut(ctx, client, "tessera-system", sel, time.Second, 10*time.Millisecond); err != nil {
		t.Fatalf("ready DaemonSets: %v", err)
	}
	// Ready a moment ago: a container without a readiness probe between
	// two crashes is ready from its start.
	client = fake.NewClientset(ready, shimPod(time.Second))
	if err := WaitRolledOut(ctx, client, "tessera-system", sel, 50*time.Millisecond, 10*time.Millisecond); err == nil {
		t.Fatalf("a pod ready for a second counted as rolled out")
	}

	// The node agent cannot start: its host path is missing.
	agent := daemonSet("tessera-node-agent", appsv1.RollingUpdateDaemonSetStrategyType, 1, 0, 1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-node-agent-x1", Namespace: "tessera-system", Labels: map[string]string{"app": "tessera-node-agent"}},
		Spec:       corev1.PodSpec{NodeName: "gpu-1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "node-agent", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
		}}},
	}
	mount := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "e1", Namespace: "tessera-system"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: pod.Name, Namespace: "tessera-system"},
		Type:           corev1.EventTypeWarning, Reason: "FailedMount",
		Message: `MountVolume.SetUp failed for volume "driver-root" : hostPath type check failed: /run/nvidia/driver is not a directory`,
	}
	other := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "e2", Namespace: "tessera-system"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "unrelated", Namespace: "tessera-system"},
		Type:           corev1.EventTypeWarning, Reason: "BackOff", Message: "somebody else's pod",
	}
	client = fake.NewClientset(ready, agent, pod, mount, other)
	err := WaitRolledOut(ctx, client, "tessera-system", sel, 50*time.Millisecond, 10*time.Millisecond)
	if err == nil {
		t.Fatal("a DaemonSet with no ready pod on its one node: no error")
	}
	for _, want := range []string{"tessera-node-agent", "0 of 1 pods ready", "gpu-1", "ContainerCreating", "/run/nvidia/driver is not a directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "tessera-kubelet-shim") || strings.Contains(err.Error(), "somebody else's pod") {
		t.Errorf("the error names what is ready or unrelated: %v", err)
	}
	evs, _ := client.CoreV1().Events("tessera-system").List(ctx, metav1.ListOptions{})
	var found bool
	for _, e := range evs.Items {
		if e.Reason == NotReadyReason {
			found = e.InvolvedObject.Kind == "DaemonSet" && e.InvolvedObject.Name == "tessera-node-agent" && strings.Contains(e.Message, "/run/nvidia/driver")
		}
	}
	if !found {
		t.Errorf("no %s event on the DaemonSet naming the cause: %v", NotReadyReason, evs.Items)
	}

	// A container that keeps exiting: its exit and message.
	pod.Status.ContainerStatuses[0] = corev1.ContainerStatus{
		Name: "node-agent", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "no CDI spec names GPU-1"}},
	}
	client = fake.NewClientset(agent, pod)
	err = WaitRolledOut(ctx, client, "tessera-system", sel, 0, time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "CrashLoopBackOff: back-off 10s") || !strings.Contains(err.Error(), "node-agent exited 1 (Error): no CDI spec names GPU-1") {
		t.Errorf("crash loop: %v", err)
	}
}
