package scheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	kubescheduler "k8s.io/kubernetes/pkg/scheduler"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/profile"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// testScheduler is kube-scheduler itself (k8s.io/kubernetes/pkg/scheduler)
// running the shipped profile (deploy/scheduler/config.yaml) with
// Tessera's plugins over a fake clientset, as scheduler-plugins tests its
// plugins: every pod a test creates goes through every extension point
// the profile enables, in kube-scheduler's order, and Bind writes the
// record where the shipped profile writes it.
type testScheduler struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	plugin *Plugin // the Tessera plugin of the profile
	sched  *kubescheduler.Scheduler
	log    *eventLog // every event the profile emitted, as it emitted it
}

// shippedConfig is deploy/scheduler/config.yaml as kube-scheduler loads
// it: decoded, defaulted and validated.
func shippedConfig(t *testing.T) *schedconfig.KubeSchedulerConfiguration {
	t.Helper()
	obj, _, err := scheme.Codecs.UniversalDecoder().Decode(deploy.SchedulerConfig, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, ok := obj.(*schedconfig.KubeSchedulerConfiguration)
	if !ok {
		t.Fatalf("deploy/scheduler/config.yaml decodes to %T", obj)
	}
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// newTestScheduler starts the scheduler on a fake API server holding
// objs (Nodes, Pods, …); mutate, if not nil, changes the shipped profile
// first. The scheduler stops when the test ends.
func newTestScheduler(t *testing.T, mutate func(*schedconfig.KubeSchedulerProfile), objs ...runtime.Object) *testScheduler {
	t.Helper()
	return newTestSchedulerWith(t, nil, mutate, objs...)
}

// newTestSchedulerWith is newTestScheduler with extra plugins registered
// (a test's own, for its profile to enable).
func newTestSchedulerWith(t *testing.T, extra frameworkruntime.Registry, mutate func(*schedconfig.KubeSchedulerProfile), objs ...runtime.Object) *testScheduler {
	t.Helper()
	cfg := shippedConfig(t)
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != api.SchedulerName {
		t.Fatalf("the shipped configuration has profiles %+v, want one named %s", cfg.Profiles, api.SchedulerName)
	}
	if mutate != nil {
		mutate(&cfg.Profiles[0])
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	client := fake.NewClientset(objs...)
	bindingServer(client, nil)
	ts := &testScheduler{t: t, ctx: ctx, client: client, log: &eventLog{}}
	var mu sync.Mutex
	registry := Registry()
	for n, f := range extra {
		registry[n] = f
	}
	registry[Name] = func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		pl, err := New(ctx, obj, h)
		if err == nil {
			mu.Lock()
			ts.plugin = pl.(*Plugin)
			mu.Unlock()
		}
		return pl, err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	recorders := profile.NewRecorderFactory(broadcaster)
	logged := func(name string) events.EventRecorderLogger {
		return loggedRecorder{EventRecorderLogger: recorders(name), log: ts.log}
	}
	sched, err := kubescheduler.New(ctx, client, factory, nil, logged,
		kubescheduler.WithProfiles(cfg.Profiles...),
		kubescheduler.WithFrameworkOutOfTreeRegistry(registry),
		kubescheduler.WithPodInitialBackoffSeconds(1),
		kubescheduler.WithPodMaxBackoffSeconds(1),
	)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ts.sched = sched
	// Events reach the fake API server (trust_test.go reads them).
	broadcaster.StartRecordingToSink(ctx.Done())
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sched.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		factory.Shutdown()
		broadcaster.Shutdown()
	})
	if ts.plugin == nil {
		t.Fatal("the shipped profile did not build the Tessera plugin")
	}
	return ts
}

// create creates the pod (in namespace default if it names none) and
// returns it as created.
func (ts *testScheduler) create(pod *corev1.Pod) *corev1.Pod {
	ts.t.Helper()
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	if pod.Spec.SchedulerName == "" {
		pod.Spec.SchedulerName = api.SchedulerName
	}
	if pod.UID == "" { // the fake API server assigns none
		pod.UID = types.UID("uid-" + pod.Namespace + "-" + pod.Name)
	}
	created, err := ts.client.CoreV1().Pods(pod.Namespace).Create(ts.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		ts.t.Fatal(err)
	}
	return created
}

// schedule creates the pod and waits for the scheduler's verdict: the
// node it bound the pod to (whose record it checks), or "" and the
// message of the pod's PodScheduled=False condition.
func (ts *testScheduler) schedule(pod *corev1.Pod) (node, msg string) {
	ts.t.Helper()
	created := ts.create(pod)
	return ts.verdict(created.Namespace, created.Name)
}

// verdict waits until the pod is bound or found unschedulable.
func (ts *testScheduler) verdict(ns, name string) (node, msg string) {
	ts.t.Helper()
	var pod *corev1.Pod
	testenv.WaitFor(ts.t, "the scheduler's verdict on "+ns+"/"+name, 30*time.Second, func() bool {
		p, err := ts.client.CoreV1().Pods(ns).Get(ts.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pod = p
		return p.Spec.NodeName != "" || unschedulable(p) != ""
	})
	if pod.Spec.NodeName == "" {
		return "", unschedulable(pod)
	}
	if !kubeobj.RequestsGPU(pod, names) {
		return pod.Spec.NodeName, ""
	}
	rec, err := kubeobj.Record(pod)
	if err != nil {
		ts.t.Fatalf("pod %s bound to %s without a valid record: %v", name, pod.Spec.NodeName, err)
	}
	if rec.Node != pod.Spec.NodeName {
		ts.t.Fatalf("pod %s bound to %s, its record names %s", name, pod.Spec.NodeName, rec.Node)
	}
	return pod.Spec.NodeName, ""
}

// waitBound waits until the pod is bound and returns its node.
func (ts *testScheduler) waitBound(ns, name string) string {
	ts.t.Helper()
	var node string
	testenv.WaitFor(ts.t, ns+"/"+name+" bound", 30*time.Second, func() bool {
		p, err := ts.client.CoreV1().Pods(ns).Get(ts.ctx, name, metav1.GetOptions{})
		if err == nil {
			node = p.Spec.NodeName
		}
		return node != ""
	})
	return node
}

func unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}

// held is how many pods hold GPUs in the plugin's state.
func (ts *testScheduler) held() int {
	ts.plugin.st.mu.RLock()
	defer ts.plugin.st.mu.RUnlock()
	return ts.plugin.st.cluster.PodCount()
}

// check runs the core's invariant checker over the plugin's state.
func (ts *testScheduler) check() {
	ts.t.Helper()
	ts.plugin.st.mu.RLock()
	defer ts.plugin.st.mu.RUnlock()
	if err := ts.plugin.st.cluster.Check(); err != nil {
		ts.t.Fatal(err)
	}
}

// bindingServer makes the fake clientset apply Bindings as the API server
// does (node name and annotations onto the pod, Conflict once bound);
// fail, if set, turns an applied binding's answer into an error.
func bindingServer(client *fake.Clientset, fail func(applied int) error) {
	var mu sync.Mutex
	applied := 0
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		b := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
		obj, err := client.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if pod.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods/binding"}, b.Name, nil)
		}
		pod.Spec.NodeName = b.Target.Name
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		for k, v := range b.Annotations {
			pod.Annotations[k] = v
		}
		if err := client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, pod, b.Namespace); err != nil {
			return true, nil, err
		}
		applied++
		if fail != nil {
			return true, nil, fail(applied)
		}
		return true, nil, nil
	})
}

