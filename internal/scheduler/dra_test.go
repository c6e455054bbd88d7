package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func draNode(name string, gpus int) *corev1.Node {
	inv := fixtures.Inventory(name, gpus, "NVIDIA H100 80GB HBM3", 81559, 10)
	inv.Mode = api.ModeDRA
	return fixtures.Node(name, inv, names)
}

// A HAMi-style share never lands on a node in mode dra (whose GPUs the
// placement core does not hold): it goes to a device-plugin node, or
// stays pending with a reason that names DRA.
func TestDRANodeRefusesShares(t *testing.T) {
	share := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}
	ts := newTestScheduler(t, nil, draNode("dra", 8), a100Node("dp", 1))
	if node, msg := ts.schedule(fixtures.MakePod().Name("p1").Container("main", share).Obj()); node != "dp" {
		t.Fatalf("share placed on %q: %s", node, msg)
	}
	only := newTestScheduler(t, nil, draNode("dra", 8))
	node, msg := only.schedule(fixtures.MakePod().Name("p2").Container("main", share).Obj())
	if node != "" {
		t.Fatalf("share placed on the DRA node %s", node)
	}
	for _, want := range []string{"0/1 nodes fit: 1 node serves its GPUs through DRA (mode dra)", `container "main" asks 10000 MiB of GPU memory`, api.DeviceClassExtendedResource} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	if only.held() != 0 || len(only.plugin.st.cluster.Node("dra").GPUs) != 0 {
		t.Errorf("the core holds the DRA node's GPUs")
	}
}

// A whole-GPU pod passes the plugin on a node in mode dra (the mapped
// DeviceClass serves it there): no reservation in the core, no record.
func TestDRANodeWholeGPUPasses(t *testing.T) {
	p, infos := newTestPlugin(t, api.ClusterConfig{}, draNode("dra", 2))
	ctx := context.Background()
	pod := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("p").UID("uid-p").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj()
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, []fwk.NodeInfo{infos["dra"]}); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Filter(ctx, cs, pod, infos["dra"]); !st.IsSuccess() {
		t.Fatalf("Filter: %v", st)
	}
	if st := p.Reserve(ctx, cs, pod, "dra"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	if p.st.cluster.Allocation("default/p") != nil {
		t.Error("the core reserved GPUs of a DRA node")
	}
	if _, st := p.PreBindPreFlight(ctx, cs, pod, "dra"); !st.IsSkip() {
		t.Errorf("PreBindPreFlight: %v, want Skip", st)
	}
	if st := p.PreBind(ctx, cs, pod, "dra"); !st.IsSuccess() {
		t.Errorf("PreBind: %v", st)
	}
	if st := p.Bind(ctx, cs, pod, "dra"); !st.IsSkip() {
		t.Errorf("Bind: %v, want Skip (DefaultBinder, no record)", st)
	}
	// A selector the mapping cannot honour keeps it off.
	sel := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("s").Annotation(api.AnnotationUseGPUType, "H100").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj()
	cs = framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, sel, []fwk.NodeInfo{infos["dra"]}); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Filter(ctx, cs, sel, infos["dra"]); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Errorf("selector pod on the DRA node: %v", st)
	}
}

// A whole-GPU pod prefers the nodes Tessera places on; a DRA node ranks
// last, and the device-plugin nodes keep their spread of scores.
func TestDRANodeRanksLast(t *testing.T) {
	p, _ := newTestPlugin(t, api.ClusterConfig{})
	scores := fwk.NodeScoreList{{Name: "dra", Score: draScore}, {Name: "a", Score: 5}, {Name: "b", Score: 10}}
	if st := p.NormalizeScore(context.Background(), nil, nil, scores); !st.IsSuccess() {
		t.Fatal(st)
	}
	if scores[0].Score != 0 || scores[1].Score != 1 || scores[2].Score != fwk.MaxScore {
		t.Errorf("normalized %+v, want dra 0, a 1, b %d", scores, fwk.MaxScore)
	}
	one := fwk.NodeScoreList{{Name: "dra", Score: draScore}, {Name: "a", Score: -3}}
	_ = p.NormalizeScore(context.Background(), nil, nil, one)
	if one[0].Score != 0 || one[1].Score != fwk.MaxScore {
		t.Errorf("normalized %+v", one)
	}
}

// A whole-GPU pod bound to a DRA node holds its GPU through a claim and
// has no record: the scheduler does not warn that its record is missing
// (it did, every time it saw the pod), while a GPU pod on a device-plugin
// node without its record still gets the warning.
func TestDRAPodHasNoMissingRecordWarning(t *testing.T) {
	onDRA := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("on-dra").UID("uid-on-dra").
		SchedulerName(api.SchedulerName).Node("dra").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj()
	// What DynamicResources writes for the DeviceClass that maps
	// nvidia.com/gpu.
	onDRA.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{
		ResourceClaimName: "on-dra-extended-resources",
		RequestMappings:   []corev1.ContainerExtendedResourceRequest{{ContainerName: "main", ResourceName: "nvidia.com/gpu", RequestName: "container-0-request-0"}},
	}
	stripped := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("stripped").UID("uid-stripped").
		SchedulerName(api.SchedulerName).Node("a").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj()
	ts := newTestScheduler(t, nil, draNode("dra", 2), a100Node("a", 1), onDRA, stripped)
	warned := func(name string) bool {
		evs, err := ts.client.EventsV1().Events(metav1.NamespaceDefault).List(ts.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == name && e.Reason == ReasonRecordMissing {
				return true
			}
		}
		return false
	}
	testenv.WaitFor(t, "the warning for the stripped pod", 30*time.Second, func() bool { return warned("stripped") })
	if warned("on-dra") {
		t.Error("a pod on a DRA node was warned that its record is missing")
	}

	// The same status on a pod bound to a node whose inventory says it
	// serves its GPUs through the device plugin (created once the scheduler
	// knows the node): no claim serves GPUs there, so the status does not
	// excuse the missing record.
	spoofed := fixtures.MakePod().Namespace(metav1.NamespaceDefault).Name("spoofed").UID("uid-spoofed").
		SchedulerName(api.SchedulerName).Node("a").Container("main", map[string]string{"nvidia.com/gpu": "1"}).Obj()
	spoofed.Status.ExtendedResourceClaimStatus = onDRA.Status.ExtendedResourceClaimStatus.DeepCopy()
	if _, err := ts.client.CoreV1().Pods(metav1.NamespaceDefault).Create(ts.ctx, spoofed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the warning for the pod on a device-plugin node that names an extended-resource claim", 30*time.Second, func() bool { return warned("spoofed") })
}
