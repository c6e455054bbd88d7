package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestRecordsSignedForTheirPod: every record names its pod and carries a
// signature by the key the scheduler created in its Secret and published
// in the ConfigMap node agents read.
func TestRecordsSignedForTheirPod(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	if node, msg := ts.schedule(fixtures.MakePod().Name("p1").Container("main", map[string]string{names.Memory: "1000"}).Obj()); node != "a" {
		t.Fatal(msg)
	}
	pod, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Get(ts.ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := kubeobj.Record(pod)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := ts.client.CoreV1().ConfigMaps(recordsig.DefaultNamespace).Get(ts.ctx, recordsig.DefaultPublicKeys, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ring, err := recordsig.ParsePublicData(cm.Data)
	if err != nil {
		t.Fatal(err)
	}
	if rec.PodUID != string(pod.UID) || rec.APIVersion != api.AllocationAPIVersionV2 {
		t.Errorf("record %+v does not name pod %s", rec, pod.UID)
	}
	if err := ring.Verify(rec); err != nil {
		t.Errorf("the published keys do not verify the record: %v", err)
	}
}

// TestRebuildChargesOnlyWhatItCanVouchFor plays findings 2 and 4 of the
// trust issue against a restarted scheduler: a CPU-only pod bound with a
// record claiming the whole GPU (the squatter), a record changed after it
// was signed, and a GPU pod whose record was removed. None is charged,
// each gets a Warning event, and the GPU is free for a real pod. Before
// the fix the squatter's record was charged and the real pod refused.
func TestRebuildChargesOnlyWhatItCanVouchFor(t *testing.T) {
	first := newTestScheduler(t, nil, a100Node("a", 1))
	if node, msg := first.schedule(fixtures.MakePod().Name("real").Container("main", map[string]string{names.Memory: "4000"}).Obj()); node != "a" {
		t.Fatal(msg)
	}
	real, _ := first.client.CoreV1().Pods(metav1.NamespaceDefault).Get(first.ctx, "real", metav1.GetOptions{})
	secret, err := first.client.CoreV1().Secrets(recordsig.DefaultNamespace).Get(first.ctx, recordsig.DefaultSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := kubeobj.Record(real)

	whole := fixtures.GPUUUID("a", 0)
	squatter := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("squatter").UID("uid-squatter").
		SchedulerName(api.SchedulerName).Node("a").Container("c", map[string]string{"cpu": "1"}).
		Record(&api.PodAllocation{Node: "a", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: whole, MemoryMiB: 40960, Cores: 100, Exclusive: true}}}}}).Obj()
	// The real pod's signed record with its memory raised: it no longer
	// verifies.
	tampered := real.DeepCopy()
	raised := *rec
	raised.Containers = []api.ContainerAllocation{{Name: "main", Devices: []api.DeviceGrant{{UUID: whole, MemoryMiB: 40960, Cores: 0}}}}
	b, _ := api.EncodeAllocation(&raised)
	tampered.Annotations[api.AnnotationAllocation] = string(b)
	// A GPU pod whose record was removed.
	stripped := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("stripped").UID("uid-stripped").
		SchedulerName(api.SchedulerName).Node("a").Container("main", map[string]string{names.Memory: "30000"}).Obj()

	ts := newTestScheduler(t, nil, []runtime.Object{a100Node("a", 1), secret, squatter, tampered, stripped}...)
	if node, msg := ts.schedule(fixtures.MakePod().Name("next").Container("main", map[string]string{names.Memory: "40000"}).Obj()); node != "a" {
		t.Fatalf("the GPU is held by records the scheduler cannot vouch for: %s", msg)
	}
	want := map[string]string{
		"squatter": ReasonRecordIgnored + ": GPU allocation record not charged: the record does not match the pod's request: the record grants GPUs to container \"c\", which asks for none",
		"real":     ReasonRecordIgnored + ": GPU allocation record not charged: signature by key",
		"stripped": ReasonRecordMissing + ": bound to node a without a tessera.io/allocation annotation",
	}
	testenv.WaitFor(t, "the Warning events", 30*time.Second, func() bool {
		evs, err := ts.client.EventsV1().Events(metav1.NamespaceDefault).List(ts.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		found := 0
		for _, e := range evs.Items {
			if w, ok := want[e.Regarding.Name]; ok && e.Type == corev1.EventTypeWarning && strings.HasPrefix(e.Reason+": "+e.Note, w) {
				found++
			}
		}
		return found == len(want)
	})
}

