package status

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/lab/poll"
)

// WaitSettled waits until the namespace's Deployments have all their
// replicas created and each pod runs, has finished, or is pending with
// the scheduler's reason.
func WaitSettled(ctx context.Context, client kubernetes.Interface, ns string, timeout time.Duration) error {
	var waiting []string
	err := poll.Until(ctx, timeout, func(ctx context.Context) (bool, error) {
		waiting = waiting[:0]
		deps, err := client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range deps.Items {
			if d.Spec.Replicas != nil && d.Status.Replicas < *d.Spec.Replicas {
				waiting = append(waiting, "deployment "+d.Name)
			}
		}
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if !settled(&p) {
				waiting = append(waiting, fmt.Sprintf("pod %s (%s)", p.Name, p.Status.Phase))
			}
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w: still waiting for %s", err, strings.Join(waiting, ", "))
	}
	return nil
}

func settled(p *corev1.Pod) bool {
	switch p.Status.Phase {
	case corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed:
		return true
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}
