package scheduler

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestCeilingPodsPackByGuarantee runs the shipped profile: a pod asking a
// memory ceiling passes NodeResourcesFit (the ceiling is one of the
// ignored pseudo-resources, no node advertises it), gets a v3 record with
// its ceiling, and the GPU is charged its guarantee alone, so guarantees
// fill a GPU whatever the ceilings say, and never past it.
func TestCeilingPodsPackByGuarantee(t *testing.T) {
	ts := newTestScheduler(t, nil, a100Node("a", 1))
	burst := map[string]string{"nvidia.com/gpumem": "10240", "nvidia.com/gpumem-ceiling": "40960"}
	for _, name := range []string{"b0", "b1", "b2", "b3"} {
		p := fixtures.MakePod().Name(name).Container("main", burst).Obj()
		// requests = limits, as the API server defaults them (what
		// NodeResourcesFit reads)
		p.Spec.Containers[0].Resources.Requests = p.Spec.Containers[0].Resources.Limits.DeepCopy()
		if node, msg := ts.schedule(p); node != "a" {
			t.Fatalf("%s: %q %s", name, node, msg)
		}
	}
	pod, err := ts.client.CoreV1().Pods("default").Get(ts.ctx, "b0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := kubeobj.Record(pod)
	if err != nil {
		t.Fatal(err)
	}
	if d := rec.Containers[0].Devices[0]; d.MemoryMiB != 10240 || d.CeilingMiB != 40960 || rec.APIVersion != api.AllocationAPIVersion {
		t.Errorf("record %s %+v, want a %s grant of 10240 MiB with a ceiling of 40960", rec.APIVersion, d, api.AllocationAPIVersion)
	}
	// Four guarantees of 10240 MiB fill the 40960 MiB GPU.
	if node, msg := ts.schedule(fixtures.MakePod().Name("more").Container("main", map[string]string{"nvidia.com/gpumem": "1024"}).Obj()); node != "" {
		t.Errorf("a fifth guarantee was placed on %s; want it refused (%s)", node, msg)
	}
	ts.check()
}
