package webhook

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestCeilingValidation: each refusal names the ceiling's field, its value
// and the limit it breaks.
func TestCeilingValidation(t *testing.T) {
	const field = "spec.containers[0].resources.limits[nvidia.com/gpumem-ceiling]"
	for _, tc := range []struct {
		name string
		res  map[string]string
		want []string
	}{
		{"above the largest GPU", map[string]string{"nvidia.com/gpumem": "4096", "nvidia.com/gpumem-ceiling": "50000"}, []string{field, "50000", "exceeds the largest GPU in the cluster (40960 MiB)"}},
		{"below the guarantee", map[string]string{"nvidia.com/gpumem": "8192", "nvidia.com/gpumem-ceiling": "4096"}, []string{field, "4096", "must be at least nvidia.com/gpumem (8192 MiB, the guarantee)"}},
		{"without a guarantee in MiB", map[string]string{"nvidia.com/gpumem-percentage": "10", "nvidia.com/gpumem-ceiling": "8192"}, []string{field, "set nvidia.com/gpumem as well"}},
		{"on a whole GPU", map[string]string{"nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "100", "nvidia.com/gpumem-ceiling": "8192"}, []string{field, "nothing to borrow"}},
		{"not whole", map[string]string{"nvidia.com/gpumem": "4096", "nvidia.com/gpumem-ceiling": "8192.5"}, []string{field, "must be a whole number"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := testAdmission().Validate(pod(tc.res))
			if len(errs) == 0 {
				t.Fatal("accepted")
			}
			msg := Message(errs)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q does not mention %q", msg, w)
				}
			}
		})
	}
}

// TestCeilingMutation: the ceiling is written as request = limit beside
// the guarantee; one equal to the guarantee asks nothing and is dropped;
// the quota charge is the guarantee alone.
func TestCeilingMutation(t *testing.T) {
	adm := testAdmission()
	for _, tc := range []struct {
		name        string
		res         map[string]string
		wantCeiling int64 // 0: absent
	}{
		{"burst", map[string]string{"nvidia.com/gpumem": "4096", "nvidia.com/gpumem-ceiling": "16384"}, 16384},
		{"equal to the guarantee", map[string]string{"nvidia.com/gpumem": "4096", "nvidia.com/gpumem-ceiling": "4096"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := pod(tc.res)
			if errs := adm.Validate(in); len(errs) > 0 {
				t.Fatal(Message(errs))
			}
			out, _, err := adm.Mutate(in)
			if err != nil {
				t.Fatal(err)
			}
			r := out.Spec.Containers[0].Resources
			for _, list := range []corev1.ResourceList{r.Limits, r.Requests} {
				q, ok := list["nvidia.com/gpumem-ceiling"]
				if ok != (tc.wantCeiling > 0) || q.Value() != tc.wantCeiling {
					t.Errorf("ceiling %v (present %v), want %d", q.String(), ok, tc.wantCeiling)
				}
				if g := list["nvidia.com/gpumem"]; g.Value() != 4096 {
					t.Errorf("guarantee %s", g.String())
				}
				if c := list[QuotaMemoryResource]; c.Value() != 4096<<20 {
					t.Errorf("%s = %s, want the guarantee (4Gi), not the ceiling", QuotaMemoryResource, c.String())
				}
			}
			if errs := adm.Validate(out); len(errs) > 0 {
				t.Errorf("mutated pod invalid: %s", Message(errs))
			}
		})
	}
}
