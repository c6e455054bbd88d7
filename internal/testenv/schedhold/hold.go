// Package schedhold is a kube-scheduler plugin for tests: it keeps chosen
// pods out of the scheduling queue (PreEnqueue) until the test lets them
// go, and counts each pod's attempts as they start (PreFilter) and end
// (PostFilter: it fit no node; Reserve: it was placed), so a test can
// make a pod be tried after something happened and tell whether that
// attempt placed it, without sleeping.
package schedhold

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// Name is the plugin's name in a test's profile: enable it at preEnqueue,
// first at preFilter and at postFilter, and at reserve.
const Name = "TestHold"

// Hold is the plugin, shared by the test and the scheduler.
type Hold struct {
	mu      sync.Mutex
	handle  fwk.Handle
	held    map[string]bool
	gated   map[string]*corev1.Pod
	started map[string]int
	ended   map[string]int
	failed  map[string]int
	placed  map[string]string
	changed chan struct{}
}

// New returns the plugin and a registry that builds it.
func New() (*Hold, frameworkruntime.Registry) {
	h := &Hold{held: map[string]bool{}, gated: map[string]*corev1.Pod{}, started: map[string]int{}, ended: map[string]int{},
		failed: map[string]int{}, placed: map[string]string{}, changed: make(chan struct{})}
	return h, frameworkruntime.Registry{Name: func(_ context.Context, _ runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
		h.mu.Lock()
		h.handle = fh
		h.mu.Unlock()
		return h, nil
	}}
}

var (
	_ fwk.PreEnqueuePlugin = (*Hold)(nil)
	_ fwk.PreFilterPlugin  = (*Hold)(nil)
	_ fwk.PostFilterPlugin = (*Hold)(nil)
	_ fwk.ReservePlugin    = (*Hold)(nil)
)

func (h *Hold) Name() string { return Name }

func key(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// Hold keeps pod namespace/name out of the queue and returns once it is
// held (Gated): it sends the pod back to the queue (kube-scheduler's
// Activate) until the queue runs PreEnqueue on it. (A pod activated out
// of the backoff queue, or in a scheduling cycle now, may be tried once
// more first.)
func (h *Hold) Hold(ctx context.Context, pod string, timeout time.Duration) error {
	h.mu.Lock()
	h.held[pod] = true
	fh := h.handle
	h.mu.Unlock()
	if fh == nil {
		return fmt.Errorf("the scheduler has not built plugin %s", Name)
	}
	deadline := time.Now().Add(timeout)
	for !h.Gated(pod) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s not held within %v", pod, timeout)
		}
		if err := h.Kick(pod); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Release lets the pod into the queue again.
func (h *Hold) Release(pod string) {
	h.mu.Lock()
	delete(h.held, pod)
	p := h.gated[pod]
	delete(h.gated, pod)
	fh := h.handle
	h.mu.Unlock()
	if p != nil && fh != nil {
		fh.Activate(klog.Background(), map[string]*corev1.Pod{pod: p})
	}
}

// PreEnqueue keeps held pods out of the queue.
func (h *Hold) PreEnqueue(_ context.Context, p *corev1.Pod) *fwk.Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.held[key(p)] {
		return nil
	}
	h.gated[key(p)] = p
	h.note()
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "held by the test")
}

// PreFilter counts an attempt's start; it changes nothing.
func (h *Hold) PreFilter(_ context.Context, _ fwk.CycleState, p *corev1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	h.mu.Lock()
	h.started[key(p)]++
	h.mu.Unlock()
	return nil, nil
}

func (h *Hold) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// PostFilter counts an attempt that fit no node; it changes nothing.
func (h *Hold) PostFilter(_ context.Context, _ fwk.CycleState, p *corev1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	h.mu.Lock()
	h.failed[key(p)]++
	h.ended[key(p)]++
	h.note()
	h.mu.Unlock()
	return nil, fwk.NewStatus(fwk.Unschedulable)
}

// Reserve records the node a pod was placed on.
func (h *Hold) Reserve(_ context.Context, _ fwk.CycleState, p *corev1.Pod, node string) *fwk.Status {
	h.mu.Lock()
	h.placed[key(p)] = node
	h.ended[key(p)]++
	h.note()
	h.mu.Unlock()
	return nil
}

func (h *Hold) Unreserve(context.Context, fwk.CycleState, *corev1.Pod, string) {}

// note wakes the waiters; the caller holds mu.
func (h *Hold) note() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// Failed is how many attempts of the pod fit no node so far.
func (h *Hold) Failed(pod string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed[pod]
}

// Gated reports whether the pod is held out of the queue now.
func (h *Hold) Gated(pod string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.gated[pod]
	return ok
}

// Handle is the scheduler framework's handle of the profile (nil before
// the scheduler has built it): a test reads the scheduler's own caches
// through it (its claim tracker).
func (h *Hold) Handle() fwk.Handle {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.handle
}

// Placed is the node the pod was placed on ("" if none).
func (h *Hold) Placed(pod string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.placed[pod]
}

// Started is how many attempts of the pod have started.
func (h *Hold) Started(pod string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.started[pod]
}

// Kick sends the pod to be tried again (kube-scheduler's Activate; a pod
// in a scheduling cycle now goes back when the cycle ends): an attempt
// that starts after the call follows.
func (h *Hold) Kick(pod string) error {
	h.mu.Lock()
	fh := h.handle
	h.mu.Unlock()
	if fh == nil {
		return fmt.Errorf("the scheduler has not built plugin %s", Name)
	}
	ns, name, _ := strings.Cut(pod, "/")
	p, err := fh.SharedInformerFactory().Core().V1().Pods().Lister().Pods(ns).Get(name)
	if err != nil {
		return err
	}
	fh.Activate(klog.Background(), map[string]*corev1.Pod{pod: p})
	return nil
}

// WaitAttempt waits until attempt after+1 of the pod (attempts numbered
// as they start: Started) has ended, and reports the node the pod was
// placed on by then ("" if none). A pod's attempts end in order.
func (h *Hold) WaitAttempt(ctx context.Context, pod string, after int, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		ended, node, ch := h.ended[pod], h.placed[pod], h.changed
		h.mu.Unlock()
		if node != "" || ended > after {
			return node, nil
		}
		select {
		case <-ch:
		case <-deadline:
			return "", fmt.Errorf("attempt %d of pod %s did not end within %v (%d ended)", after+1, pod, timeout, ended)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}
