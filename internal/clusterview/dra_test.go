package clusterview

import (
	"context"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestCollectDRAForbidden: a user who may not list ResourceClaims gets
// the views without claims and the refusal in the report, not a failed
// command; any other error fails the collection.
func TestCollectDRAForbidden(t *testing.T) {
	for _, tc := range []struct {
		err     error
		wantErr bool
	}{
		{apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "", nil), false},
		{apierrors.NewInternalError(errors.New("etcd down")), true},
	} {
		client := fake.NewClientset()
		client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, tc.err
		})
		r, err := Collect(context.Background(), client)
		if tc.wantErr {
			if err == nil {
				t.Errorf("%v: collected", tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.err, err)
		}
		if r.DRA == nil || !strings.Contains(r.DRA.Error(), "listing ResourceClaims") {
			t.Errorf("report's DRA error %v, want the refusal", r.DRA)
		}
	}
}
