package preflight

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// NotReadyReason is the reason of the event WaitRolledOut writes when the
// release's DaemonSets do not become ready in time.
const NotReadyReason = "TesseraNotReady"

// rolledOut says whether a DaemonSet runs its current template, ready, on
// every node it selects. Helm's --wait is weaker: it waits for the desired
// number less maxUnavailable (none at all on a cluster of one GPU node)
// and not at all for OnDelete.
func rolledOut(ds *appsv1.DaemonSet) bool {
	s := ds.Status
	if s.ObservedGeneration < ds.Generation || s.NumberReady < s.DesiredNumberScheduled {
		return false
	}
	return ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType || s.UpdatedNumberScheduled >= s.DesiredNumberScheduled
}

// Settle is how long each of a DaemonSet's pods must have been ready
// before WaitRolledOut counts it: a container without a readiness probe
// is ready from its start, so one that fails its checks at start and
// restarts is ready for moments between its crashes.
const Settle = 10 * time.Second

// settled says whether every pod of the DaemonSet has been ready, without
// a break, for Settle at now.
func settled(ctx context.Context, client kubernetes.Interface, ds *appsv1.DaemonSet, now time.Time) bool {
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return false
	}
	pods, err := client.CoreV1().Pods(ds.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return false
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		ready := false
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && !now.Before(c.LastTransitionTime.Add(Settle)) {
				ready = true
			}
		}
		if !ready {
			return false
		}
	}
	return true
}

// WaitRolledOut waits until every DaemonSet in namespace matching selector
// has rolled out (its pods ready on every node it selects, each for
// Settle), polling every
// interval, for at most timeout. On timeout it returns an error naming
// each DaemonSet that has not, with what keeps its pods from being ready
// (containers' waiting and termination reasons, the pods' Warning events:
// a missing host path, an image that cannot be pulled, a failed check at
// start), and writes the same as a Warning event on the DaemonSet.
func WaitRolledOut(ctx context.Context, client kubernetes.Interface, namespace, selector string, timeout, interval time.Duration) error {
	logger := klog.FromContext(ctx)
	deadline := time.Now().Add(timeout)
	for {
		list, err := client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return fmt.Errorf("listing the DaemonSets %s in %s: %w", selector, namespace, err)
		}
		var waiting []*appsv1.DaemonSet
		for i := range list.Items {
			if !rolledOut(&list.Items[i]) || !settled(ctx, client, &list.Items[i], time.Now()) {
				waiting = append(waiting, &list.Items[i])
			}
		}
		if len(waiting) == 0 {
			var names []string
			for _, ds := range list.Items {
				names = append(names, fmt.Sprintf("%s (%d ready)", ds.Name, ds.Status.NumberReady))
			}
			logger.Info("DaemonSets rolled out", "namespace", namespace, "selector", selector, "daemonSets", names)
			return nil
		}
		if !time.Now().Before(deadline) {
			var problems []string
			for _, ds := range waiting {
				p := describeNotReady(ctx, client, ds)
				problems = append(problems, p)
				Report(ctx, client, Subject{
					Object:    corev1.ObjectReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, Namespace: ds.Namespace, UID: ds.UID},
					Component: "tessera-wait-ready", Reason: NotReadyReason,
				}, errors.New(p))
			}
			return fmt.Errorf("not ready after %s: %s", timeout, strings.Join(problems, "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// describeNotReady says what keeps a DaemonSet's pods from being ready.
func describeNotReady(ctx context.Context, client kubernetes.Interface, ds *appsv1.DaemonSet) string {
	s := ds.Status
	head := fmt.Sprintf("DaemonSet %s/%s: %d of %d pods ready, %d up to date", ds.Namespace, ds.Name, s.NumberReady, s.DesiredNumberScheduled, s.UpdatedNumberScheduled)
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return head
	}
	pods, err := client.CoreV1().Pods(ds.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return head + fmt.Sprintf(" (listing its pods: %v)", err)
	}
	events, _ := client.CoreV1().Events(ds.Namespace).List(ctx, metav1.ListOptions{})
	var reasons []string
	for _, p := range pods.Items {
		var why []string
		for _, cs := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			if cs.State.Waiting != nil && cs.State.Waiting.Reason != "" {
				w := "container " + cs.Name + " " + cs.State.Waiting.Reason
				if cs.State.Waiting.Message != "" {
					w += ": " + cs.State.Waiting.Message
				}
				why = append(why, w)
			}
			// A container that keeps exiting: how it last ended (with
			// FallbackToLogsOnError, its last log lines).
			if cs.LastTerminationState.Terminated != nil && !cs.Ready {
				term := cs.LastTerminationState.Terminated
				w := fmt.Sprintf("container %s exited %d (%s)", cs.Name, term.ExitCode, term.Reason)
				if m := strings.TrimSpace(term.Message); m != "" {
					w += ": " + m
				}
				why = append(why, w)
			}
		}
		seen := map[string]bool{}
		if events != nil {
			sort.Slice(events.Items, func(i, j int) bool { return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp) })
			for _, e := range events.Items {
				if e.Type == corev1.EventTypeWarning && e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == p.Name && !seen[e.Message] {
					seen[e.Message] = true
					why = append(why, e.Reason+": "+e.Message)
				}
			}
		}
		if len(why) == 0 {
			why = append(why, string(p.Status.Phase))
		}
		reasons = append(reasons, fmt.Sprintf("pod %s on node %s: %s", p.Name, p.Spec.NodeName, strings.Join(why, ", ")))
	}
	if len(reasons) == 0 {
		return head
	}
	return head + ": " + strings.Join(reasons, "; ")
}
