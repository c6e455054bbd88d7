//go:build integration

package lab_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
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
	const ns = "burst"
	useNamespace(t, ns)
	gpus := nodeGPUs(t, victimNode)
	gpu := gpus[2]
	if gpu.MemoryMiB != 40960 {
		t.Fatalf("GPU %s has %d MiB, want an A100-40GB", gpu.UUID, gpu.MemoryMiB)
	}
	fillPod(t, ns, "bursty", gpu.UUID, map[string]string{names.Memory: "8192", names.MemoryCeiling: "32768"})
	log := logsContain(t, ns, "bursty", "refused at")
	t.Logf("bursty:\n%s", log)
	if !strings.Contains(log, "cuMemGetInfo: total 32768 MiB") {
		t.Errorf("bursty is not told its ceiling as its total")
	}
	// 1024 MiB steps up to the ceiling, less the limiter's context charge
	if got := lastInTotal(log); got < 32768-1024 || got > 32768 {
		t.Errorf("bursty holds %d MiB; want its ceiling of 32768 MiB (less a step), past its guarantee of 8192", got)
	}

	fillPod(t, ns, "guaranteed", gpu.UUID, map[string]string{names.Memory: "32768"})
	log = logsContain(t, ns, "guaranteed", "refused at")
	t.Logf("guaranteed:\n%s", log)
	if got := lastInTotal(log); got < 32768-1024 {
		t.Errorf("guaranteed holds %d MiB; want its guarantee of 32768 MiB (less a step)", got)
	}
	fams := reclaimed(t, ns, "bursty", "GPU "+gpu.UUID, "guarantee of 8192 MiB", "ceiling 32768 MiB", "killed its processes")
	if m := findSeries(fams, reclaimsTotal, map[string]string{"gpu": gpu.UUID, "trigger": reconcile.TriggerAdmission}); m == nil || m.GetCounter().GetValue() < 1 {
		t.Errorf("%s{gpu=%q,trigger=%q} = %v", reclaimsTotal, gpu.UUID, reconcile.TriggerAdmission, m)
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

// TestReclaimOnRefusal: a guarantee whose admission reclaimed nothing is
// refused memory by the driver, and its first refused allocation makes
// the agent stop the borrower. On a 40 GiB GPU a host process the ledger
// does not know of (a monitoring tool, say) holds 10 GiB; a container
// guaranteed 8 GiB with a 30 GiB ceiling fills the rest. A pod guaranteed
// 8 GiB then comes: what the borrower holds past its guarantee (22 GiB)
// fits in the memory no one is guaranteed (24 GiB), so its Allocate stops
// no one, but the GPU is full and the driver refuses its first
// allocation. Its limiter asks through its need file and retries; the
// agent stops the borrower (TesseraGPUMemoryReclaimed naming the refusal,
// the reclaim counter's trigger "refusal"), and the pod gets its whole
// guarantee.
func TestReclaimOnRefusal(t *testing.T) {
	const ns = "reclaim-refusal"
	useNamespace(t, ns)
	gpu := nodeGPUs(t, victimNode)[3]
	if gpu.MemoryMiB != 40960 {
		t.Fatalf("GPU %s has %d MiB, want an A100-40GB", gpu.UUID, gpu.MemoryMiB)
	}
	// the host process: the fake driver on the node's state file of the GPU
	devs := t.TempDir()
	if err := os.Link(filepath.Join(dir.Node(victimNode).GPUs(), gpu.UUID), filepath.Join(devs, "0")); err != nil {
		t.Fatal(err)
	}
	hog := exec.Command(filepath.Join(labTools, "bin", "gpu-fill"), "--step", "1024", "--max", "10240", "--hold", "forever")
	hog.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(labTools, "lib"), "FAKE_GPU_DEVICES="+devs)
	out, err := hog.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hog.Process.Kill(); _ = hog.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "stopped at --max") {
	}
	if !strings.Contains(sc.Text(), "10240 MiB") {
		t.Fatalf("the host process holds no 10 GiB on %s: %q", gpu.UUID, sc.Text())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()

	fillPod(t, ns, "bursty", gpu.UUID, map[string]string{names.Memory: "8192", names.MemoryCeiling: "30720"})
	log := logsContain(t, ns, "bursty", "refused at")
	if got := lastInTotal(log); got < 30720-1024 {
		t.Fatalf("bursty holds %d MiB; want the rest of the GPU, about 30720 MiB:\n%s", got, log)
	}

	fillPod(t, ns, "guaranteed", gpu.UUID, map[string]string{names.Memory: "8192"})
	log = logsContain(t, ns, "guaranteed", "refused at")
	t.Logf("guaranteed:\n%s", log)
	if got := lastInTotal(log); got < 8192-1024 {
		t.Errorf("guaranteed holds %d MiB; want its guarantee of 8192 MiB (less a step)", got)
	}
	fams := reclaimed(t, ns, "bursty", "GPU "+gpu.UUID, "guarantee of 8192 MiB", "ceiling 30720 MiB",
		"the driver refused memory to a container within its guarantee", "killed its processes")
	if m := findSeries(fams, reclaimsTotal, map[string]string{"gpu": gpu.UUID, "trigger": reconcile.TriggerRefusal}); m == nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("%s{gpu=%q,trigger=%q} = %v, want 1", reclaimsTotal, gpu.UUID, reconcile.TriggerRefusal, m)
	}
	if m := findSeries(fams, reclaimsTotal, map[string]string{"gpu": gpu.UUID, "trigger": reconcile.TriggerAdmission}); m != nil {
		t.Errorf("the guaranteed pod's admission reclaimed: %v", m)
	}
	if p := waitPod(t, ns, "guaranteed", time.Minute, phase(corev1.PodRunning)); p.Status.Phase != corev1.PodRunning {
		t.Errorf("guaranteed: %s", p.Status.Phase)
	}
}