// bindAttempts counts the Bindings the scheduler asked for the pod.
func (ts *testScheduler) bindAttempts(name string) int {
	n := 0
	for _, a := range ts.client.Actions() {
		if c, ok := a.(k8stesting.CreateAction); ok && a.GetSubresource() == "binding" {
			if b, ok := c.GetObject().(*corev1.Binding); ok && b.Name == name {
				n++
			}
		}
	}
	return n
}

// candidates is the plugin's candidates for the pod, as its PreFilter
// computes them before applying the pod's own node rules.
func (ts *testScheduler) candidates(pod *corev1.Pod) sets.Set[string] {
	ts.t.Helper()
	p := ts.plugin
	req, err := podrequest.FromPod(pod, p.names)
	if err != nil {
		ts.t.Fatal(err)
	}
	p.st.mu.RLock()
	cr, err := p.st.cluster.Compile(req)
	n := len(p.st.slot)
	p.st.mu.RUnlock()
	if err != nil {
		ts.t.Fatal(err)
	}
	pol := placement.Prepare(cr, placement.PolicyFor(cr, p.policy))
	return p.candidates(ts.ctx, &cycleState{cr: cr, pol: pol, ranker: placement.RankerFor(cr, pol), scores: make([]float64, n)})
}

// countActivations counts, from now on, the pods the plugin activates
// for their narrowed retry (PostFilter of a narrowed attempt): the
// returned function reads the count.
func (ts *testScheduler) countActivations() func() int {
	var mu sync.Mutex
	n := 0
	p := ts.plugin
	// Set before the test creates its pod: the scheduler reads it after.
	activate := p.activate
	p.activate = func(logger klog.Logger, pods map[string]*corev1.Pod) {
		mu.Lock()
		n += len(pods)
		mu.Unlock()
		activate(logger, pods)
	}
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// events is the notes of the events with this reason that the scheduler
// emitted about the pod (regarding it, or related to it, as a Preempted
// event of a victim is to its preemptor). It reads the scheduler's own
// calls (eventLog), not the API server's copies, which the broadcaster
// writes from a goroutine per event, in no order: once the pod is bound,
// every event of its earlier attempts is in the log, so an empty answer
// then means there was none.
func (ts *testScheduler) events(pod, reason string) []string {
	ts.log.mu.Lock()
	defer ts.log.mu.Unlock()
	var out []string
	for _, e := range ts.log.events {
		if e.reason == reason && (e.regarding == pod || e.related == pod) {
			out = append(out, e.note)
		}
	}
	return out
}

// eventLog is every event the scheduler's profile emitted, recorded in
// the emitting call itself (loggedRecorder): kube-scheduler emits a failed
// attempt's FailedScheduling before the pod's next attempt starts.
type eventLog struct {
	mu     sync.Mutex
	events []loggedEvent
}

type loggedEvent struct{ regarding, related, reason, note string }

// loggedRecorder is the profile's event recorder, also writing every
// event into the log before handing it on.
type loggedRecorder struct {
	events.EventRecorderLogger
	log *eventLog
}

func (r loggedRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	e := loggedEvent{regarding: objectName(regarding), related: objectName(related), reason: reason, note: fmt.Sprintf(note, args...)}
	r.log.mu.Lock()
	r.log.events = append(r.log.events, e)
	r.log.mu.Unlock()
	r.EventRecorderLogger.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

func (r loggedRecorder) WithLogger(logger klog.Logger) events.EventRecorderLogger {
	return loggedRecorder{EventRecorderLogger: r.EventRecorderLogger.WithLogger(logger), log: r.log}
}

func objectName(obj runtime.Object) string {
	if m, ok := obj.(metav1.Object); ok && m != nil {
		return m.GetName()
	}
	return ""
}

// waitNodes waits until the plugin's informer handlers have given it n
// nodes (the informers' caches being synced does not mean the handlers
// have run).
func (ts *testScheduler) waitNodes(n int) {
	ts.t.Helper()
	testenv.WaitFor(ts.t, fmt.Sprintf("%d nodes in the plugin's state", n), 10*time.Second, func() bool {
		ts.plugin.st.mu.RLock()
		defer ts.plugin.st.mu.RUnlock()
		return len(ts.plugin.st.cluster.Nodes()) == n
	})
}

// waitCachedPods waits until kube-scheduler's cache holds n pods, so
// that its filters see them.
func (ts *testScheduler) waitCachedPods(n int) {
	ts.t.Helper()
	testenv.WaitFor(ts.t, fmt.Sprintf("%d pods in kube-scheduler's cache", n), 10*time.Second, func() bool {
		c, err := ts.sched.Cache.PodCount()
		return err == nil && c == n
	})
}
