package resourcesfit

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestClaimFreedBy: a claim frees its devices only when every pod it is
// reserved for is gone; one reserved for something else never does.
func TestClaimFreedBy(t *testing.T) {
	pod := func(uid string) resourceapi.ResourceClaimConsumerReference {
		return resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: uid, UID: types.UID(uid)}
	}
	claim := func(allocated bool, refs ...resourceapi.ResourceClaimConsumerReference) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{}
		c.Status.ReservedFor = refs
		if allocated {
			c.Status.Allocation = &resourceapi.AllocationResult{}
		}
		return c
	}
	gone := map[types.UID]bool{"a": true, "b": true}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  bool
	}{
		{"one pod, gone", claim(true, pod("a")), true},
		{"shared, all gone", claim(true, pod("a"), pod("b")), true},
		{"shared with a pod that stays", claim(true, pod("a"), pod("high")), false},
		{"reserved for a workload", claim(true, pod("a"), resourceapi.ResourceClaimConsumerReference{APIGroup: "scheduling.k8s.io", Resource: "workloads", Name: "w", UID: "a"}), false},
		{"not allocated", claim(false, pod("a")), false},
		{"reserved for nothing", claim(true), true},
	} {
		if got := ClaimFreedBy(tc.claim, func(uid types.UID) bool { return gone[uid] }); got != tc.want {
			t.Errorf("%s: freed %v, want %v", tc.name, got, tc.want)
		}
	}
}
