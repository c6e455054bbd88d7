package clusterview

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestWhyPreemption: a pending pod a preemption nominated a node for
// shows the node and its victims, from the Preempted events that name it
// (by related object, or by UID in the note when the recorder could not
// reference it): one terminating, one gone; events about other pods are
// left out. A user who may not list events in every namespace gets those
// of the pod's namespace.
func TestWhyPreemption(t *testing.T) {
	node := fixtures.Node("n1", fixtures.Inventory("n1", 1, "NVIDIA A100-SXM4-40GB", 40960, 10), api.DefaultResourceNames)
	high := fixtures.MakePod().Namespace("gpu").Name("high").UID("uid-high").Container("main", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}).Obj()
	high.Status.NominatedNodeName = "n1"
	low := fixtures.MakePod().Namespace("gpu").Name("low-1").UID("uid-low-1").Node("n1").Container("main", map[string]string{"cpu": "1"}).Obj()
	now := metav1.Now()
	low.DeletionTimestamp = &now
	event := func(name, victim, msg string, related *corev1.ObjectReference) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: "gpu", Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "gpu", Name: victim, UID: types.UID("uid-" + victim)},
			Reason:         "Preempted", Message: msg, Related: related,
		}
	}
	client := fake.NewClientset(node, high, low,
		event("e1", "low-1", "Preempted by pod uid-high on node n1; Tessera: frees GPU-x for gpu/high (it holds 10240 MiB and 25% of the cores of GPU-x)", nil),
		event("e2", "low-2", "Preempted by pod other on node n1", &corev1.ObjectReference{Kind: "Pod", UID: "uid-high"}),
		event("e3", "low-3", "Preempted by pod uid-other on node n2", nil))
	client.PrependReactor("list", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", nil)
		}
		return false, nil, nil
	})
	r, err := Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	w, err := r.Why("gpu", "high")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Preemptions(context.Background(), client, w); err != nil {
		t.Fatal(err)
	}
	if w.Nominated != "n1" || len(w.Victims) != 2 || w.Victims[0].Pod != "gpu/low-1" || w.Victims[0].State != "terminating" ||
		w.Victims[1].Pod != "gpu/low-2" || w.Victims[1].State != "gone" {
		t.Fatalf("nominated %q, victims %+v", w.Nominated, w.Victims)
	}
	var out strings.Builder
	if err := w.Print(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Nominated node: n1", "victim gpu/low-1 (terminating): Preempted by pod uid-high", "frees GPU-x for gpu/high"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("why prints %q, without %q", out.String(), want)
		}
	}
}
