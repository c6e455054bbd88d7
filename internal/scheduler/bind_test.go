package scheduler

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// testBinding is the Binding the plugin makes for a pod holding a share.
func testBinding(t *testing.T) (*corev1.Pod, *corev1.Binding) {
	t.Helper()
	pod := fixtures.MakePod().Namespace("default").Name("p").UID("uid-p").Container("main", map[string]string{names.Memory: "1000"}).Obj()
	rec := &api.PodAllocation{APIVersion: api.AllocationAPIVersion, Kind: api.AllocationKind, Node: "a",
		Containers: []api.ContainerAllocation{{Name: "main", Devices: []api.DeviceGrant{{UUID: fixtures.GPUUUID("a", 0), MemoryMiB: 1000}}}}}
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

// The record goes where the profile binds: in the Binding when Tessera is
// the first bind plugin (the shipped profile), else PreBind patches it on
// the pod before DefaultBinder binds. Either way the pod ends bound with
// its record.
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
			ts := newTestScheduler(t, func(p *schedconfig.KubeSchedulerProfile) {
				p.Plugins.Bind.Enabled = nil
				for _, b := range tc.binders {
					p.Plugins.Bind.Enabled = append(p.Plugins.Bind.Enabled, schedconfig.Plugin{Name: b})
				}
			}, a100Node("a", 2))
			if node, msg := ts.schedule(fixtures.MakePod().Name("p").Container("main", map[string]string{names.Memory: "1000"}).Obj()); node != "a" {
				t.Fatalf("not bound: %s", msg)
			}
			if got := ts.plugin.recordInBinding(klog.Background()); got != tc.want {
				t.Fatalf("record in the binding = %v, want %v", got, tc.want)
			}
			inBinding, patched := false, false
			for _, a := range ts.client.Actions() {
				switch a := a.(type) {
				case k8stesting.CreateAction:
					if b, ok := a.GetObject().(*corev1.Binding); ok && a.GetSubresource() == "binding" {
						_, inBinding = b.Annotations[api.AnnotationAllocation]
					}
				case k8stesting.PatchAction:
					if a.GetSubresource() == "" && strings.Contains(string(a.GetPatch()), api.AnnotationAllocation) {
						patched = true
					}
				}
			}
			if inBinding != tc.want || patched == tc.want {
				t.Errorf("record in the Binding %v, patched by PreBind %v; want the Binding %v", inBinding, patched, tc.want)
			}
		})
	}
}