const reclaimsTotal = "tessera_node_agent_gpu_memory_reclaims_total"

// reclaimed checks that the reconciler stopped pod: its processes killed
// (137), a TesseraGPUMemoryReclaimed event naming each of want; it
// returns the node's metrics after the event.
func reclaimed(t *testing.T, ns, pod string, want ...string) map[string]*dto.MetricFamily {
	t.Helper()
	got := waitPod(t, ns, pod, time.Minute, phase(corev1.PodFailed))
	if s := got.Status.ContainerStatuses; len(s) != 1 || s[0].State.Terminated == nil || s[0].State.Terminated.ExitCode != 137 {
		t.Errorf("%s: %+v; want its processes killed (137)", pod, s)
	}
	var events []string
	testenv.WaitFor(t, pod+"'s "+reconcile.ReasonReclaimed+" event", time.Minute, func() bool {
		events = eventsOf(t, ns, pod)
		return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, reconcile.ReasonReclaimed+": ") })
	})
	for _, e := range events {
		if strings.HasPrefix(e, reconcile.ReasonReclaimed) {
			t.Log(e)
			for _, w := range want {
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
	return scrapeMetrics(t, url)
}

// fillPod creates a pod on the victim node's GPU gpu that runs gpu-fill
// (1 GiB steps until refused, then holds what it got) under limits.
func fillPod(t *testing.T, ns, name, gpu string, limits map[string]string) {
	t.Helper()
	p := fixtures.MakePod().Namespace(ns).Name(name).ZeroTerminationGracePeriod().Annotation(api.AnnotationUseGPUUUID, gpu).
		Container("c", limits).Obj()
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": victimNode}
	p.Spec.RestartPolicy = corev1.RestartPolicyNever
	p.Spec.Containers[0].Command = []string{"gpu-fill", "--step", "1024", "--hold", "forever"}
	if _, err := client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
