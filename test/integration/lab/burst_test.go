//go:build integration

package lab_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestBurstAndReclaim: guaranteed plus burst on a GPU whose driver does
// not partition memory (the limiter and the host-side reconciler). A
// container guaranteed 8 GiB with a 32 GiB ceiling, alone on a 40 GiB
// GPU, is told the ceiling as its total and fills it from the memory no
// one is guaranteed. A pod guaranteed the other 32 GiB then comes to the
// GPU: the agent stops the borrower when it serves the newcomer (a
// TesseraGPUMemoryReclaimed event naming GPU, guarantee and usage; the
// reclaim counter), and the newcomer gets all of its guarantee.
func TestBurstAndReclaim(t *testing.T) {
	ctx := context.Background()
	const ns = "burst"
	useNamespace(t, ns)
	gpus := nodeGPUs(t, victimNode)
	gpu := gpus[2]
	if gpu.MemoryMiB != 40960 {
		t.Fatalf("GPU %s has %d MiB, want an A100-40GB", gpu.UUID, gpu.MemoryMiB)
	}
	pod := func(name string, limits map[string]string) *corev1.Pod {
		p := fixtures.MakePod().Namespace(ns).Name(name).ZeroTerminationGracePeriod().Annotation(api.AnnotationUseGPUUUID, gpu.UUID).
			Container("c", limits).Obj()
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": victimNode}
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].Command = []string{"gpu-fill", "--step", "1024", "--hold", "forever"}
		return p
	}
	create := func(p *corev1.Pod) {
		t.Helper()
		if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}

	create(pod("bursty", map[string]string{names.Memory: "8192", names.MemoryCeiling: "32768"}))
	log := logsContain(t, ns, "bursty", "refused at")
	t.Logf("bursty:\n%s", log)
	if !strings.Contains(log, "cuMemGetInfo: total 32768 MiB") {
		t.Errorf("bursty is not told its ceiling as its total")
	}
	// 1024 MiB steps up to the ceiling, less the limiter's context charge
	if got := lastInTotal(log); got < 32768-1024 || got > 32768 {
		t.Errorf("bursty holds %d MiB; want its ceiling of 32768 MiB (less a step), past its guarantee of 8192", got)
	}

	create(pod("guaranteed", map[string]string{names.Memory: "32768"}))
	log = logsContain(t, ns, "guaranteed", "refused at")
	t.Logf("guaranteed:\n%s", log)
	if got := lastInTotal(log); got < 32768-1024 {
		t.Errorf("guaranteed holds %d MiB; want its guarantee of 32768 MiB (less a step)", got)
	}
	got := waitPod(t, ns, "bursty", time.Minute, phase(corev1.PodFailed))
	if s := got.Status.ContainerStatuses; len(s) != 1 || s[0].State.Terminated == nil || s[0].State.Terminated.ExitCode != 137 {
		t.Errorf("bursty: %+v; want its processes killed (137)", s)
	}
	var events []string
	testenv.WaitFor(t, "bursty's "+reconcile.ReasonReclaimed+" event", time.Minute, func() bool {
		events = eventsOf(t, ns, "bursty")
		return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, reconcile.ReasonReclaimed+": ") })
	})
	for _, e := range events {
		if strings.HasPrefix(e, reconcile.ReasonReclaimed) {
			t.Log(e)
			for _, w := range []string{"GPU " + gpu.UUID, "guarantee of 8192 MiB", "ceiling 32768 MiB", "killed its processes"} {
				if !strings.Contains(e, w) {
					t.Errorf("event %q does not name %q", e, w)
				}
			}
		}
	}
	url, err := dir.MetricsURL(victimNode)
	if err != nil {
		t.Fatal(err)
	}
	if m := findSeries(scrapeMetrics(t, url), "tessera_node_agent_gpu_memory_reclaims_total", map[string]string{"gpu": gpu.UUID}); m == nil || m.GetCounter().GetValue() < 1 {
		t.Errorf("tessera_node_agent_gpu_memory_reclaims_total{gpu=%q} = %v", gpu.UUID, m)
	}
	// the guaranteed pod keeps running, and nothing on the GPU holds more
	// than its grant (or its ceiling)
	if p := waitPod(t, ns, "guaranteed", time.Minute, phase(corev1.PodRunning)); p.Status.Phase != corev1.PodRunning {
		t.Errorf("guaranteed: %s", p.Status.Phase)
	}
	if err := checkPhysical(t).Err(); err != nil {
		t.Errorf("physical invariant: %v", err)
	}
}
