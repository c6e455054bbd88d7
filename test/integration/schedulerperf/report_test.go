//go:build integration

package schedulerperf

// The report of each workload (dra_test.go logs it after the workload):
// where its time went, and how long one read of the metrics registry
// takes (scheduler_perf reads it once per label combination it collects
// after the measured phase).

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"k8s.io/component-base/metrics/legacyregistry"
)

// workload is the report's state for the workload running now (the
// scheduler_perf workloads run one after the other).
type workload struct {
	mu                                  sync.Mutex
	start, nodesOp, created, ready, end time.Time
	nodes                               int
}

var (
	current = &workload{}
	// lastEnd is when the previous workload's checks ended: from there
	// to the next start its API server and etcd stopped and the next
	// ones started.
	lastEnd time.Time
)

// startWorkload starts the report of a workload: the harness calls the
// prepare hook right before it runs the workload's operations.
func startWorkload() *workload {
	current = &workload{start: time.Now()}
	return current
}

// nodesOpDone: the createNodes operation is done (the node hook runs).
func (w *workload) nodesOpDone() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nodesOp = time.Now()
}

// nodesCreated: the workload's n nodes stand (createNodes and
// createDRANodes made them).
func (w *workload) nodesCreated(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.created, w.nodes = time.Now(), n
}

// nodesReady: the nodes and their slices stand.
func (w *workload) nodesReady() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready = time.Now()
}

// finished: the workload's operations are done (its first cleanup).
func (w *workload) finished() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.end = time.Now()
}

// timing says where the workload's wall time went.
func (w *workload) timing() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	sec := func(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
	var b strings.Builder
	fmt.Fprintf(&b, "time: ")
	if !lastEnd.IsZero() {
		fmt.Fprintf(&b, "previous workload's teardown and this one's API server, etcd and scheduler %s, ", sec(w.start.Sub(lastEnd)))
	}
	if !w.created.IsZero() {
		fmt.Fprintf(&b, "createNodes %s, %d nodes in all by the node hook %s, ResourceSlices published %s, pods created and scheduled with the harness's metrics collection %s",
			sec(w.nodesOp.Sub(w.start)), w.nodes, sec(w.created.Sub(w.nodesOp)), sec(w.ready.Sub(w.created)), sec(w.end.Sub(w.ready)))
	} else {
		fmt.Fprintf(&b, "workload %s", sec(w.end.Sub(w.start)))
	}
	fmt.Fprintf(&b, ", checks %s; one read of the metrics registry %.0f ms", sec(now.Sub(w.end)), float64(registryRead())/float64(time.Millisecond))
	lastEnd = now
	return b.String()
}

// registryRead times one read of the process's metrics registry.
func registryRead() time.Duration {
	start := time.Now()
	_, _ = legacyregistry.DefaultGatherer.Gather()
	return time.Since(start)
}
