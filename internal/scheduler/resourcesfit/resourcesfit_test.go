package resourcesfit

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// fitHandle is the little of a framework handle NodeResourcesFit uses.
type fitHandle struct{ fwk.Handle }

func (fitHandle) SharedDRAManager() fwk.SharedDRAManager { return nil }

const pseudoArgs = `{"ignoredResources":["nvidia.com/gpumem","nvidia.com/gpumem-percentage","nvidia.com/gpucores"],"ignoredResourceGroups":["example.com"]}`

func newResourcesFit(t *testing.T, args string) (fwk.Plugin, error) {
	t.Helper()
	var obj runtime.Object
	if args != "" {
		obj = &runtime.Unknown{Raw: []byte(args), ContentType: runtime.ContentTypeJSON}
	}
	return New(context.Background(), obj, fitHandle{})
}

// upstreamFit is kube-scheduler's NodeResourcesFit with the same
// arguments, built the way the in-tree registry builds it.
func upstreamFit(t *testing.T, args string) fwk.Plugin {
	t.Helper()
	obj, _, err := scheme.Codecs.UniversalDecoder().Decode([]byte(`{"apiVersion":"kubescheduler.config.k8s.io/v1","kind":"NodeResourcesFitArgs",`+args[1:]), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := noderesources.NewFit(context.Background(), obj, fitHandle{}, plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var names = api.DefaultResourceNames

// podAsking is a pod whose container "main" asks res.
func podAsking(name string, res map[string]string) *corev1.Pod {
	return fixtures.MakePod().Namespace("default").Name(name).Container("main", res).Obj()
}

func filter(t *testing.T, p fwk.Plugin, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	t.Helper()
	cs := framework.NewCycleState()
	if _, st := p.(fwk.PreFilterPlugin).PreFilter(context.Background(), cs, pod, []fwk.NodeInfo{ni}); !st.IsSuccess() {
		return st
	}
	return p.(fwk.FilterPlugin).Filter(context.Background(), cs, pod, ni)
}

// The wrapper decides exactly as NodeResourcesFit with the same
// ignoredResources and ignoredResourceGroups, and leaves the pod alone.
func TestResourcesFitDecidesAsNodeResourcesFit(t *testing.T) {
	ours, err := newResourcesFit(t, pseudoArgs)
	if err != nil {
		t.Fatal(err)
	}
	if ours.Name() != Name {
		t.Errorf("name %q", ours.Name())
	}
	theirs := upstreamFit(t, pseudoArgs)
	node := fixtures.Node("a", fixtures.Inventory("a", 2, "NVIDIA A100-SXM4-40GB", 40960, 10), names) // 128 CPUs, 20 slots
	ni := framework.NewNodeInfo()
	ni.SetNode(node)

	withInit := fixtures.MakePod().Namespace("default").Name("init").
		InitContainer("prep", map[string]string{names.Cores: "30", "cpu": "200"}).
		Container("main", map[string]string{names.GPU: "1", names.Memory: "1000"}).Obj()
	podLevel := podAsking("pod-level", map[string]string{names.GPU: "1"})
	podLevel.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{"cpu": resource.MustParse("2"), corev1.ResourceName(names.Memory): resource.MustParse("1000")}}
	for _, pod := range []*corev1.Pod{
		podAsking("share", map[string]string{names.GPU: "1", names.Memory: "10000", names.Cores: "30"}),
		podAsking("percent", map[string]string{names.GPU: "2", names.MemoryPercentage: "50"}),
		podAsking("too-many-slots", map[string]string{names.GPU: "21", names.Memory: "1000"}),
		podAsking("too-much-cpu", map[string]string{names.GPU: "1", names.Memory: "1000", "cpu": "129"}),
		podAsking("group", map[string]string{"example.com/widget": "3"}),
		podAsking("unknown-resource", map[string]string{"other.io/widget": "1", names.Cores: "10"}),
		withInit,
		podLevel,
	} {
		before := pod.DeepCopy()
		got, want := filter(t, ours, pod, ni), filter(t, theirs, pod, ni)
		if got.Code() != want.Code() || got.Message() != want.Message() {
			t.Errorf("%s: %v, NodeResourcesFit says %v", pod.Name, got, want)
		}
		if !equality.Semantic.DeepEqual(before, pod) {
			t.Errorf("%s: the pod was changed", pod.Name)
		}
	}
	// The cases above include both verdicts.
	if st := filter(t, ours, podAsking("share", map[string]string{names.GPU: "1", names.Memory: "10000"}), ni); !st.IsSuccess() {
		t.Errorf("a share of one slot does not fit an empty node: %v", st)
	}
	if st := filter(t, ours, podAsking("cpu", map[string]string{names.Memory: "1000", "cpu": "129"}), ni); st.IsSuccess() || !strings.Contains(st.Message(), "Insufficient cpu") {
		t.Errorf("129 CPUs on a 128-CPU node: %v", st)
	}
}

func TestResourcesFitArguments(t *testing.T) {
	if _, err := newResourcesFit(t, ""); err != nil {
		t.Errorf("no arguments (defaults): %v", err)
	}
	_, err := newResourcesFit(t, `{"scoringStrategy":{"type":"Widest"}}`)
	if err == nil || !strings.Contains(err.Error(), Name) || !strings.Contains(err.Error(), "Widest") {
		t.Errorf("unknown scoring strategy: %v", err)
	}
	_, err = newResourcesFit(t, `{"ignoredResources":["nvidia.com/gpumem"],"ignoredResourceGroups":["bad/group"]}`)
	if err == nil || !strings.Contains(err.Error(), "bad/group") {
		t.Errorf("invalid resource group: %v", err)
	}
}

// What NodeResourcesFit's PreFilter is given: the pod without the ignored
// resources, everything else kept; a pod with none is passed as it is.
func TestResourcesFitStripsIgnoredResources(t *testing.T) {
	p, err := newResourcesFit(t, pseudoArgs)
	if err != nil {
		t.Fatal(err)
	}
	r := p.(*resourcesFit)
	pod := fixtures.MakePod().Namespace("default").Name("share").
		InitContainer("prep", map[string]string{names.MemoryPercentage: "10", "memory": "1Gi"}).
		Container("main", map[string]string{names.GPU: "1", names.Memory: "10000", names.Cores: "30", "cpu": "2", "example.com/widget": "1"}).Obj()
	before := pod.DeepCopy()
	got := r.withoutIgnored(pod)
	if !equality.Semantic.DeepEqual(before, pod) {
		t.Fatal("the informer's pod was changed")
	}
	for _, c := range append(append([]corev1.Container{}, got.Spec.Containers...), got.Spec.InitContainers...) {
		for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for n := range l {
				if r.isIgnored(n) {
					t.Errorf("container %s still asks for %s", c.Name, n)
				}
			}
		}
	}
	// fixtures.MakePod puts cpu and memory in requests, the rest in limits.
	main := got.Spec.Containers[0].Resources
	if q := main.Limits[corev1.ResourceName(names.GPU)]; q.Value() != 1 || len(main.Limits) != 1 {
		t.Errorf("limits %v, want nvidia.com/gpu: 1 alone", main.Limits)
	}
	if q := main.Requests["cpu"]; q.Value() != 2 {
		t.Errorf("cpu request lost: %v", main.Requests)
	}
	if q := got.Spec.InitContainers[0].Resources.Requests["memory"]; q.Value() != 1<<30 {
		t.Errorf("init container's memory request lost: %v", got.Spec.InitContainers[0].Resources.Requests)
	}
	plain := podAsking("plain", map[string]string{"cpu": "1", names.GPU: "1"})
	if r.withoutIgnored(plain) != plain {
		t.Error("a pod without ignored resources was copied")
	}
}
