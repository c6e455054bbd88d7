package nodeagent

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/nodeagent/parts"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestDynamicMIGPreemptorFirstAllocate: the race of a preemption on a
// dynamic-MIG node. Three pods hold 1g.5gb instances at slices 4, 5 and 6;
// the scheduler preempts them for a 3g.20gb pod and binds it at slice 4
// once they are gone from its view. The agent's periodic collection has
// not destroyed their instances yet when the kubelet asks for the
// preemptor's: its first Allocate must get 3g.20gb@4 (the victims are
// terminating, their processes exited), not fail on the overlap.
func TestDynamicMIGPreemptorFirstAllocate(t *testing.T) {
	n, err := nvmltest.NewModel("A100-40GB", 1, "mig-preempt")
	if err != nil {
		t.Fatal(err)
	}
	gpu := n.Device(0).UUID
	grant := func(profile string, start int, mem int64) []api.DeviceGrant {
		return []api.DeviceGrant{{UUID: gpu, MemoryMiB: mem, MIG: &api.MIGGrant{Profile: profile, Start: start}}}
	}
	podWith := func(name string, g []api.DeviceGrant) *v1.Pod {
		rec := &api.PodAllocation{APIVersion: api.AllocationAPIVersion, Kind: api.AllocationKind, Node: "n1",
			Containers: []api.ContainerAllocation{{Name: "c", Devices: g}}}
		return fixtures.MakePod().Namespace("default").Name(name).UID("uid-"+name).Node("n1").Record(rec).
			Container("c", map[string]string{"nvidia.com/gpu": "1"}).Obj()
	}
	var victims []*v1.Pod
	for s := 4; s <= 6; s++ {
		victims = append(victims, podWith(fmt.Sprintf("small-%d", s), grant("1g.5gb", s, 4864)))
	}
	client := fake.NewClientset(victims[0], victims[1], victims[2])
	a, err := New(n, client, Options{NodeName: "n1", Resource: "nvidia.com/gpu"}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Node{NodeConfig: api.NodeConfig{Sharing: api.SharingMIGDynamic}}
	cfg.Defaults()
	mig, _ := part[*parts.MIG](a)
	mig.PrepareDevices(cfg) // MIG mode on
	factory := informers.NewSharedInformerFactory(client, 0)
	pods := factory.Core().V1().Pods().Lister()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := mig.Start(ctx, parts.Cluster{Pods: pods, Poke: func() {}}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	for i, v := range victims {
		if _, err := mig.Prepare(ctx, v, "c", grant("1g.5gb", 4+i, 4864)); err != nil {
			t.Fatal(err)
		}
	}
	// Preempted: the API server marks them deleted; their processes have
	// exited (no process runs on the emulated MIG devices).
	now := metav1.Now()
	for _, v := range victims {
		term := v.DeepCopy()
		term.DeletionTimestamp = &now
		if _, err := client.CoreV1().Pods("default").Update(ctx, term, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the agent's cache to show the victims terminating", func() bool {
		for _, v := range victims {
			p, err := pods.Pods("default").Get(v.Name)
			if err != nil || p.DeletionTimestamp == nil {
				return false
			}
		}
		return true
	})
	if got := n.MIGInstances(0); len(got) != 3 {
		t.Fatalf("instances before the preemptor's Allocate: %v", got)
	}
	devs, err := mig.Prepare(ctx, podWith("big", grant("3g.20gb", 4, 19968)), "c", grant("3g.20gb", 4, 19968))
	if err != nil {
		t.Fatalf("the preemptor's first Allocate: %v", err)
	}
	if got := n.MIGInstances(0); len(got) != 1 || got[0] != "3g.20gb@4" || len(devs) != 1 {
		t.Errorf("instances %v, devices %v: want 3g.20gb@4 alone", got, devs)
	}
}
