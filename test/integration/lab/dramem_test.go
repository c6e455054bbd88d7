//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ceilingClaimPod is a pod on node whose one container uses a claim
// (from its template) guaranteed 4Gi of GPU memory with a GPUConfig
// ceiling of 6144 MiB, filling in 512 MiB steps and holding what it got.
func ceilingClaimPod(ns, name, node string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.tessera.io, capacity: {requests: {memory: 4Gi}}}
      config:
      - requests: [gpu]
        opaque:
          driver: gpu.tessera.io
          parameters: {apiVersion: gpu.tessera.io/v1alpha1, kind: GPUConfig, memoryCeilingMiB: 6144}
---
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %[3]s}
  tolerations: [{key: %[4]s, operator: Exists}]
  resourceClaims: [{name: gpu, resourceClaimTemplateName: %[1]s}]
  containers:
  - name: main
    image: tessera-lab/cuda
    command: [sh, -c, 'echo "confirmation: $(cat /etc/tessera/driver-memory 2>&1 | grep -c ^device=)"; exec gpu-fill --step 512 --hold forever']
    resources: {claims: [{name: gpu}]}
`, name, ns, node, partitioningKey)
}

// claimGPU is the UUID of the one GPU the pod's container sees.
func claimGPU(t *testing.T, node, ns, pod string) string {
	t.Helper()
	c, err := dir.Node(node).Container(ns, pod, "main")
	if err != nil {
		t.Fatal(err)
	}
	if v := c.Env[api.EnvVisibleDevices]; v != "" && !strings.Contains(v, ",") {
		return v
	}
	t.Fatalf("container %s/%s: no single GPU in its environment %v", ns, pod, c.Env)
	return ""
}

// TestDRAMemoryCeiling: a DRA claim's memory capacity is the guarantee
// and its GPUConfig's memoryCeilingMiB the ceiling. On a DRA node whose
// driver partitions GPU memory, the claim's one container gets soft 4096
// and hard 6144 MiB on its own group from the hook in the claim's CDI
// device, sees the ceiling as its total and is refused there (the
// limiter's 4096 MiB limit off); once the pod is deleted nothing is left
// in the driver's table. On a DRA node whose driver does not, the
// limiter lets it burst past its guarantee to the ceiling from the GPU's
// budget.
func TestDRAMemoryCeiling(t *testing.T) {
	const ns = "dra-memory"
	useNamespace(t, ns)
	apply(t, ceilingClaimPod(ns, "burst", partitioningDRANode))
	out := logsContain(t, ns, "burst", "holding")
	t.Logf("kubectl logs burst:\n%s", out)
	if !strings.Contains(out, "confirmation: 1") || !strings.Contains(out, "cuMemGetInfo: total 6144 MiB") ||
		!strings.Contains(out, "refused at 6144 MiB") || lastInTotal(out) != 6144 {
		t.Errorf("the driver-limited claim: want its confirmation, the ceiling (6144 MiB) as its total, and the whole ceiling before it is refused there")
	}
	c, err := dir.Node(partitioningDRANode).Container(ns, "burst", "main")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(c.CDIDevices, func(d string) bool { return strings.HasPrefix(d, "gpu.tessera.io/claim=") }) || len(c.Hooks) == 0 {
		t.Errorf("the container's CDI devices %v, hooks %+v: want the claim's device with the memory-limits hook", c.CDIDevices, c.Hooks)
	}
	gpu := claimGPU(t, partitioningDRANode, ns, "burst")
	table := driverTable(t, partitioningDRANode, gpu)
	if len(table) != 1 || table[0].Soft != 4096<<20 || table[0].Hard != 6144<<20 || !strings.HasSuffix(table[0].Path, c.ID) || table[0].Crossings == 0 {
		t.Fatalf("the driver's table: %+v; want one entry, soft 4096 MiB, hard 6144 MiB, on the container's own group (…/%s), its soft limit crossed", table, c.ID)
	}

	t.Run("old driver", func(t *testing.T) {
		apply(t, ceilingClaimPod(ns, "limiter", draNode))
		out := logsContain(t, ns, "limiter", "holding")
		t.Logf("kubectl logs limiter:\n%s", out)
		// 512 MiB steps past the 4096 MiB guarantee, up to the ceiling
		// less the limiter's context charge.
		if got := lastInTotal(out); !strings.Contains(out, "confirmation: 0") || !strings.Contains(out, "cuMemGetInfo: total 6144 MiB") || got <= 4096 || got > 6144 {
			t.Errorf("a claim on a DRA node whose driver does not partition memory: want no confirmation, its 6144 MiB ceiling as its total, and more than its 4096 MiB guarantee held (got %d MiB)", got)
		}
		c, err := dir.Node(draNode).Container(ns, "limiter", "main")
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Hooks) != 0 {
			t.Errorf("the container on the old driver got hooks %+v; want none", c.Hooks)
		}
		if l := driverTable(t, draNode, claimGPU(t, draNode, ns, "limiter")); len(l) != 0 {
			t.Errorf("the old driver's table: %+v", l)
		}
	})

	zero := int64(0)
	if err := client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the container's group removed", 2*time.Minute, func() bool {
		_, err := os.Stat(table[0].Path)
		return os.IsNotExist(err)
	})
	testenv.WaitFor(t, "the driver's table empty", time.Minute, func() bool {
		return len(driverTable(t, partitioningDRANode, gpu)) == 0
	})
}
