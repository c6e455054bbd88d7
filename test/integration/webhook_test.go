//go:build integration

package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestWebhook covers every rejection on the API server's answer, the
// fractional form, and what happens while the webhook is down.
func TestWebhook(t *testing.T) {
	e := newEnv(t)
	e.addNodes("a100", 1, 2, "NVIDIA A100-SXM4-40GB", 40960)
	e.addNodes("h100", 1, 2, "NVIDIA H100 80GB HBM3", 81920)
	// The webhook learns inventories from its informer.
	testenv.WaitFor(t, "webhook to see the H100 inventory", 30*time.Second, func() bool {
		_, err := e.cp.Client.CoreV1().Pods(gpuNS).Create(context.Background(), fixtures.MakePod().Namespace(gpuNS).Name("big").Container("main", map[string]string{names.Memory: "81920"}).Obj(),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})
	yes := true
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{"cores above 100", fixtures.MakePod().Namespace(gpuNS).Name("c1").Container("main", map[string]string{names.Cores: "101"}).Obj(),
			[]string{"denied the request", "spec.containers[0].resources.limits[nvidia.com/gpucores]", "101", "between 0 and 100"}},
		{"cores below 0", fixtures.MakePod().Namespace(gpuNS).Name("c2").Container("main", map[string]string{names.Cores: "-5"}).Obj(),
			[]string{"nvidia.com/gpucores", "-5", "negative"}},
		{"percentage above 100", fixtures.MakePod().Namespace(gpuNS).Name("c3").Container("main", map[string]string{names.MemoryPercentage: "101"}).Obj(),
			[]string{"limits[nvidia.com/gpumem-percentage]", "101", "between 0 and 100"}},
		{"memory in MiB and percent", fixtures.MakePod().Namespace(gpuNS).Name("c4").Container("main", map[string]string{names.Memory: "1024", names.MemoryPercentage: "10"}).Obj(),
			[]string{"nvidia.com/gpumem-percentage", "10", "nvidia.com/gpumem=1024"}},
		{"memory above the largest GPU", fixtures.MakePod().Namespace(gpuNS).Name("c5").Container("main", map[string]string{names.Memory: "90000"}).Obj(),
			[]string{"limits[nvidia.com/gpumem]", "90000", "largest GPU in the cluster (81920 MiB)"}},
		{"requests unequal to limits", func() *corev1.Pod {
			p := fixtures.MakePod().Namespace(gpuNS).Name("c6").Container("main", map[string]string{names.Memory: "2048"}).Obj()
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceName(names.Memory): resource.MustParse("1024")}
			return p
		}(), []string{"requests[nvidia.com/gpumem]", "1024", "limit 2048"}},
		{"model included and excluded", func() *corev1.Pod {
			p := fixtures.MakePod().Namespace(gpuNS).Name("c7").Container("main", map[string]string{names.GPU: "1"}).Obj()
			p.Annotations = map[string]string{"nvidia.com/use-gputype": "A100", "nvidia.com/nouse-gputype": "a100"}
			return p
		}(), []string{"metadata.annotations", "A100", "excluded"}},
		{"privileged container", func() *corev1.Pod {
			p := fixtures.MakePod().Namespace(gpuNS).Name("c8").Container("main", map[string]string{names.Memory: "1024"}).Obj()
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &yes}
			return p
		}(), []string{"spec.containers[0].securityContext.privileged", "GPU share cannot be enforced"}},
		{"node name preset", func() *corev1.Pod {
			p := fixtures.MakePod().Namespace(gpuNS).Name("c9").Container("main", map[string]string{names.GPU: "1"}).Obj()
			p.Spec.NodeName = "a100-00"
			return p
		}(), []string{"spec.nodeName", "a100-00", api.SchedulerName}},
		{"fraction above one", fixtures.MakePod().Namespace(gpuNS).Name("c10").Container("main", map[string]string{names.GPU: "1.5"}).Obj(),
			[]string{"nvidia.com/gpu", "1500m", "below 1"}},
		{"init container", func() *corev1.Pod {
			return fixtures.MakePod().Namespace(gpuNS).Name("c11").InitContainer("init", map[string]string{names.Cores: "300"}).
				Container("main", map[string]string{names.GPU: "1"}).Obj()
		}(), []string{"spec.initContainers[0].resources.limits[nvidia.com/gpucores]", "300"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.create(tc.pod)
			expectDenied(t, err, tc.want...)
		})
	}

	t.Run("fraction and defaults", func(t *testing.T) {
		p, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name("half").Container("main", map[string]string{names.GPU: "0.5"}).Obj())
		if err != nil {
			t.Fatalf("fractional GPU refused: %v", err)
		}
		lim := p.Spec.Containers[0].Resources.Limits
		if p.Spec.SchedulerName != api.SchedulerName || qv(lim, names.GPU) != 1 || qv(lim, names.MemoryPercentage) != 50 || qv(lim, names.Cores) != 50 {
			t.Errorf("admitted as scheduler %q limits %v", p.Spec.SchedulerName, lim)
		}
		p, err = e.create(fixtures.MakePod().Namespace(gpuNS).Name("memonly").Container("main", map[string]string{names.Memory: "4096"}).Obj())
		if err != nil {
			t.Fatal(err)
		}
		if lim := p.Spec.Containers[0].Resources.Limits; qv(lim, names.GPU) != 1 {
			t.Errorf("gpumem alone did not default to 1 GPU: %v", lim)
		}
		p, err = e.create(fixtures.MakePod().Namespace(gpuNS).Name("whole").Container("main", map[string]string{names.GPU: "1"}).Obj())
		if err != nil {
			t.Fatal(err)
		}
		if lim := p.Spec.Containers[0].Resources.Limits; qv(lim, names.MemoryPercentage) != 100 {
			t.Errorf("GPU count alone did not default to the whole memory: %v", lim)
		}
	})

	t.Run("webhook down", func(t *testing.T) {
		e.stopWebhook()
		_, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name("while-down").Container("main", map[string]string{names.Memory: "1024"}).Obj())
		if err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			t.Errorf("GPU pod admitted while the webhook is down: %v", err)
		}
		_, err = e.create(fixtures.MakePod().Namespace(gpuNS).Name("half-down").Container("main", map[string]string{names.GPU: "0.5"}).Obj())
		if err == nil {
			t.Errorf("fractional GPU pod admitted while the webhook is down")
		}
		if _, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name("cpu-only").Container("c", map[string]string{"cpu": "100m"}).Obj()); err != nil {
			t.Errorf("pod without GPUs blocked by the stopped webhook: %v", err)
		}
		sys := fixtures.MakePod().Namespace("kube-system").Name("sys").Container("c", map[string]string{names.GPU: "1"}).Obj()
		if _, err := e.cp.Client.CoreV1().Pods("kube-system").Create(context.Background(), sys, metav1.CreateOptions{}); err != nil {
			t.Errorf("kube-system pod blocked by the stopped webhook: %v", err)
		}
	})
}

func qv(l corev1.ResourceList, name string) int64 {
	q := l[corev1.ResourceName(name)]
	return q.Value()
}
