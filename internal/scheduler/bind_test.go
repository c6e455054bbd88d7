package scheduler

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// bindingServer makes the fake clientset apply Bindings as the API server
// does (node name and annotations onto the pod, Conflict once bound);
// fail, if set, turns an applied binding's answer into an error.
func bindingServer(client *fake.Clientset, fail func(applied int) error) {
	applied := 0
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
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

// reservedCycle runs PreFilter, Filter and Reserve for a fractional pod
// on node "a" and sets the plugin's client to a fake holding the pod.
func reservedCycle(t *testing.T, p *Plugin) (fwk.CycleState, *corev1.Pod) {
	t.Helper()
	n := fixtures.Node("a", fixtures.Inventory("a", 2, "NVIDIA A100-SXM4-40GB", 40960, 10), names)
	p.st.upsertNode(klog.Background(), n)
	ni := framework.NewNodeInfo()
	ni.SetNode(n)
	pod := gpuPod("p", map[string]string{names.Memory: "1000"})
	ctx := context.Background()
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, []fwk.NodeInfo{ni}); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Filter(ctx, cs, pod, ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Reserve(ctx, cs, pod, "a"); !st.IsSuccess() {
		t.Fatal(st)
	}
	client := fake.NewClientset(pod)
	bindingServer(client, nil)
	p.client = client
	return cs, pod
}

// testBinding is the Binding the plugin makes for a reserved pod.
func testBinding(t *testing.T) (*corev1.Pod, *corev1.Binding) {
	t.Helper()
	p, err := newPlugin(api.ClusterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cs, pod := reservedCycle(t, p)
	rec, st := reserved(readState(cs), pod)
	if st != nil {
		t.Fatal(st)
	}
	b, err := bindingWithRecord(pod, "a", rec)
	if err != nil {
		t.Fatal(err)
	}
	return pod, b
}

func TestCreateBindingSetsNodeAndRecordTogether(t *testing.T) {
	pod, b := testBinding(t)
	client := fake.NewClientset(pod)
	bindingServer(client, nil)
	if err := createBinding(context.Background(), client, b); err != nil {
		t.Fatal(err)
	}
	got, _ := client.CoreV1().Pods("default").Get(context.Background(), "p", metav1.GetOptions{})
	if got.Spec.NodeName != "a" || got.Annotations[api.AnnotationAllocation] != b.Annotations[api.AnnotationAllocation] {
		t.Errorf("pod after binding: node %q, record %q", got.Spec.NodeName, got.Annotations[api.AnnotationAllocation])
	}
	if _, err := api.DecodeAllocation([]byte(got.Annotations[api.AnnotationAllocation])); err != nil {
		t.Errorf("record on the pod: %v", err)
	}
}

// A binding that timed out after the API server applied it is retried,
// meets "already bound", and is recognised as done.
func TestCreateBindingTimedOutButApplied(t *testing.T) {
	pod, b := testBinding(t)
	client := fake.NewClientset(pod)
	bindingServer(client, func(applied int) error {
		return apierrors.NewTimeoutError("request timed out", 1)
	})
	if err := createBinding(context.Background(), client, b); err != nil {
		t.Fatalf("binding applied by a timed-out request reported as failed: %v", err)
	}
}

// A pod bound elsewhere (or with another record) is an error that names
// the pod and the node.
func TestCreateBindingConflict(t *testing.T) {
	pod, b := testBinding(t)
	pod.Spec.NodeName = "b"
	client := fake.NewClientset(pod)
	bindingServer(client, nil)
	err := createBinding(context.Background(), client, b)
	if err == nil || !strings.Contains(err.Error(), "default/p to a") || !apierrors.IsConflict(err) {
		t.Fatalf("binding a pod bound elsewhere: %v", err)
	}
}

// profileHandle is a framework handle that lists the profile's plugins.
type profileHandle struct {
	fwk.Handle
	plugins *schedconfig.Plugins
}

func (h profileHandle) ListPlugins() *schedconfig.Plugins { return h.plugins }
func (h profileHandle) APICacher() fwk.APICacher          { return nil }

func TestRecordWrittenWhereTheProfileBinds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		binders []string
		want    bool
	}{
		{"Tessera first", []string{Name, "DefaultBinder"}, true},
		{"DefaultBinder first", []string{"DefaultBinder", Name}, false},
		{"Tessera not a binder", []string{"DefaultBinder"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := newPlugin(api.ClusterConfig{})
			if err != nil {
				t.Fatal(err)
			}
			pl := &schedconfig.Plugins{}
			for _, b := range tc.binders {
				pl.Bind.Enabled = append(pl.Bind.Enabled, schedconfig.Plugin{Name: b})
			}
			p.handle = profileHandle{plugins: pl}
			if got := p.recordInBinding(klog.Background()); got != tc.want {
				t.Fatalf("record in the binding = %v, want %v", got, tc.want)
			}
			cs, pod := reservedCycle(t, p)
			_, pre := p.PreBindPreFlight(context.Background(), cs, pod, "a")
			bind := p.Bind(context.Background(), cs, pod, "a")
			if tc.want {
				if !pre.IsSkip() || !bind.IsSuccess() {
					t.Errorf("Tessera binds: PreBindPreFlight %v (want Skip), Bind %v (want Success)", pre, bind)
				}
			} else if !pre.IsSuccess() || !bind.IsSkip() {
				t.Errorf("another plugin binds: PreBindPreFlight %v (want Success), Bind %v (want Skip)", pre, bind)
			}
		})
	}
}
