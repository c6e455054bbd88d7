package clusterview

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// WhyVictim is a pod a preemption evicted for the pod.
type WhyVictim struct {
	Pod string `json:"pod"`
	// State is "terminating", "gone" or "running" (its eviction has not
	// started).
	State string `json:"state"`
	// Note is the scheduler's Preempted event on the victim: the node,
	// and the GPU it frees for the pod.
	Note string `json:"note,omitempty"`
}

// preemptedReason is the reason of kube-scheduler's event on a victim.
const preemptedReason = "Preempted"

// Preemptions adds to w, the report on a pending pod, the node a
// preemption nominated for it (its status.nominatedNodeName) and the pods
// evicted for it: the Preempted events kube-scheduler writes on each
// victim name the pod as their related object. Events of every namespace
// are read if the user may list them, else those of the pod's namespace.
func (r *Report) Preemptions(ctx context.Context, client kubernetes.Interface, w *WhyReport) error {
	p := r.objs[w.Pod]
	if p == nil || p.Spec.NodeName != "" {
		return nil
	}
	w.Nominated = p.Status.NominatedNodeName
	opts := metav1.ListOptions{FieldSelector: "reason=" + preemptedReason}
	evs, err := client.CoreV1().Events(metav1.NamespaceAll).List(ctx, opts)
	if apierrors.IsForbidden(err) {
		evs, err = client.CoreV1().Events(p.Namespace).List(ctx, opts)
	}
	if err != nil {
		return fmt.Errorf("reading the Preempted events: %w", err)
	}
	seen := map[string]bool{}
	// The event names the preemptor as its related object where the
	// recorder could reference it, and always by UID in its note
	// ("Preempted by pod <uid> on node <node>").
	byUID := "Preempted by pod " + string(p.UID)
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind != "Pod" || !(e.Related != nil && e.Related.UID == p.UID || strings.HasPrefix(e.Message, byUID)) {
			continue
		}
		key := e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name
		if seen[key] {
			continue
		}
		seen[key] = true
		v := WhyVictim{Pod: key, State: "gone", Note: e.Message}
		if cur := r.objs[key]; cur != nil && cur.UID == e.InvolvedObject.UID {
			v.State = "running"
			if cur.DeletionTimestamp != nil {
				v.State = "terminating"
			}
		}
		w.Victims = append(w.Victims, v)
	}
	sort.Slice(w.Victims, func(i, j int) bool { return w.Victims[i].Pod < w.Victims[j].Pod })
	return nil
}

// printPreemption writes the nomination and the victims.
func (w *WhyReport) printPreemption(out io.Writer) {
	if w.Nominated == "" && len(w.Victims) == 0 {
		return
	}
	if w.Nominated != "" {
		fmt.Fprintf(out, "\nNominated node: %s (by preemption: the pod waits there until its victims have gone)\n", w.Nominated)
	} else {
		fmt.Fprintf(out, "\nPreempted for it, no node nominated now:\n")
	}
	for _, v := range w.Victims {
		fmt.Fprintf(out, "  victim %s (%s): %s\n", v.Pod, v.State, v.Note)
	}
}
