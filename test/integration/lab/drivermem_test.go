//go:build integration

package lab_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// partitioningNode is the lab's node whose driver partitions GPU memory
// per cgroup (labNodeGroups), tainted so that only the tests of
// driver-held limits place pods there.
const (
	partitioningNode = "lab-gpu-06"
	partitioningKey  = "tessera.io/test-driver-memory"
	// partitioningDRANode is its twin in mode dra.
	partitioningDRANode = "lab-dra-01"
)

// ceilingPod is a pod guaranteed 4096 MiB with a ceiling of 6144 on one
// GPU of node (nodeFillPod).
func ceilingPod(ns, name, node string) string {
	return nodeFillPod(ns, name, node, "nvidia.com/gpu: 1, nvidia.com/gpumem: 4096, nvidia.com/gpumem-ceiling: 6144")
}

// nodeFillPod is a pod on node with the GPU limits given (YAML flow-map
// entries), tolerating partitioningKey and the lab's sharing taint: it
// prints how many GPUs' limits the driver confirmed holding
// ("confirmation: N"), then fills its GPU in 512 MiB steps and holds what
// it got.
func nodeFillPod(ns, name, node, limits string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %s}
  tolerations: [{key: %s, operator: Exists}, {key: %s, operator: Exists}]
  containers:
  - name: main
    image: tessera-lab/cuda
    command: [sh, -c, 'echo "confirmation: $(cat /etc/tessera/driver-memory 2>&1 | grep -c ^device=)"; exec gpu-fill --step 512 --hold forever']
    resources:
      limits: {%s}
