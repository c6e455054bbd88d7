// Package schedhold is a kube-scheduler plugin for tests: it keeps chosen
// pods out of the scheduling queue (PreEnqueue) until the test lets them
// go, and records how each attempt of a pod ended (PostFilter: it fit no
// node; Reserve: it was placed), so a test can wait until a pod has been
// tried and tell whether it was placed, without sleeping.
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
// first at postFilter, and at reserve.
const Name = "TestHold"

// Hold is the plugin, shared by the test and the scheduler.
type Hold struct {
	mu      sync.Mutex
	handle  fwk.Handle
	held    map[string]bool
	gated   map[string]*corev1.Pod
	failed  map[string]int
	placed  map[string]string
	changed chan struct{}
}

// New returns the plugin and a registry that builds it.
func New() (*Hold, frameworkruntime.Registry) {
	h := &Hold{held: map[string]bool{}, gated: map[string]*corev1.Pod{}, failed: map[string]int{}, placed: map[string]string{}, changed: make(chan struct{})}
	return h, frameworkruntime.Registry{Name: func(_ context.Context, _ runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
		h.mu.Lock()
		h.handle = fh
		h.mu.Unlock()
		return h, nil
	}}
}

var (
	_ fwk.PreEnqueuePlugin = (*Hold)(nil)
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
	ns, name, _ := strings.Cut(pod, "/")
	deadline := time.Now().Add(timeout)
	for !h.Gated(pod) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s not held within %v", pod, timeout)
		}
		p, err := fh.SharedInformerFactory().Core().V1().Pods().Lister().Pods(ns).Get(name)
		if err != nil {
			return err
		}
		fh.Activate(klog.Background(), map[string]*corev1.Pod{pod: p})
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

// PostFilter counts an attempt that fit no node; it changes nothing.
func (h *Hold) PostFilter(_ context.Context, _ fwk.CycleState, p *corev1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	h.mu.Lock()
	h.failed[key(p)]++
	h.note()
	h.mu.Unlock()
	return nil, fwk.NewStatus(fwk.Unschedulable)
}

// Reserve records the node a pod was placed on.
func (h *Hold) Reserve(_ context.Context, _ fwk.CycleState, p *corev1.Pod, node string) *fwk.Status {
	h.mu.Lock()
	h.placed[key(p)] = node
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

// Placed is the node the pod was placed on ("" if none).
func (h *Hold) Placed(pod string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.placed[pod]
}

// WaitAttempt waits until the pod has been tried once more than the
// failed attempts counted in after (Failed before the event the test
// waits on), and reports the node it was placed on ("" if the attempt
// failed).
func (h *Hold) WaitAttempt(ctx context.Context, pod string, after int, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		failed, node, ch := h.failed[pod], h.placed[pod], h.changed
		h.mu.Unlock()
		switch {
		case node != "":
			return node, nil
		case failed > after:
			return "", nil
		}
		select {
		case <-ch:
		case <-deadline:
			return "", fmt.Errorf("pod %s was not tried again within %v (%d failed attempts)", pod, timeout, failed)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}
