//go:build integration

package schedulerperf

// The report of each workload (dra_test.go logs it after the workload):
// where its time went, and the API writes the scheduling of its pods
// cost, counted by the in-process API server (apiserver_request_total,
// scheduler_perf runs kube-apiserver in the test's process), by verb and
// resource, from the moment the nodes (and ResourceSlices) stand to the
// end of the workload. Every component shares one client in
// scheduler_perf, so the writes are told apart by what makes them: the
// harness creates the pods (POST pods), the resourceclaim controller the
// claims of templates (POST resourceclaims) and the pods' claim statuses
// (server-side apply of pods/status, verb APPLY); every other write is
// the scheduler's: the binding, claim allocations (resourceclaims/status),
// pod conditions (PATCH pods/status), events, and Tessera's own.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apimetrics "k8s.io/apiserver/pkg/endpoints/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// workload is the report's state for the workload running now (the
// scheduler_perf workloads run one after the other).
type workload struct {
	mu                                  sync.Mutex
	start, nodesOp, created, ready, end time.Time
	nodes                               int
	writesAtReady                       map[writeKind]float64
}

// writeKind is one series of apiserver_request_total, less its code.
type writeKind struct{ verb, resource, subresource string }

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
	// The API server's request metrics count only once registered (the
	// test server serves no /metrics of its own to register them).
	apimetrics.Register()
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

// nodesReady: the nodes and their slices stand; the writes are counted
// from here.
func (w *workload) nodesReady() {
	writes := apiWrites()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready, w.writesAtReady = time.Now(), writes
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
	fmt.Fprintf(&b, ", checks %s; one read of the metrics registry %.0f ms", sec(now.Sub(w.end)), float64(gatherTime)/float64(time.Millisecond))
	lastEnd = now
	return b.String()
}

// writesPerPod counts the API writes since the nodes stood and divides
// them by the pods bound; "" when no pod was bound.
func (w *workload) writesPerPod(tCtx ktesting.TContext) (string, error) {
	now := apiWrites()
	w.mu.Lock()
	before := w.writesAtReady
	w.mu.Unlock()
	if before == nil {
		return "", nil
	}
	pods, err := tCtx.Client().CoreV1().Pods(metav1.NamespaceAll).List(tCtx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	bound := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			bound++
		}
	}
	if bound == 0 {
		return "", nil
	}
	var all, sched float64
	var parts []string
	for k, v := range now {
		d := v - before[k]
		if d <= 0 {
			continue
		}
		all += d
		if !notScheduler(k) {
			sched += d
		}
		name := k.verb + " " + k.resource
		if k.subresource != "" {
			name += "/" + k.subresource
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", name, d/float64(bound)))
	}
	slices.Sort(parts)
	return fmt.Sprintf("API writes per scheduled pod (%d pods): %.2f by the scheduler, %.2f in all (%s)", bound, sched/float64(bound), all/float64(bound), strings.Join(parts, ", ")), nil
}

// notScheduler: writes the harness or the resourceclaim controller make.
func notScheduler(k writeKind) bool {
	switch {
	case k.verb == "POST" && k.subresource == "" && (k.resource == "pods" || k.resource == "resourceclaims" || k.resource == "namespaces" || k.resource == "resourceclaimtemplates"):
		return true
	case k.verb == "APPLY" && k.resource == "pods" && k.subresource == "status":
		return true
	}
	return false
}

// gatherTime is how long the last read of the metrics registry took:
// scheduler_perf reads it once per label combination it collects after
// each workload.
var gatherTime time.Duration

// apiWrites reads the in-process API server's write requests so far.
func apiWrites() map[writeKind]float64 {
	out := map[writeKind]float64{}
	start := time.Now()
	// An error (a collector of the test process that fails) comes with
	// what the other collectors gave: use that.
	families, _ := legacyregistry.DefaultGatherer.Gather()
	gatherTime = time.Since(start)
	for _, f := range families {
		if f.GetName() != "apiserver_request_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var k writeKind
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "verb":
					k.verb = l.GetValue()
				case "resource":
					k.resource = l.GetValue()
				case "subresource":
					k.subresource = l.GetValue()
				}
			}
			switch k.verb {
			case "POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION":
				out[k] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