// TestFailedSchedulingHasNoFormatVerbs: kube-scheduler uses a failed pod's
// status message as its event's format string; "gpucores: 150" gave
// "150%!o(MISSING)utside" (finding 8), and a GPU model selector is user
// text in the message too.
func TestFailedSchedulingHasNoFormatVerbs(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	bad := fixtures.MakePod().Namespace("kube-system").Name("bad").Container("main", map[string]string{names.Cores: "150"}).Obj()
	ts.create(bad)
	sel := fixtures.MakePod().Namespace("kube-system").Name("sel").Container("main", map[string]string{names.Memory: "100"}).Obj()
	sel.Annotations = map[string]string{api.AnnotationUseGPUType: "H100%s%d%%"}
	ts.create(sel)
	notes := map[string]string{}
	testenv.WaitFor(t, "the FailedScheduling events", 30*time.Second, func() bool {
		evs, err := ts.client.EventsV1().Events("kube-system").List(ts.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "FailedScheduling" {
				notes[e.Regarding.Name] = e.Note
			}
		}
		return len(notes) == 2
	})
	for name, want := range map[string]string{"bad": "150", "sel": "H100 percents percentd percent percent"} {
		if n := notes[name]; strings.Contains(n, "%!") || !strings.Contains(n, want) {
			t.Errorf("FailedScheduling event of %s: %q, want it to contain %q and no format verb", name, n, want)
		}
	}
}

// TestUnchargedRecordActedOnOnce: a bound pod whose record is not charged
// (here it grants a GPU to a container that asks none) is warned about,
// released and charged for its CPU once per distinct annotation value,
// not again at every update of the pod (status, labels: each informer
// update of the pod reached observePod, re-released the pod, requeued
// every waiting pod and logged and counted the record again).
func TestUnchargedRecordActedOnOnce(t *testing.T) {
	p, _ := newTestPlugin(t, api.ClusterConfig{}, a100Node("a", 1))
	rec := events.NewFakeRecorder(100)
	p.trust.recorder = rec
	registerMetrics()
	counted := func() float64 {
		v, err := testutil.GetCounterMetricValue(recordsIgnored.WithLabelValues(ReasonRecordIgnored))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := counted()
	grant := func(mib int64) *api.PodAllocation {
		return &api.PodAllocation{Node: "a", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: fixtures.GPUUUID("a", 0), MemoryMiB: mib}}}}}
	}
	pod := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("squatter").UID("uid-squatter").
		SchedulerName(api.SchedulerName).Node("a").Container("c", map[string]string{"cpu": "1"}).Record(grant(40960)).Obj()
	releases := 0
	const updates = 20
	for i := range updates {
		pod.ResourceVersion = fmt.Sprint(i + 1)
		if p.st.observePod(klog.Background(), pod) {
			releases++
		}
	}
	if got := len(rec.Events); got != 1 {
		t.Errorf("%d Warning events after %d updates of the pod, want 1", got, updates)
	}
	if releases != 0 {
		t.Errorf("the pod was released (and every waiting pod requeued) at %d of %d updates, want none", releases, updates)
	}
	if got := counted() - before; got != 1 {
		t.Errorf("%s counted %v times after %d updates, want 1", ReasonRecordIgnored, got, updates)
	}
	if got := p.st.cluster.Node("a").CPUUsed; got != 1000 {
		t.Errorf("node a CPU used %d, want the pod's 1000 charged once", got)
	}
	// A new annotation value is looked at again (once).
	pod = pod.DeepCopy()
	b, _ := api.EncodeAllocation(grant(1000))
	pod.Annotations[api.AnnotationAllocation] = string(b)
	for i := range 3 {
		pod.ResourceVersion = fmt.Sprint(100 + i)
		p.st.observePod(klog.Background(), pod)
	}
	if got := counted() - before; got != 2 {
		t.Errorf("%s counted %v times after a second record value, want 2", ReasonRecordIgnored, got)
	}
	// An annotation that does not decode: judged once too (the change
	// to it releases what was charged, once).
	pod = pod.DeepCopy()
	pod.Annotations[api.AnnotationAllocation] = "{not a record"
	releases = 0
	for i := range updates {
		pod.ResourceVersion = fmt.Sprint(200 + i)
		if p.st.observePod(klog.Background(), pod) {
			releases++
		}
	}
	if releases != 1 {
		t.Errorf("a pod with an undecodable record released at %d of %d updates, want 1 (when the value changed)", releases, updates)
	}
	if got := p.st.cluster.Node("a").CPUUsed; got != 1000 {
		t.Errorf("node a CPU used %d, want the pod's 1000 charged once", got)
	}
}
