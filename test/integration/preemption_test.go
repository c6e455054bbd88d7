//go:build integration

package integration

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/clusterview"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/testenv/schedhold"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// preemptEnv is a control plane with the shipped scheduler profile plus
// the test plugin schedhold (which holds chosen pods out of the queue and
// records each attempt's outcome), priority classes low (10), high (1000)
// and high-never (1000, preemptionPolicy Never). No kubelet runs: a
// preempted pod stays terminating (deletionTimestamp) until the test, in
// the kubelet's place, finishes it.
type preemptEnv struct {
	*env
	hold *schedhold.Hold
	ctx  context.Context
}

// in is the env whose helpers report to t (a subtest's).
func (e *preemptEnv) in(t *testing.T) *preemptEnv {
	c := *e.env
	c.t = t
	return &preemptEnv{env: &c, hold: e.hold, ctx: e.ctx}
}

func newPreemptEnv(t *testing.T) *preemptEnv {
	e := &preemptEnv{env: newEnv(t), ctx: context.Background()}
	never := corev1.PreemptNever
	for _, pc := range []*schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "low"}, Value: 10},
		{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000},
		{ObjectMeta: metav1.ObjectMeta{Name: "high-never"}, Value: 1000, PreemptionPolicy: &never},
	} {
		if _, err := e.cp.Client.SchedulingV1().PriorityClasses().Create(e.ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	hold, reg := schedhold.New()
	e.hold = hold
	cfg := e.schedulerConfig("preempt.yaml", func(cfg map[string]any) {
		plugins := cfg["profiles"].([]any)[0].(map[string]any)["plugins"].(map[string]any)
		entry := map[string]any{"name": schedhold.Name}
		set := func(point string, first bool) {
			p, _ := plugins[point].(map[string]any)
			if p == nil {
				p = map[string]any{}
				plugins[point] = p
			}
			enabled, _ := p["enabled"].([]any)
			if first {
				p["enabled"] = append([]any{entry}, enabled...)
			} else {
				p["enabled"] = append(enabled, entry)
			}
		}
		set("preEnqueue", false)
		set("preFilter", true)
		set("postFilter", true)
		set("reserve", false)
	})
	e.startSchedulerWith(cfg, app.WithPlugin(schedhold.Name, reg[schedhold.Name]))
	return e
}

// node creates a node of the inventory with labels; extra are more
// allocatable resources (a MIG node's profiles).
func (e *preemptEnv) node(name string, inv *api.NodeInventory, labels map[string]string, extra map[string]int64) {
	e.t.Helper()
	n := fixtures.Node(name, inv, names)
	for k, v := range labels {
		n.Labels[k] = v
	}
	for k, v := range extra {
		q := *resource.NewQuantity(v, resource.DecimalSI)
		n.Status.Capacity[corev1.ResourceName(k)] = q
		n.Status.Allocatable[corev1.ResourceName(k)] = q
	}
	if _, err := e.cp.Client.CoreV1().Nodes().Create(e.ctx, n, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// run creates the pod (pinned by nodeSelector key=value) and returns it.
func (e *preemptEnv) run(w *fixtures.PodWrapper, key, value string) *corev1.Pod {
	e.t.Helper()
	p := w.Obj()
	p.Spec.NodeSelector = map[string]string{key: value}
	created, err := e.create(p)
	if err != nil {
		e.t.Fatal(err)
	}
	return created
}

// fill binds count pods of class low asking res, named prefix-0…, to the
// node; it returns the GPU (and MIG device or instance) each holds.
func (e *preemptEnv) fill(node, prefix string, count int, res map[string]string, label func(i int) map[string]string) map[string]string {
	e.t.Helper()
	on := map[string]string{}
	for i := range count {
		name := fmt.Sprintf("%s-%d", prefix, i)
		w := fixtures.MakePod().Name(name).PriorityClassName("low").Container("main", res)
		if label != nil {
			for k, v := range label(i) {
				w = w.Label(k, v)
			}
		}
		e.run(w, "kubernetes.io/hostname", node)
		_, rec := e.waitBound(name)
		on[name] = grantOf(rec)
	}
	return on
}

// grantOf names what a one-container record holds: the GPU, and the MIG
// instance when it holds one.
func grantOf(rec *api.PodAllocation) string {
	d := rec.Containers[0].Devices[0]
	if d.MIG != nil {
		return fmt.Sprintf("%s %s@%d", d.UUID, d.MIG.Profile, d.MIG.Start)
	}
	return d.UUID
}

// terminating waits until n pods of names are being deleted and returns
// them, sorted; more than n fails the test.
func (e *preemptEnv) terminating(names map[string]string, n int) []string {
	e.t.Helper()
	var out []string
	testenv.WaitFor(e.t, fmt.Sprintf("%d pods preempted", n), time.Minute, func() bool {
		out = out[:0]
		for name := range names {
			p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(e.ctx, name, metav1.GetOptions{})
			if err == nil && p.DeletionTimestamp != nil {
				out = append(out, name)
			}
		}
		return len(out) >= n
	})
	sort.Strings(out)
	if len(out) != n {
		e.t.Fatalf("%d pods preempted (%v), want %d", len(out), out, n)
	}
	return out
}

// finish deletes the pods at once: the kubelet's part of a graceful
// deletion, once their containers have stopped.
func (e *preemptEnv) finish(pods ...string) {
	e.t.Helper()
	for _, p := range pods {
		err := e.cp.Client.CoreV1().Pods(gpuNS).Delete(e.ctx, p, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatal(err)
		}
	}
}

// noneTerminating fails the test if a pod of names is being deleted.
func (e *preemptEnv) noneTerminating(names map[string]string) {
	e.t.Helper()
	for name := range names {
		p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			e.t.Errorf("pod %s evicted (%v)", name, err)
		}
	}
}

// failedScheduling waits for a FailedScheduling event of the pod whose
// message contains want.
func (e *preemptEnv) failedScheduling(name, want string) string {
	e.t.Helper()
	var msg string
	testenv.WaitFor(e.t, "a FailedScheduling event of "+name+" saying "+want, 30*time.Second, func() bool {
		evs, err := e.cp.Client.CoreV1().Events(gpuNS).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=FailedScheduling"})
		if err != nil {
			return false
		}
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, want) {
				msg = ev.Message
				return true
			}
		}
		return false
	})
	return msg
}

