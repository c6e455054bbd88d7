//go:build integration

package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/clusterview"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const gpu80GB = 81920 // MiB

// draNode creates a node in mode dra with gpus GPUs of 80 GB and the
// ResourceSlice Tessera's driver publishes for them.
func (e *preemptEnv) draNode(name string, gpus int) {
	e.t.Helper()
	inv := fixtures.Inventory(name, gpus, "NVIDIA H100 80GB HBM3", gpu80GB, 10)
	inv.Mode = api.ModeDRA
	e.node(name, inv, nil, nil)
	var gs []dra.GPU
	for _, g := range inv.GPUs {
		gs = append(gs, dra.GPU{GPU: g})
	}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + api.DRADriverName},
		Spec: resourceapi.ResourceSliceSpec{Driver: api.DRADriverName, NodeName: ptr.To(name),
			Pool: resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1}, Devices: dra.Devices(gs, dra.System{})},
	}
	if _, err := e.cp.Client.ResourceV1().ResourceSlices().Create(e.ctx, slice, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// claimPod is a pod of the priority class using claim; bound to node when
// bound, else pinned to it by nodeSelector.
func claimPod(name, class, claim, node string, bound bool, labels map[string]string) *corev1.Pod {
	w := fixtures.MakePod().Name(name).Namespace(gpuNS).PriorityClassName(class).SchedulerName(api.SchedulerName).Container("main", nil).UsesClaim(claim)
	for k, v := range labels {
		w = w.Label(k, v)
	}
	p := w.Obj()
	if bound {
		p.Spec.NodeName = node
	} else {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	}
	return p
}

// holder is a pod that uses a pre-allocated claim.
type holder struct {
	name, class string
	labels      map[string]string
}

// allocated creates the claim asking mem of one GPU, allocated as the
// structured allocator allocates a share (device gpu of node, a share
// ID, the consumed capacity), and the pods, bound to node, that it is
// reserved for: the state after the scheduler placed them, made
// directly so that each case starts from a known layout.
func (e *preemptEnv) allocated(node, claim string, gpu int, mem string, pods ...holder) {
	e.t.Helper()
	c, err := e.cp.Client.ResourceV1().ResourceClaims(gpuNS).Create(e.ctx, fixtures.Claim(gpuNS, claim, mem), metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, h := range pods {
		p, err := e.create(claimPod(h.name, h.class, claim, node, true, h.labels))
		if err != nil {
			e.t.Fatal(err)
		}
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	c.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: api.DRADriverName, Pool: node, Device: dra.DeviceName(gpu), ShareID: ptr.To(types.UID(uuid.NewUUID())),
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: q(mem), api.CapacityCores: q("0"),
				api.CapacityShares: q("1"), api.CapacityNVIDIAMemory: q("0")},
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	if _, err := e.cp.Client.ResourceV1().ResourceClaims(gpuNS).UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// fillClaims puts count pods of class low, each with its own claim of
// 20 Gi, on node, round-robin over its GPUs; it returns each pod's
// device.
func (e *preemptEnv) fillClaims(node, prefix string, count, gpus int, label func(i int) map[string]string) map[string]string {
	e.t.Helper()
	on := map[string]string{}
	for i := range count {
		name := fmt.Sprintf("%s-%d", prefix, i)
		var l map[string]string
		if label != nil {
			l = label(i)
		}
		e.allocated(node, name, i%gpus, "20Gi", holder{name: name, class: "low", labels: l})
		on[name] = dra.DeviceName(i % gpus)
	}
	return on
}

// preemptor creates a claim of mem and a pod of class using it, pinned
// to node.
func (e *preemptEnv) preemptor(name, class, mem, node string) {
	e.t.Helper()
	if err := e.claim(gpuNS, name, fixtures.ClaimSpec(api.DeviceClassGPU, mem)); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.create(claimPod(name, class, name, node, false, nil)); err != nil {
		e.t.Fatal(err)
	}
}

// finishClaims deletes the pods at once (the kubelet's part) and
// deallocates their claims (the resourceclaim controller's part, once no
// pod a claim is reserved for is left), then waits until the scheduler's
// claim tracker shows them free.
func (e *preemptEnv) finishClaims(pods ...string) {
	e.t.Helper()
	e.finish(pods...)
	for _, p := range pods {
		c, err := e.cp.Client.ResourceV1().ResourceClaims(gpuNS).Get(e.ctx, p, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		c.Status.ReservedFor, c.Status.Allocation = nil, nil
		if _, err := e.cp.Client.ResourceV1().ResourceClaims(gpuNS).UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
	testenv.WaitFor(e.t, "the scheduler's claim tracker to see the claims deallocated", 30*time.Second, func() bool {
		h := e.hold.Handle()
		if h == nil {
			return false
		}
		for _, p := range pods {
			c, err := h.SharedDRAManager().ResourceClaims().Get(gpuNS, p)
			if err != nil || c.Status.Allocation != nil {
				return false
			}
		}
		return true
	})
}

// device waits until the claim is allocated and returns its device.
func (e *preemptEnv) device(claim string) string {
	e.t.Helper()
	var dev string
	testenv.WaitFor(e.t, "claim "+claim+" allocated", time.Minute, func() bool {
		c, err := e.cp.Client.ResourceV1().ResourceClaims(gpuNS).Get(e.ctx, claim, metav1.GetOptions{})
		if err != nil || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) == 0 {
			return false
		}
		dev = c.Status.Allocation.Devices.Results[0].Device
		return true
	})
	return dev
}

// checkClaimCapacities fails the test if a claim is reserved for a pod
// bound elsewhere than the node its allocation names, or a device's
// consumed memory exceeds its capacity.
func (e *preemptEnv) checkClaimCapacities() {
	e.t.Helper()
	claims, err := e.cp.Client.ResourceV1().ResourceClaims(gpuNS).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	used := map[string]int64{}
	for _, c := range claims.Items {
		a := c.Status.Allocation
		if a == nil {
			continue
		}
		for _, r := range c.Status.ReservedFor {
			p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(e.ctx, r.Name, metav1.GetOptions{})
			if err == nil && p.UID == r.UID && p.Spec.NodeName != "" && p.Spec.NodeName != a.Devices.Results[0].Pool {
				e.t.Errorf("claim %s on node %s, its pod %s on %s", c.Name, a.Devices.Results[0].Pool, p.Name, p.Spec.NodeName)
			}
		}
		for _, r := range a.Devices.Results {
			m := r.ConsumedCapacity[api.CapacityMemory]
			used[r.Pool+"/"+r.Device] += m.Value()
		}
	}
	for d, u := range used {
		if u > gpu80GB<<20 {
			e.t.Errorf("device %s: %d bytes of memory consumed, capacity %d", d, u, int64(gpu80GB)<<20)
		}
	}
}

// logEvents logs the pod's events when the test has failed.
func (e *preemptEnv) logEvents(pod string) {
	if !e.t.Failed() {
		return
	}
	evs, err := e.cp.Client.CoreV1().Events(gpuNS).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		e.t.Logf("events of %s: %v", pod, err)
		return
	}
	for _, ev := range evs.Items {
		e.t.Logf("event of %s: %s %s: %s", pod, ev.Type, ev.Reason, ev.Message)
	}
}

// victimNotes waits until `kubectl tessera why` shows n victims of pod
// and returns their notes.
func (e *preemptEnv) victimNotes(pod, node string, n int) []string {
	e.t.Helper()
	var w *clusterview.WhyReport
	testenv.WaitFor(e.t, "kubectl tessera why "+pod+" to show the victims", 30*time.Second, func() bool {
		r, err := clusterview.Collect(e.ctx, e.cp.Client)
		if err != nil {
			return false
		}
		if w, err = r.Why(gpuNS, pod); err != nil {
			return false
		}
		return r.Preemptions(e.ctx, e.cp.Client, w) == nil && w.Nominated == node && len(w.Victims) == n
	})
	var out []string
	for _, v := range w.Victims {
		out = append(out, v.Note)
	}
	return out
}

// TestPreemptClaims runs kube-scheduler with the shipped profile against
// a real API server for pods whose ResourceClaims ask Tessera's DRA GPUs
// (80 GB each) for capacity; the low-priority claims are allocated
// beforehand as the structured allocator allocates shares:
//
//   - two: two GPUs, four 20 Gi claims on each; a high-priority 40 Gi
//     claim evicts exactly two pods of one GPU, its FailedScheduling event
//     and the victims' Preempted events name the GPU and what is freed,
//     and once the victims are gone its claim is allocated there;
//   - pdb: the same with a PodDisruptionBudget on the pods the first case
//     evicted: two others of one GPU go;
//   - fewest: a 40 Gi claim where one low-priority 40 Gi claim (the most
//     important by kube-scheduler's order) or two 20 Gi claims would make
//     room: the one goes (kube-scheduler's order alone evicts the two);
//   - shared: a 40 Gi claim shared by a high-priority and a low-priority
//     pod is never freed: the low-priority pod using it stays, the two
//     20 Gi claims beside it go;
//   - never: preemptionPolicy Never evicts nothing;
//   - kept: a low-priority pod created while the victims terminate does
//     not get the room once they are gone (the preemptor, nominated, is
//     held out of the queue then); the preemptor gets it.
//
// After each case no claim is on another node than its pod and no GPU's
// consumed memory exceeds it.
func TestPreemptClaims(t *testing.T) {
	e := newPreemptEnv(t)
	if err := dra.ApplyManifests(e.ctx, e.cp.Client, deploy.DRADeviceClasses); err != nil {
		t.Fatal(err)
	}
	e.draNode("dra-two", 2)
	e.draNode("dra-pdb", 2)
	e.draNode("dra-few", 2)
	e.draNode("dra-shared", 1)
	e.draNode("dra-never", 1)
	e.draNode("dra-kept", 1)
	uuidOf := func(node, dev string) string {
		var i int
		fmt.Sscanf(dev, "gpu-%d", &i)
		return fixtures.GPUUUID(node, i)
	}

	var evicted []string // the first case's victims, by index
	t.Run("two", func(t *testing.T) {
		e := e.in(t)
		low := e.fillClaims("dra-two", "two", 8, 2, nil)
		defer e.logEvents("two-high")
		e.preemptor("two-high", "high", "40Gi", "dra-two")
		victims := e.terminating(low, 2)
		dev := low[victims[0]]
		if low[victims[1]] != dev {
			t.Fatalf("victims %v on devices %s and %s, want one GPU", victims, dev, low[victims[1]])
		}
		gpu := uuidOf("dra-two", dev)
		msg := e.failedScheduling("two-high", "makes room on GPU "+gpu)
		t.Logf("FailedScheduling: %s", msg)
		for _, n := range e.victimNotes("two-high", "dra-two", 2) {
			if !strings.Contains(n, "Tessera: frees "+gpu) || !strings.Contains(n, "holds 20Gi memory of "+gpu) {
				t.Errorf("victim's Preempted note %q does not say it frees 20Gi of %s", n, gpu)
			}
		}
		e.finishClaims(victims...)
		if got := e.device("two-high"); got != dev {
			t.Errorf("two-high's claim on %s, its victims were on %s", got, dev)
		}
		e.checkClaimCapacities()
		for _, v := range victims {
			evicted = append(evicted, strings.TrimPrefix(v, "two-"))
		}
	})
	t.Run("pdb", func(t *testing.T) {
		e := e.in(t)
		if len(evicted) != 2 {
			t.Fatalf("the first case evicted %v, want two victims to protect with a PDB", evicted)
		}
		e.noDisruption("keep-claims", "claim-index", evicted)
		low := e.fillClaims("dra-pdb", "pdb", 8, 2, func(i int) map[string]string { return map[string]string{"claim-index": fmt.Sprint(i)} })
		defer e.logEvents("pdb-high")
		e.preemptor("pdb-high", "high", "40Gi", "dra-pdb")
		victims := e.terminating(low, 2)
		for _, v := range victims {
			if slices.Contains(evicted, strings.TrimPrefix(v, "pdb-")) {
				t.Errorf("victim %s is covered by the budget (victims %v)", v, victims)
			}
		}
		if low[victims[0]] != low[victims[1]] {
			t.Errorf("victims %v on two GPUs", victims)
		}
		e.finishClaims(victims...)
		if got := e.device("pdb-high"); got != low[victims[0]] {
			t.Errorf("pdb-high's claim on %s, its victims were on %s", got, low[victims[0]])
		}
		e.checkClaimCapacities()
	})
	t.Run("fewest", func(t *testing.T) {
		e := e.in(t)
		// gpu-0: 40 Gi of a high-priority pod, few-a's 40 Gi; gpu-1: 40 Gi
		// of a high-priority pod, few-b's and few-c's 20 Gi. few-a sorts
		// first: kube-scheduler gives it back first, and then evicts
		// few-b and few-c.
		e.allocated("dra-few", "few-keep-0", 0, "40Gi", holder{name: "few-keep-0", class: "high"})
		e.allocated("dra-few", "few-keep-1", 1, "40Gi", holder{name: "few-keep-1", class: "high"})
		e.allocated("dra-few", "few-a", 0, "40Gi", holder{name: "few-a", class: "low"})
		e.allocated("dra-few", "few-b", 1, "20Gi", holder{name: "few-b", class: "low"})
		e.allocated("dra-few", "few-c", 1, "20Gi", holder{name: "few-c", class: "low"})
		defer e.logEvents("few-high")
		e.preemptor("few-high", "high", "40Gi", "dra-few")
		low := map[string]string{"few-a": "gpu-0", "few-b": "gpu-1", "few-c": "gpu-1", "few-keep-0": "gpu-0", "few-keep-1": "gpu-1"}
		if victims := e.terminating(low, 1); victims[0] != "few-a" {
			t.Fatalf("victims %v, want few-a alone", victims)
		}
		e.finishClaims("few-a")
		if got := e.device("few-high"); got != "gpu-0" {
			t.Errorf("few-high's claim on %s, want gpu-0", got)
		}
		e.checkClaimCapacities()
	})
	t.Run("shared", func(t *testing.T) {
		e := e.in(t)
		// One GPU: the claim shared (40 Gi) by shared-high (priority
		// 1000) and shared-z (10), shared-a's and shared-b's 20 Gi.
		// shared-z sorts last, so kube-scheduler's order would evict it
		// alone if taking it off freed the claim.
		e.allocated("dra-shared", "shared", 0, "40Gi", holder{name: "shared-high", class: "high"}, holder{name: "shared-z", class: "low"})
		e.allocated("dra-shared", "shared-a", 0, "20Gi", holder{name: "shared-a", class: "low"})
		e.allocated("dra-shared", "shared-b", 0, "20Gi", holder{name: "shared-b", class: "low"})
		defer e.logEvents("shared-new")
		e.preemptor("shared-new", "high", "40Gi", "dra-shared")
		all := map[string]string{"shared-a": "", "shared-b": "", "shared-z": "", "shared-high": ""}
		victims := e.terminating(all, 2)
		if want := []string{"shared-a", "shared-b"}; !slices.Equal(victims, want) {
			t.Fatalf("victims %v, want %v", victims, want)
		}
		e.finishClaims(victims...)
		if got := e.device("shared-new"); got != "gpu-0" {
			t.Errorf("shared-new's claim on %s", got)
		}
		e.noneTerminating(map[string]string{"shared-z": "", "shared-high": ""})
		e.checkClaimCapacities()
	})
	t.Run("never", func(t *testing.T) {
		e := e.in(t)
		low := e.fillClaims("dra-never", "never", 4, 1, nil)
		e.preemptor("never-high", "high-never", "40Gi", "dra-never")
		msg := e.failedScheduling("never-high", "preemptionPolicy=Never")
		t.Logf("FailedScheduling: %s", msg)
		e.noneTerminating(low)
		if p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(e.ctx, "never-high", metav1.GetOptions{}); err != nil || p.Status.NominatedNodeName != "" {
			t.Errorf("never-high nominated to %q (%v)", p.Status.NominatedNodeName, err)
		}
	})
	t.Run("kept", func(t *testing.T) {
		e := e.in(t)
		low := e.fillClaims("dra-kept", "kept", 4, 1, nil)
		defer e.logEvents("kept-high")
		e.preemptor("kept-high", "high", "40Gi", "dra-kept")
		victims := e.terminating(low, 2)
		testenv.WaitFor(t, "kept-high nominated", 30*time.Second, func() bool {
			p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(e.ctx, "kept-high", metav1.GetOptions{})
			return err == nil && p.Status.NominatedNodeName == "dra-kept"
		})
		if err := e.hold.Hold(e.ctx, gpuNS+"/kept-high", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		e.preemptor("kept-low", "low", "40Gi", "dra-kept")
		if node, err := e.hold.WaitAttempt(e.ctx, gpuNS+"/kept-low", 0, 30*time.Second); err != nil || node != "" {
			t.Fatalf("kept-low while the victims terminate: placed on %q (%v)", node, err)
		}
		e.finishClaims(victims...)
		// An attempt that starts once the scheduler has seen the room
		// freed.
		e.keptFrom("kept-low", "kept-high")
		e.hold.Release(gpuNS + "/kept-high")
		if got := e.device("kept-high"); got != "gpu-0" {
			t.Errorf("kept-high's claim on %s", got)
		}
		if c, err := e.cp.Client.ResourceV1().ResourceClaims(gpuNS).Get(e.ctx, "kept-low", metav1.GetOptions{}); err != nil || c.Status.Allocation != nil {
			t.Errorf("kept-low's claim allocated (%v)", err)
		}
		e.checkClaimCapacities()
	})
}
