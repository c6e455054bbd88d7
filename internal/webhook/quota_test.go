package webhook

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestQuotaCharge: every request form is charged its GPU memory in bytes
// on tessera.io/gpu-memory (request = limit), whatever the pod wrote there.
func TestQuotaCharge(t *testing.T) {
	names := api.DefaultResourceNames
	adm := &Admission{Names: names, SchedulerName: api.SchedulerName, LargestGPUMiB: func() int64 { return 81920 }}
	for _, tc := range []struct {
		name   string
		res    map[string]string
		extra  map[string]string
		wantMi int64
	}{
		{"gpumem", map[string]string{names.Memory: "20480"}, nil, 20480},
		{"gpumem on two GPUs", map[string]string{names.GPU: "2", names.Memory: "10000"}, nil, 20000},
		{"percentage of the largest GPU", map[string]string{names.MemoryPercentage: "25"}, nil, 20480},
		{"fraction of a GPU", map[string]string{names.GPU: "0.5"}, nil, 40960},
		{"whole GPUs", map[string]string{names.GPU: "2"}, nil, 2 * 81920},
		{"MIG device", map[string]string{names.MIG("3g.20gb"): "1"}, nil, 20480},
		{"a forged charge is replaced", map[string]string{names.Memory: "20480"}, map[string]string{QuotaMemoryResource: "1"}, 20480},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := fixtures.MakePod().Namespace("ml").Name("p").Container("main", tc.res).Obj()
			for k, v := range tc.extra {
				c := &pod.Spec.Containers[0]
				c.Resources.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
				if c.Resources.Requests == nil {
					c.Resources.Requests = corev1.ResourceList{}
				}
				c.Resources.Requests[corev1.ResourceName(k)] = resource.MustParse(v)
			}
			out, _, err := adm.Mutate(pod)
			if err != nil {
				t.Fatal(err)
			}
			r := out.Spec.Containers[0].Resources
			for _, list := range []corev1.ResourceList{r.Limits, r.Requests} {
				q := list[QuotaMemoryResource]
				if q.Value() != tc.wantMi<<20 {
					t.Errorf("%s = %s, want %dMi", QuotaMemoryResource, q.String(), tc.wantMi)
				}
			}
		})
	}
	// Idempotent: mutating the mutated pod changes nothing (reinvocation).
	pod := fixtures.MakePod().Namespace("ml").Name("p").Container("main", map[string]string{names.Memory: "20480"}).Obj()
	out, _, err := adm.Mutate(pod)
	if err != nil {
		t.Fatal(err)
	}
	if _, changed, err := adm.Mutate(out); err != nil || changed {
		t.Errorf("second mutation changed=%v err=%v", changed, err)
	}
}
