package podrequest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

// pod is namespace ns, pod p with annotations ann.
func pod(ann map[string]string) *fixtures.PodWrapper {
	p := fixtures.MakePod().Namespace("ns").Name("p")
	for k, v := range ann {
		p.Annotation(k, v)
	}
	return p
}

func TestFromPod(t *testing.T) {
	tests := []struct {
		name       string
		pod        *corev1.Pod
		want       placement.Request
		cpu, memMi int64
	}{
		{
			name: "whole GPU",
			pod:  pod(nil).Container("a", map[string]string{"nvidia.com/gpu": "2"}).Obj(),
			want: placement.Request{Containers: []placement.Container{{Name: "a", GPUs: 2, MemoryPercent: 100}}},
		},
		{
			name: "memory and cores, count defaulted to 1",
			pod:  pod(nil).Container("a", map[string]string{"nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"}).Obj(),
			want: placement.Request{Containers: []placement.Container{{Name: "a", GPUs: 1, MemoryMiB: 10240, Cores: 30}}},
		},
		{
			name: "guarantee and ceiling",
			pod:  pod(nil).Container("a", map[string]string{"nvidia.com/gpumem": "4096", "nvidia.com/gpumem-ceiling": "16384"}).Obj(),
			want: placement.Request{Containers: []placement.Container{{Name: "a", GPUs: 1, MemoryMiB: 4096, CeilingMiB: 16384}}},
		},
		{
			name: "fraction",
			pod:  pod(nil).Container("a", map[string]string{"nvidia.com/gpu": "0.5"}).Obj(),
			want: placement.Request{Containers: []placement.Container{{Name: "a", GPUs: 1, MemoryPercent: 50, Cores: 50}}},
		},
		{
			name: "init, sidecar, multi-container, annotations, cpu",
			pod: pod(map[string]string{"nvidia.com/use-gputype": "A100", "tessera.io/node-policy": "spread"}).
				InitContainer("init", map[string]string{"nvidia.com/gpumem-percentage": "30", "cpu": "4", "memory": "100Mi"}).
				Sidecar("side", map[string]string{"nvidia.com/gpumem": "1000", "cpu": "1", "memory": "1Gi"}).
				Container("a", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "cpu": "500m", "memory": "1Gi"}).
				Container("b", map[string]string{"cpu": "1"}).Obj(),
			want: placement.Request{
				InitContainers: []placement.Container{{Name: "init", GPUs: 1, MemoryPercent: 30}},
				Containers: []placement.Container{
					{Name: "side", GPUs: 1, MemoryMiB: 1000},
					{Name: "a", GPUs: 1, MemoryMiB: 2000},
					{Name: "b"},
				},
				IncludeModels: []string{"A100"},
				NodePolicy:    api.NodeSpread,
			},
			cpu: 4000, memMi: 2048, // the init container runs before the sidecar starts
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromPod(tc.pod, names)
			if err != nil {
				t.Fatal(err)
			}
			tc.want.Pod = "ns/p"
			tc.want.CPUMilli, tc.want.MemoryMiB = tc.cpu, tc.memMi
			if !equalRequest(got, &tc.want) {
				t.Errorf("got %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

func equalRequest(a, b *placement.Request) bool {
	eqC := func(x, y []placement.Container) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	eqS := func(x, y []string) bool { return strings.Join(x, ",") == strings.Join(y, ",") }
	return a.Pod == b.Pod && a.CPUMilli == b.CPUMilli && a.MemoryMiB == b.MemoryMiB &&
		eqC(a.InitContainers, b.InitContainers) && eqC(a.Containers, b.Containers) &&
		eqS(a.IncludeModels, b.IncludeModels) && eqS(a.ExcludeModels, b.ExcludeModels) &&
		eqS(a.IncludeUUIDs, b.IncludeUUIDs) && eqS(a.ExcludeUUIDs, b.ExcludeUUIDs) &&
		a.NUMABind == b.NUMABind && a.NodePolicy == b.NodePolicy && a.GPUPolicy == b.GPUPolicy
}

func TestFromPodErrors(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{"cores above 100", pod(nil).Container("a", map[string]string{"nvidia.com/gpucores": "120"}).Obj(), []string{`"a"`, "120", "100"}},
		{"both memory forms", pod(nil).Container("a", map[string]string{"nvidia.com/gpumem": "100", "nvidia.com/gpumem-percentage": "10"}).Obj(), []string{"100 MiB", "10%"}},
		{"fraction above one", pod(nil).Container("a", map[string]string{"nvidia.com/gpu": "1.5"}).Obj(), []string{"nvidia.com/gpu", "1500m", "below 1"}},
		{"fraction with memory", pod(nil).Container("a", map[string]string{"nvidia.com/gpu": "0.5", "nvidia.com/gpumem": "10"}).Obj(), []string{"fraction"}},
		{"fractional memory", pod(nil).Container("a", map[string]string{"nvidia.com/gpumem": "0.5"}).Obj(), []string{"nvidia.com/gpumem", "whole number"}},
		{"ceiling below the guarantee", pod(nil).Container("a", map[string]string{"nvidia.com/gpumem": "8192", "nvidia.com/gpumem-ceiling": "4096"}).Obj(), []string{`"a"`, "nvidia.com/gpumem-ceiling", "4096", "8192 MiB"}},
		{"model in and out", pod(map[string]string{"nvidia.com/use-gputype": "A100", "nvidia.com/nouse-gputype": "a100"}).Container("a", map[string]string{"nvidia.com/gpu": "1"}).Obj(), []string{"A100", "excluded"}},
		{"bad policy", pod(map[string]string{"tessera.io/node-policy": "random"}).Container("a", map[string]string{"nvidia.com/gpu": "1"}).Obj(), []string{"random"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromPod(tc.pod, names)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestPrefix(t *testing.T) {
	n := api.MustResourceNames("tessera.io")
	p := pod(nil).Container("a", map[string]string{"tessera.io/gpumem": "100", "nvidia.com/gpu": "3"}).Obj()
	if !kubeobj.RequestsGPU(p, n) || kubeobj.RequestsGPU(pod(nil).Container("a", map[string]string{"cpu": "1"}).Obj(), n) {
		t.Fatal("RequestsGPU")
	}
	r, err := FromPod(p, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Containers[0]; got.GPUs != 1 || got.MemoryMiB != 100 {
		t.Errorf("got %+v, want 1 GPU of 100 MiB (nvidia.com/gpu ignored under tessera.io)", got)
	}
}