`, name, ns, node, partitioningKey, modes.SharingTaint, limits)
}

// driverTable is the driver's table of limits of the pod's GPU on node
// (none where the driver does not partition memory).
func driverTable(t *testing.T, node, gpu string) []fakegpu.Limit {
	t.Helper()
	l, err := fakegpu.ReadLimits(filepath.Join(dir.Node(node).GPUs(), gpu))
	if err != nil && !errors.Is(err, fakegpu.ErrNotSupported) {
		t.Fatal(err)
	}
	return l
}

// noDriverLimits checks that the pod's container "main" on node got no
// memory-limits hook (no hooks, no CDI devices) and that the driver's
// table of its GPU gpu is empty.
func noDriverLimits(t *testing.T, node, ns, pod, gpu string) {
	t.Helper()
	c, err := dir.Node(node).Container(ns, pod, "main")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Hooks) != 0 || len(c.CDIDevices) != 0 {
		t.Errorf("%s on %s got hooks %+v, CDI devices %v; want none", pod, node, c.Hooks, c.CDIDevices)
	}
	if l := driverTable(t, node, gpu); len(l) != 0 {
		t.Errorf("the driver's table of %s's GPU %s on %s: %+v; want it empty", pod, gpu, node, l)
	}
}

// podGPU is the GPU the pod's record grants its container.
func podGPU(t *testing.T, ns, name string) string {
	t.Helper()
	pod, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := kubeobj.Record(pod)
	if err != nil || rec == nil || len(rec.Containers) != 1 || len(rec.Containers[0].Devices) != 1 {
		t.Fatalf("record %+v, %v", rec, err)
	}
	return rec.Containers[0].Devices[0].UUID
}

// TestDriverMemoryLimits: on a node whose driver partitions GPU memory,
// a container guaranteed 4096 MiB with a ceiling of 6144 gets soft 4096
// and hard 6144 on its own cgroup from the hook the agent injects; the
// limiter, told by the confirmation, leaves its memory to the driver: the
// container bursts past its guarantee to the ceiling while the GPU's
// memory is free, sees the ceiling as its total, and is refused there.
// The agent, restarted mid-run, sets the limits again (here: after the
// driver lost them), and once the pods are deleted nothing is left in
// the driver's table. On a node whose driver does not partition memory,
// the same pod is held by the limiter to its guarantee and the driver's
// table stays empty.
func TestDriverMemoryLimits(t *testing.T) {
	const ns = "driver-memory"
	useNamespace(t, ns)
	apply(t, ceilingPod(ns, "burst", partitioningNode))
	out := logsContain(t, ns, "burst", "holding")
	t.Logf("kubectl logs burst:\n%s", out)
	if !strings.Contains(out, "confirmation: 1") || !strings.Contains(out, "cuMemGetInfo: total 6144 MiB") ||
		!strings.Contains(out, "refused at 6144 MiB") || lastInTotal(out) != 6144 {
		t.Errorf("the driver-limited container: want its confirmation, the ceiling (6144 MiB) as its total, and the whole ceiling before it is refused there (the limiter's 4096 MiB limit off)")
	}
	gpu := podGPU(t, ns, "burst")
	c, err := dir.Node(partitioningNode).Container(ns, "burst", "main")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(c.CDIDevices, func(d string) bool { return strings.HasPrefix(d, api.CDIKindMemoryLimits+"=") }) {
		t.Errorf("the container's CDI devices %v: want one of %s", c.CDIDevices, api.CDIKindMemoryLimits)
	}
	table := driverTable(t, partitioningNode, gpu)
	if len(table) != 1 || table[0].Soft != 4096<<20 || table[0].Hard != 6144<<20 || !strings.HasSuffix(table[0].Path, c.ID) || table[0].Crossings == 0 {
		t.Fatalf("the driver's table: %+v; want one entry, soft 4096 MiB, hard 6144 MiB, on the container's own group (…/%s), its soft limit crossed", table, c.ID)
	}

	t.Run("agent restarted", func(t *testing.T) {
		// The driver loses the limits (a driver reload), then the agent
		// restarts: its first pass sets them again on the running
		// container.
		if err := fakegpu.SetLimits(filepath.Join(dir.Node(partitioningNode).GPUs(), gpu), table[0].Path, 0, fakegpu.NoLimit); err != nil {
			t.Fatal(err)
		}
		if l := driverTable(t, partitioningNode, gpu); len(l) != 0 {
			t.Fatalf("the entry was not cleared: %+v", l)
		}
		restartComponent(t, "node-agent/"+partitioningNode)
		testenv.WaitFor(t, "the limits set again by the restarted agent", 2*time.Minute, func() bool {
			l := driverTable(t, partitioningNode, gpu)
			return len(l) == 1 && l[0].Soft == 4096<<20 && l[0].Hard == 6144<<20 && l[0].Path == table[0].Path
		})
	})

	t.Run("old driver", func(t *testing.T) {
		node := "lab-gpu-01"
		apply(t, ceilingPod(ns, "limiter", node))
		out := logsContain(t, ns, "limiter", "holding")
		// The limiter holds it: the guarantee plus what the GPU's budget
		// lends, up to the ceiling, reported as the total (docs/isolation.md,
		// "Guaranteed plus burst").
		if !strings.Contains(out, "confirmation: 0") || !strings.Contains(out, "cuMemGetInfo: total 6144 MiB") || lastInTotal(out) > 6144 {
			t.Errorf("a container on a node whose driver does not partition memory: want no confirmation and the limiter holding it at its 6144 MiB ceiling:\n%s", out)
		}
		noDriverLimits(t, node, ns, "limiter", podGPU(t, ns, "limiter"))
	})

	zero := int64(0)
	if err := client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the pods deleted", 2*time.Minute, func() bool {
		l, err := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	// The pods' objects go at once (grace 0); their containers a moment
	// later, and with them their groups.
	testenv.WaitFor(t, "the container's group removed", time.Minute, func() bool {
		_, err := os.Stat(table[0].Path)
		return os.IsNotExist(err)
	})
	if l := driverTable(t, partitioningNode, gpu); len(l) != 0 {
		t.Errorf("after deletion the driver's table holds %+v; want nothing (no leaked soft limit)", l)
	}
}

// partitioningMIGNode is the lab's dynamic-MIG node whose driver
// partitions GPU memory per cgroup (labNodeGroups), tainted like
// partitioningNode so that the other MIG tests' pods stay on lab-mig-dynamic.
const partitioningMIGNode = "lab-mig-dynamic-01"

// TestDriverMemoryLimitsMIG: on a node whose driver partitions GPU
// memory, a GPU in MIG mode is not one whose memory the driver holds (the
// driver does not partition a MIG GPU's memory): the agent reports it not
// partitioned (metric 0, the inventory's driverMemoryLimits unset), a pod
// given a MIG instance for its memory limit gets no memory-limits hook and
// no entry in the driver's table, and its memory is held as on any driver:
// the instance's size is its total and it is refused past it (no limiter
// on a MIG instance: docs/isolation.md, "Which layer enforces what"). A
// ceiling is refused on MIG by the scheduler, naming why. The GPU was not
// in MIG mode when the agent started (the agent turns it on), so this
// also checks that the agent stops counting it as partitioned then.
func TestDriverMemoryLimitsMIG(t *testing.T) {
	const ns = "driver-memory-mig"
	useNamespace(t, ns)
	ctx := context.Background()
	apply(t, nodeFillPod(ns, "mig", partitioningMIGNode, "nvidia.com/gpu: 1, nvidia.com/gpumem: 4000"))
	out := logsContain(t, ns, "mig", "holding")
	t.Logf("kubectl logs mig:\n%s", out)
	pod, err := client.CoreV1().Pods(ns).Get(ctx, "mig", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := kubeobj.Record(pod)
	if err != nil || rec == nil || len(rec.Containers) != 1 || len(rec.Containers[0].Devices) != 1 || rec.Containers[0].Devices[0].MIG == nil {
		t.Fatalf("record %+v, %v; want one MIG instance", rec, err)
	}
	g := rec.Containers[0].Devices[0]
	// A 1g.5gb instance of the mock A100-40GB: 4864 MiB.
	const instanceMiB = 4864
	if g.MIG.Profile != "1g.5gb" {
		t.Fatalf("grant %+v %+v; want a 1g.5gb instance for 4000 MiB", g, g.MIG)
	}
	if !strings.Contains(out, "confirmation: 0") || !strings.Contains(out, fmt.Sprintf("cuMemGetInfo: total %d MiB", instanceMiB)) ||
		!strings.Contains(out, "1 MiB more: CUDA_ERROR_OUT_OF_MEMORY") || lastInTotal(out) != instanceMiB {
		t.Errorf("the MIG container: want no confirmation, the instance's %d MiB as its total, all of it and not 1 MiB more", instanceMiB)
	}
	noDriverLimits(t, partitioningMIGNode, ns, "mig", g.UUID)
	// The driver does partition memory on this node (the fake driver's
	// table answers, it is not ErrNotSupported): only MIG rules it out.
	if _, err := fakegpu.ReadLimits(filepath.Join(dir.Node(partitioningMIGNode).GPUs(), g.UUID)); err != nil {
		t.Errorf("the fake driver of %s: %v; want one that partitions memory (+partitioning)", partitioningMIGNode, err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, partitioningMIGNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := kubeobj.Inventory(node)
	if err != nil || inv == nil {
		t.Fatalf("inventory of %s: %v", partitioningMIGNode, err)
	}
	for _, gpu := range inv.GPUs {
		if gpu.UUID == g.UUID && (gpu.DriverMemoryLimits || !gpu.MIG.Enabled) {
			t.Errorf("inventory GPU %s: driverMemoryLimits %v, MIG enabled %v; want not driver-held, in MIG mode", gpu.UUID, gpu.DriverMemoryLimits, gpu.MIG.Enabled)
		}
	}
	url, err := dir.MetricsURL(partitioningMIGNode)
	if err != nil {
		t.Fatal(err)
	}
	m := findSeries(scrapeMetrics(t, url), "tessera_node_agent_gpu_driver_memory_partitioning", map[string]string{"UUID": g.UUID})
	if m == nil || m.GetGauge().GetValue() != 0 {
		t.Errorf("tessera_node_agent_gpu_driver_memory_partitioning of the MIG GPU %s: %v; want 0", g.UUID, m)
	}

	// A ceiling: a MIG instance's memory is fixed, so the scheduler
	// refuses it there, naming the ceiling (not silently dropped).
	apply(t, nodeFillPod(ns, "ceiling", partitioningMIGNode, "nvidia.com/gpu: 1, nvidia.com/gpumem: 4000, nvidia.com/gpumem-ceiling: 6000"))
	var msg string
	testenv.WaitFor(t, "the ceiling pod's scheduling failure naming the ceiling", time.Minute, func() bool {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "ceiling", metav1.GetOptions{})
		if err != nil {
			return false
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("the ceiling pod was bound to %s; want it refused on the MIG GPU", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				msg = c.Message
			}
		}
		return strings.Contains(msg, "memory ceiling (6000 MiB) cannot be granted")
	})
	t.Logf("the ceiling pod: %s", msg)
}
