//go:build integration

package schedulerperf

// API writes per scheduled pod (issue 29's report): scheduler_perf's
// in-process API server does not register its request metrics in the
// test process's registry, and the harness, the controllers and the
// scheduler share one client, so the writes are counted from the API
// server's side of what they changed: the watch events of the kinds a
// pod's scheduling writes (pods, ResourceClaims, Events), from the
// workload's start to its end.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// writeCounter counts, per kind, the objects created and the updates
// that changed one, and which pods were bound.
type writeCounter struct {
	mu        sync.Mutex
	created   map[string]int
	updated   map[string]int
	last      time.Time
	bound     map[types.UID]bool
	problems  []string
	cancel    context.CancelFunc
	done      sync.WaitGroup
	watchedOn []string
}

// countedKinds are the kinds a pod's scheduling writes: the pod (its
// creation, the binding, status and annotation updates), its
// ResourceClaims (made from the pod's template by the claim controller,
// allocated and reserved by the scheduler) and the Events (the
// scheduler's Scheduled and FailedScheduling, and the others').
var countedKinds = []struct {
	name string
	list func(tCtx ktesting.TContext) cache.ListerWatcherWithContext
}{
	{"pods", func(tCtx ktesting.TContext) cache.ListerWatcherWithContext {
		return listWatch[*corev1.PodList](tCtx.Client().CoreV1().Pods(""))
	}},
	{"resourceclaims", func(tCtx ktesting.TContext) cache.ListerWatcherWithContext {
		return listWatch[*resourceapi.ResourceClaimList](tCtx.Client().ResourceV1().ResourceClaims(""))
	}},
	{"events", func(tCtx ktesting.TContext) cache.ListerWatcherWithContext {
		return listWatch[*corev1.EventList](tCtx.Client().CoreV1().Events(""))
	}},
}

// listWatch is the ListerWatcher of a typed client of one kind.
func listWatch[L runtime.Object](c interface {
	List(context.Context, metav1.ListOptions) (L, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}) cache.ListerWatcherWithContext {
	return cache.ToListerWatcherWithContext(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		WatchFuncWithContext: c.Watch,
	})
}

// startCounting starts a watch of each counted kind from the API
// server's current state (nothing of the workload exists yet).
func startCounting(tCtx ktesting.TContext) *writeCounter {
	ctx, cancel := context.WithCancel(tCtx)
	c := &writeCounter{created: map[string]int{}, updated: map[string]int{}, bound: map[types.UID]bool{}, cancel: cancel, last: time.Now()}
	// The watches' goroutines start once every kind is set up: until
	// then only this goroutine touches c (a RetryWatcher holds its
	// events until they are read).
	type started struct {
		kind string
		w    watch.Interface
	}
	var watches []started
	for _, k := range countedKinds {
		lw := k.list(tCtx)
		l, err := lw.ListWithContext(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			c.problems = append(c.problems, fmt.Sprintf("%s not counted: listing them: %v", k.name, err))
			continue
		}
		rv, err := metaResourceVersion(l)
		if err != nil {
			c.problems = append(c.problems, fmt.Sprintf("%s not counted: %v", k.name, err))
			continue
		}
		w, err := watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
		if err != nil {
			c.problems = append(c.problems, fmt.Sprintf("%s not counted: watching them: %v", k.name, err))
			continue
		}
		c.watchedOn = append(c.watchedOn, k.name)
		c.done.Add(1)
		watches = append(watches, started{k.name, w})
	}
	for _, s := range watches {
		go c.consume(ctx, s.kind, s.w)
	}
	return c
}

// consume counts one kind's watch events until ctx ends.
func (c *writeCounter) consume(ctx context.Context, kind string, w watch.Interface) {
	defer c.done.Done()
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			c.observe(kind, ev)
		}
	}
}

func metaResourceVersion(o runtime.Object) (string, error) {
	l, ok := o.(metav1.ListInterface)
	if !ok || l.GetResourceVersion() == "" {
		return "", fmt.Errorf("the list has no resourceVersion")
	}
	return l.GetResourceVersion(), nil
}

func (c *writeCounter) observe(kind string, ev watch.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = time.Now()
	switch ev.Type {
	case watch.Added:
		c.created[kind]++
	case watch.Modified:
		c.updated[kind]++
	case watch.Error:
		c.problems = append(c.problems, fmt.Sprintf("%s: the watch failed: %v", kind, ev.Object))
		return
	default: // deletions are not writes of the pod's scheduling
		return
	}
	if p, ok := ev.Object.(*corev1.Pod); ok && p.Spec.NodeName != "" {
		c.bound[p.UID] = true
	}
}

// stop waits until the watches have been quiet for a second (at most
// 15 s: the workload's last writes still on their way), stops them and
// returns the report line ("" when no pod was bound).
func (c *writeCounter) stop() string {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		quiet := time.Since(c.last) > time.Second
		c.mu.Unlock()
		if quiet {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.cancel()
	c.done.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.bound)
	if n == 0 {
		return ""
	}
	per := func(v int) string { return fmt.Sprintf("%.2f", float64(v)/float64(n)) }
	all := 0
	for _, k := range c.watchedOn {
		all += c.created[k] + c.updated[k]
	}
	line := fmt.Sprintf("API writes per bound pod (%d pods bound; writes that changed an object, from the watch events of %s): %s in all: pods created %s, updated %s (binding, status, annotations); claims created %s, updated %s (allocation, reservation); events created %s, updated %s",
		n, strings.Join(c.watchedOn, ", "), per(all),
		per(c.created["pods"]), per(c.updated["pods"]),
		per(c.created["resourceclaims"]), per(c.updated["resourceclaims"]),
		per(c.created["events"]), per(c.updated["events"]))
	if len(c.problems) > 0 {
		line += "; NOT COMPLETE: " + strings.Join(c.problems, "; ")
	}
	return line
}
