package webhook

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestRunGivesUpWhenItCannotStart: a webhook whose informers never sync
// (its service account may not list nodes) ends with an error naming the
// informer and the bound, instead of running for ever without serving
// (seen in the e2e test: a replica never ready, its log empty).
func TestRunGivesUpWhenItCannotStart(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "", nil)
	})
	names, err := api.NewResourceNames(api.DefaultResourcePrefix)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	err = Run(ctx, Options{Client: client, Names: names, Listen: "127.0.0.1:0", Hosts: []string{"127.0.0.1"}, StartTimeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "did not sync within 2s") || !strings.Contains(err.Error(), "Node") {
		t.Fatalf("Run: %v, want an error naming the node informer and the 2s bound", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Run gave up after %s, want about 2s", d)
	}
}