// noDisruption creates a PodDisruptionBudget that allows no disruption
// of the pods whose label key has one of the values (no controller
// updates its status here, so DisruptionsAllowed stays 0).
func (e *preemptEnv) noDisruption(name, key string, values []string) {
	e.t.Helper()
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: gpuNS, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(0)), Selector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: metav1.LabelSelectorOpIn, Values: values}}}},
	}
	if _, err := e.cp.Client.PolicyV1().PodDisruptionBudgets(gpuNS).Create(e.ctx, pdb, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// keptFrom starts a new attempt of the pod low and fails the test if
// it is placed: the room is the nominated pod high's.
func (e *preemptEnv) keptFrom(low, high string) {
	e.t.Helper()
	tried := e.hold.Started(gpuNS + "/" + low)
	if err := e.hold.Kick(gpuNS + "/" + low); err != nil {
		e.t.Fatal(err)
	}
	node, err := e.hold.WaitAttempt(e.ctx, gpuNS+"/"+low, tried, time.Minute)
	if err != nil {
		e.t.Fatal(err)
	}
	if node != "" {
		e.t.Fatalf("%s (lower priority) took the room freed for %s on %s", low, high, node)
	}
}

// allocatedShares is the in-process scheduler's gauge
// tessera_scheduler_gpu_allocated_shares summed over the node's GPUs.
func allocatedShares(t *testing.T, node string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "tessera_scheduler_gpu_allocated_shares" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" && l.GetValue() == node {
					sum += m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

var (
	quarterGPU = map[string]string{names.GPU: "0.25"}
	halfGPU    = map[string]string{names.GPU: "0.5"}
)

// TestPreemption runs kube-scheduler with the shipped profile against a
// real API server (admission: the webhook, PriorityClasses, PDBs):
//
//   - shares: a node of two GPUs full of low-priority 0.25 shares; a
//     high-priority 0.5 pod evicts exactly two shares of one GPU, its
//     FailedScheduling event names the GPU, the victims' Preempted events
//     say what they free, `kubectl tessera why` shows the nomination and
//     the victims, and once they are gone the pod runs on that GPU;
//   - pdb: the same with a PodDisruptionBudget (no disruption allowed) on
//     the two pods the first case evicted: two others of one GPU go;
//   - never: a high-priority pod with preemptionPolicy Never evicts
//     nothing;
//   - fits-elsewhere: a high-priority pod that fits another node as it is
//     is placed there at its first attempt and evicts nothing;
//   - kept: a low-priority pod created while the victims terminate does
//     not get the room once they are gone, although the preemptor is held
//     out of the queue then (schedhold); the preemptor gets it;
//   - mig-static: a mig-1g.5gb pod evicts the holder of one 1g.5gb device
//     of a full static layout and gets that device;
//   - mig-dynamic: on a dynamic-MIG GPU full of 1g.5gb instances, a
//     mig-3g.20gb pod evicts the three instances of slices 4-6 and gets
//     3g.20gb@4.
//
// At the end the invariant checker runs over every record.
func TestPreemption(t *testing.T) {
	e := newPreemptEnv(t)
	host := "kubernetes.io/hostname"
	for _, n := range []string{"share", "pdb"} {
		e.node(n, fixtures.Inventory(n, 2, "NVIDIA A100-SXM4-40GB", 40960, 10), nil, nil)
	}
	e.node("never", fixtures.Inventory("never", 1, "NVIDIA A100-SXM4-40GB", 40960, 10), nil, nil)
	e.node("full", fixtures.Inventory("full", 1, "NVIDIA A100-SXM4-40GB", 40960, 10), map[string]string{"group": "fit"}, nil)
	e.node("free", fixtures.Inventory("free", 1, "NVIDIA A100-SXM4-40GB", 40960, 10), map[string]string{"group": "fit"}, nil)
	e.node("kept", fixtures.Inventory("kept", 1, "NVIDIA A100-SXM4-40GB", 40960, 10), nil, nil)
	e.node("mig-static", fixtures.MIGInventory("mig-static", 1, api.SharingMIG, api.MIGStrategyMixed,
		"1g.5gb@0", "1g.5gb@1", "1g.5gb@2", "1g.5gb@3", "1g.5gb@4", "1g.5gb@5", "1g.5gb@6"), nil, map[string]int64{names.MIG("1g.5gb"): 7})
	e.node("mig-dynamic", fixtures.MIGInventory("mig-dynamic", 1, api.SharingMIGDynamic, api.MIGStrategyMixed), nil,
		map[string]int64{names.MIG("1g.5gb"): 7, names.MIG("3g.20gb"): 2})

	var evicted []string // the share case's victims, by index
	t.Run("shares", func(t *testing.T) {
		e := e.in(t)
		low := e.fill("share", "share", 8, quarterGPU, nil)
		e.run(fixtures.MakePod().Name("share-high").PriorityClassName("high").Container("main", halfGPU), host, "share")
		victims := e.terminating(low, 2)
		gpu := low[victims[0]]
		if low[victims[1]] != gpu {
			t.Fatalf("victims %v on GPUs %s and %s, want one GPU", victims, gpu, low[victims[1]])
		}
		msg := e.failedScheduling("share-high", "makes room on GPU "+gpu)
		t.Logf("FailedScheduling: %s", msg)
		var w *clusterview.WhyReport
		testenv.WaitFor(t, "kubectl tessera why share-high to show the victims", 30*time.Second, func() bool {
			r, err := clusterview.Collect(e.ctx, e.cp.Client)
			if err != nil {
				return false
			}
			if w, err = r.Why(gpuNS, "share-high"); err != nil {
				return false
			}
			return r.Preemptions(e.ctx, e.cp.Client, w) == nil && w.Nominated == "share" && len(w.Victims) == 2
		})
		for _, v := range w.Victims {
			if v.State != "terminating" || !strings.Contains(v.Note, "Tessera: frees "+gpu+" for gpu/share-high") {
				t.Errorf("why: victim %+v", v)
			}
		}
		var out strings.Builder
		if err := w.Print(&out); err != nil || !strings.Contains(out.String(), "Nominated node: share") {
			t.Errorf("why prints %q (%v)", out.String(), err)
		}
		t.Logf("kubectl tessera why:\n%s", out.String())
		e.finish(victims...)
		_, rec := e.waitBound("share-high")
		if grantOf(rec) != gpu {
			t.Errorf("share-high on %s, its victims were on %s", grantOf(rec), gpu)
		}
		for _, v := range victims {
			evicted = append(evicted, strings.TrimPrefix(v, "share-"))
		}
	})

	t.Run("pdb", func(t *testing.T) {
		e := e.in(t)
		if len(evicted) != 2 {
			// The shares case failed (and said why): this case has no
			// victims to protect, which is a failure, not a skip.
			t.Fatalf("the shares case evicted %v, want two victims to protect with a PDB", evicted)
		}
		// The budget covers the pods of the shares case's victims'
		// indices (the same pods, labelled by index): it allows no
		// disruption (no controller updates its status here, so
		// DisruptionsAllowed stays 0). Made before the pods, so the
		// scheduler's informer has it by the time they are bound.
		e.noDisruption("keep", "index", evicted)
		low := e.fill("pdb", "pdb", 8, quarterGPU, func(i int) map[string]string { return map[string]string{"index": fmt.Sprint(i)} })
		e.run(fixtures.MakePod().Name("pdb-high").PriorityClassName("high").Container("main", halfGPU), host, "pdb")
		victims := e.terminating(low, 2)
		for _, v := range victims {
			if slices.Contains(evicted, strings.TrimPrefix(v, "pdb-")) {
				t.Errorf("victim %s is covered by the budget (victims %v)", v, victims)
			}
		}
		if low[victims[0]] != low[victims[1]] {
			t.Errorf("victims %v on two GPUs", victims)
		}
		e.finish(victims...)
		if _, rec := e.waitBound("pdb-high"); grantOf(rec) != low[victims[0]] {
			t.Errorf("pdb-high on %s, its victims were on %s", grantOf(rec), low[victims[0]])
		}
	})

	t.Run("never", func(t *testing.T) {
		e := e.in(t)
		low := e.fill("never", "never", 4, quarterGPU, nil)
		e.run(fixtures.MakePod().Name("never-high").PriorityClassName("high-never").Container("main", halfGPU), host, "never")
		e.failedScheduling("never-high", "preemptionPolicy=Never")
		e.noneTerminating(low)
	})

	t.Run("fits-elsewhere", func(t *testing.T) {
		e := e.in(t)
		low := e.fill("full", "full", 4, quarterGPU, nil)
		e.run(fixtures.MakePod().Name("fit-high").PriorityClassName("high").Container("main", halfGPU), "group", "fit")
		p, _ := e.waitBound("fit-high")
		if p.Spec.NodeName != "free" || e.hold.Failed(gpuNS+"/fit-high") != 0 {
			t.Errorf("fit-high on %s after %d failed attempts, want free at its first", p.Spec.NodeName, e.hold.Failed(gpuNS+"/fit-high"))
		}
		e.noneTerminating(low)
	})

	t.Run("kept", func(t *testing.T) {
		e := e.in(t)
		low := e.fill("kept", "kept", 4, quarterGPU, nil)
		e.run(fixtures.MakePod().Name("kept-high").PriorityClassName("high").Container("main", halfGPU), host, "kept")
		victims := e.terminating(low, 2)
		testenv.WaitFor(t, "kept-high nominated", 30*time.Second, func() bool {
			p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(e.ctx, "kept-high", metav1.GetOptions{})
			return err == nil && p.Status.NominatedNodeName == "kept"
		})
		if err := e.hold.Hold(e.ctx, gpuNS+"/kept-high", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		e.run(fixtures.MakePod().Name("kept-low").PriorityClassName("low").Container("main", halfGPU), host, "kept")
		if node, err := e.hold.WaitAttempt(e.ctx, gpuNS+"/kept-low", 0, 30*time.Second); err != nil || node != "" {
			t.Fatalf("kept-low while the victims terminate: placed on %q (%v)", node, err)
		}
		e.finish(victims...)
		// Once the scheduler's state has released the victims (its
		// per-GPU gauge: two shares left of four), kept-low is tried again
		// (an attempt that starts after the release).
		testenv.WaitFor(t, "the victims released in the scheduler's state", time.Minute, func() bool {
			return allocatedShares(t, "kept") == 2 || e.hold.Placed(gpuNS+"/kept-low") != ""
		})
		if node := e.hold.Placed(gpuNS + "/kept-low"); node != "" {
			t.Fatalf("kept-low (priority 10) took the room freed for kept-high (priority 1000) on %s", node)
		}
		e.keptFrom("kept-low", "kept-high")
		e.hold.Release(gpuNS + "/kept-high")
		if p, _ := e.waitBound("kept-high"); p.Spec.NodeName != "kept" {
			t.Errorf("kept-high on %s", p.Spec.NodeName)
		}
		if p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(e.ctx, "kept-low", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
			t.Errorf("kept-low bound to %q (%v)", p.Spec.NodeName, err)
		}
	})

	t.Run("mig-static", func(t *testing.T) {
		e := e.in(t)
		one := map[string]string{names.MIG("1g.5gb"): "1"}
		low := e.fill("mig-static", "mig-static", 7, one, nil)
		e.run(fixtures.MakePod().Name("mig-static-high").PriorityClassName("high").Container("main", one), host, "mig-static")
		victims := e.terminating(low, 1)
		e.finish(victims...)
		if _, rec := e.waitBound("mig-static-high"); grantOf(rec) != low[victims[0]] || rec.Containers[0].Devices[0].MIG.Device == "" {
			t.Errorf("mig-static-high holds %s (%+v), its victim held %s", grantOf(rec), rec.Containers[0].Devices[0].MIG, low[victims[0]])
		}
	})

	t.Run("mig-dynamic", func(t *testing.T) {
		e := e.in(t)
		low := e.fill("mig-dynamic", "mig-dynamic", 7, map[string]string{names.MIG("1g.5gb"): "1"}, nil)
		big := map[string]string{names.MIG("3g.20gb"): "1"}
		e.run(fixtures.MakePod().Name("mig-dynamic-high").PriorityClassName("high").Container("main", big), host, "mig-dynamic")
		victims := e.terminating(low, 3)
		for _, v := range victims {
			if s := low[v]; !strings.HasSuffix(s, "@4") && !strings.HasSuffix(s, "@5") && !strings.HasSuffix(s, "@6") {
				t.Errorf("victim %s held %s, want the instances at slices 4, 5, 6", v, s)
			}
		}
		e.finish(victims...)
		if _, rec := e.waitBound("mig-dynamic-high"); !strings.HasSuffix(grantOf(rec), "3g.20gb@4") {
			t.Errorf("mig-dynamic-high holds %s, want 3g.20gb@4", grantOf(rec))
		}
	})

	e.checkInvariant()
}
