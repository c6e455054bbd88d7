package status

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// bound is a one-GPU pod of the scheduler bound to node with rec as its
// record (nil: pending, no record).
func bound(ns, name, node string, rec *api.PodAllocation) *corev1.Pod {
	p := fixtures.MakePod().Namespace(ns).Name(name).SchedulerName(api.SchedulerName).Node(node).
		Container("c", map[string]string{api.DefaultResourceNames.GPU: "1"})
	if rec != nil {
		p.Record(rec).Phase(corev1.PodRunning)
	}
	return p.Obj()
}

func TestCollectAndPrint(t *testing.T) {
	inv := fixtures.Inventory("n1", 2, "A100-SXM4-40GB", 40960, 4)
	node := fixtures.Node("n1", inv, api.DefaultResourceNames)
	node.Labels[modes.Label] = "fractional"
	g0, g1 := inv.GPUs[0].UUID, inv.GPUs[1].UUID
	shared := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g0, MemoryMiB: 10000, Cores: 30}}}}}
	other := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g0, MemoryMiB: 20000, Cores: 50}}}}}
	whole := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g1, MemoryMiB: 40960, Cores: 100, Exclusive: true}}}}}
	pending := bound("default", "waiting", "", nil)
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes: 1 no GPU with 50000 MiB free"}}
	done := bound("default", "done", "n1", shared)
	done.Status.Phase = corev1.PodSucceeded // released: not counted
	client := fake.NewClientset(node, bound("default", "a", "n1", shared), bound("team", "b", "n1", other), bound("default", "w", "n1", whole), pending, done)

	r, err := Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if r.Invariant != nil {
		t.Fatalf("invariant: %v", r.Invariant)
	}
	if len(r.Nodes) != 1 || len(r.Nodes[0].GPUs) != 2 || r.Nodes[0].Mode != "fractional" {
		t.Fatalf("report %+v: want node n1 of mode fractional with 2 GPUs", r)
	}
	got0 := r.Nodes[0].GPUs[0]
	if got0.UsedMiB != 30000 || got0.Cores != 80 || got0.Shares != 2 || strings.Join(got0.Pods, ",") != "default/a,team/b" {
		t.Errorf("GPU 0: %+v", got0)
	}
	if got1 := r.Nodes[0].GPUs[1]; !got1.Exclusive || got1.UsedMiB != 40960 {
		t.Errorf("GPU 1: %+v", got1)
	}
	if len(r.Pending) != 1 || r.Pending[0].Name != "default/waiting" || !strings.Contains(r.Pending[0].Reason, "50000 MiB") {
		t.Errorf("pending: %+v", r.Pending)
	}
	k := r.Packing()
	if k.GPUs != 2 || k.InUse != 2 || k.Exclusive != 1 || k.PartlyUsed != 1 || k.Pods != 3 {
		t.Errorf("packing %+v", k)
	}
	var out bytes.Buffer
	if err := r.Print(&out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"fractional", "30000/40960", "80%", "2/4", "whole", "a,team/b", "3 pods on 2 of 2 GPUs (1 whole, 1 shared and partly free)", "default/waiting: 0/1 nodes", "invariant checker: no GPU over"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}

	// Two records over-committing GPU 0 are reported, not hidden.
	big := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g0, MemoryMiB: 30000, Cores: 10}}}}}
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), bound("default", "big", "n1", big), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err = Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if r.Invariant == nil {
		t.Fatal("60000 MiB granted on a 40960 MiB GPU, and the checker found nothing")
	}
	out.Reset()
	_ = r.Print(&out)
	if !strings.Contains(out.String(), "INVARIANT BROKEN") {
		t.Errorf("output hides the broken invariant:\n%s", out.String())
	}

	// A node whose inventory does not decode has no GPUs in the report, as
	// for the scheduler, and the report says why; the rest is reported.
	bad := fixtures.Node("n2", fixtures.Inventory("n2", 1, "A100-SXM4-40GB", 40960, 4), api.DefaultResourceNames)
	bad.Annotations[api.AnnotationInventory] = `{"apiVersion":"tessera.io/v9"}`
	if _, err := client.CoreV1().Nodes().Create(context.Background(), bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err = Collect(context.Background(), client)
	if err != nil {
		t.Fatalf("one unreadable inventory failed the whole report: %v", err)
	}
	if r.Inventory == nil || !strings.Contains(r.Inventory.Error(), "node n2") || len(r.Nodes) != 1 {
		t.Errorf("unreadable inventory: %v; nodes %+v", r.Inventory, r.Nodes)
	}
	out.Reset()
	_ = r.Print(&out)
	if !strings.Contains(out.String(), "UNREADABLE INVENTORY") || !strings.Contains(out.String(), "60000/40960") {
		t.Errorf("output:\n%s", out.String())
	}
}
