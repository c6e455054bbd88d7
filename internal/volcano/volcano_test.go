package volcano

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	gpuA = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
	gpuB = "GPU-1fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
)

func container(name string, limits map[string]string) corev1.Container {
	c := corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}
	for k, v := range limits {
		c.Resources.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return c
}

func podOf(ann map[string]string, cs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u", Annotations: ann}, Spec: corev1.PodSpec{Containers: cs}}
}

// TestDecodePodDevices reads what Volcano's scheduler writes (its encoder:
// "<uuid>,NVIDIA,<mem>,<cores>:" per device, ";" between containers) and
// refuses what it would misread.
func TestDecodePodDevices(t *testing.T) {
	// Volcano's annotation for its several-containers example.
	s := gpuA + ",NVIDIA,2000,0:" + gpuB + ",NVIDIA,2000,0:;" + gpuA + ",NVIDIA,3000,30:" + gpuB + ",NVIDIA,3000,30:"
	pd, err := DecodePodDevices(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(pd) != 2 || len(pd[0]) != 2 || pd[1][1] != (Device{UUID: gpuB, Type: "NVIDIA", MemoryMiB: 3000, Cores: 30}) {
		t.Errorf("decoded %+v", pd)
	}
	if EncodePodDevices(pd) != s {
		t.Errorf("re-encoded %q, want %q", EncodePodDevices(pd), s)
	}
	for _, bad := range []struct{ in, want string }{
		{"", "empty"},
		{gpuA + ",NVIDIA,2000:", "3 fields"},
		{gpuA + ",NVIDIA,-1,0:", "memory \"-1\""},
		{gpuA + ",NVIDIA,2000,101:", "cores \"101\""},
		{gpuA + ",NVIDIA,99999999999999999999,0:", "memory"},
		{"nvidia0,NVIDIA,2000,0:", "not a GPU UUID"},
		{gpuA + "[group2],NVIDIA,20480,0:", "not a MIG position"},
		{gpuA + "[group-2-3],NVIDIA,20480,0:", "not a MIG position"},
		{gpuA + "[group2-3]x,NVIDIA,20480,0:", "not a MIG position"},
		{gpuA + "]group2-3[,NVIDIA,20480,0:", "not a MIG position"},
		{gpuA + "[group2--1],NVIDIA,20480,0:", "not a MIG position"},
		{strings.Repeat(gpuA+",NVIDIA,1,0:", 2000), "more than"},
	} {
		if _, err := DecodePodDevices(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%.60q: %v, want an error mentioning %q", bad.in, err, bad.want)
		}
	}
}

// TestAsks reads pods as Volcano's ExtractResourceRequest does: app
// containers naming vgpu-number or vgpu-memory only; memory-only is one
// GPU; no memory is all of it; a percentage wins over MiB.
func TestAsks(t *testing.T) {
	p := podOf(nil,
		container("count-mem", map[string]string{api.VolcanoVGPUNumber: "2", api.VolcanoVGPUMemory: "3000", api.VolcanoVGPUCores: "50"}),
		container("none", nil),
		container("mem-only", map[string]string{api.VolcanoVGPUMemory: "1024"}),
		container("count-only", map[string]string{api.VolcanoVGPUNumber: "1"}),
		container("percent", map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemoryPercentage: "25", api.VolcanoVGPUMemory: "999"}),
		container("cores-only", map[string]string{api.VolcanoVGPUCores: "30"}),
	)
	p.Spec.InitContainers = []corev1.Container{container("init", map[string]string{api.VolcanoVGPUNumber: "1"})}
	asks, err := Asks(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Ask{
		{Container: "count-mem", GPUs: 2, MemoryMiB: 3000, Cores: 50},
		{Container: "mem-only", GPUs: 1, MemoryMiB: 1024},
		{Container: "count-only", GPUs: 1, Percent: true, MemoryPercent: 100},
		{Container: "percent", GPUs: 1, Percent: true, MemoryPercent: 25},
	}
	if len(asks) != len(want) {
		t.Fatalf("asks %+v, want %+v", asks, want)
	}
	for i := range want {
		if asks[i] != want[i] {
			t.Errorf("ask %d: %+v, want %+v", i, asks[i], want[i])
		}
	}
	if got := want[3].MemoryOn(40960); got != 10240 {
		t.Errorf("25 percent of 40960 MiB: %d", got)
	}
	if got := want[2].MemoryOn(40537); got != 40537 {
		t.Errorf("the whole of 40537 MiB: %d", got)
	}
	if _, err := Asks(podOf(nil, container("c", map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: "-5"}))); err == nil {
		t.Error("a negative memory was accepted")
	}
}

// TestMatch: the annotations must grant each vGPU container exactly its
// ask, on distinct GPUs of the node.
func TestMatch(t *testing.T) {
	mem := func(u string) (GPUInfo, bool) { return GPUInfo{MemoryMiB: 40960}, u == gpuA || u == gpuB }
	ask := container("c", map[string]string{api.VolcanoVGPUNumber: "2", api.VolcanoVGPUMemoryPercentage: "50", api.VolcanoVGPUCores: "20"})
	for _, tc := range []struct {
		name, ids, want string
	}{
		{"exact", gpuA + ",NVIDIA,20480,20:" + gpuB + ",NVIDIA,20480,20:", ""},
		{"memory", gpuA + ",NVIDIA,20481,20:" + gpuB + ",NVIDIA,20480,20:", "granted 20481 MiB, the container asks for 50 percent of its memory (20480 MiB)"},
		{"cores", gpuA + ",NVIDIA,20480,20:" + gpuB + ",NVIDIA,20480,100:", "granted 100 percent of the cores"},
		{"one GPU", gpuA + ",NVIDIA,20480,20:", "asks for 2 GPUs"},
		{"twice", gpuA + ",NVIDIA,20480,20:" + gpuA + ",NVIDIA,20480,20:", "twice"},
		{"type", gpuA + ",MLU,20480,20:" + gpuB + ",NVIDIA,20480,20:", "device type \"MLU\""},
		{"elsewhere", gpuA + ",NVIDIA,20480,20:GPU-ffffffff-0000-0000-0000-000000000000,NVIDIA,20480,20:", "not a GPU of this node"},
		{"extra container", gpuA + ",NVIDIA,20480,20:" + gpuB + ",NVIDIA,20480,20:;" + gpuA + ",NVIDIA,1,0:", "2 container entries, the pod has 1"},
		{"MIG on hami-core", gpuA + "[group1-0],NVIDIA,20480,20:" + gpuB + ",NVIDIA,20480,20:", "names a MIG position of Volcano's mig mode; GPU " + gpuA + " is registered in mode hami-core"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := podOf(map[string]string{api.AnnotationVolcanoNode: "n", api.AnnotationVolcanoIDs: tc.ids}, ask)
			err := Match(p, mem, nil)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				rec, err := Record(p, nil)
				if err != nil || rec.Node != "n" || rec.PodUID != "u" || len(rec.Containers) != 1 || rec.Containers[0].Devices[1] != (api.DeviceGrant{UUID: gpuB, MemoryMiB: 20480, Cores: 20}) {
					t.Errorf("record %+v, %v", rec, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestEncodeRegister writes the node annotation Volcano's scheduler reads
// (six fields per GPU, ":" after each); characters that would split a
// model name are replaced.
func TestEncodeRegister(t *testing.T) {
	got := EncodeRegister([]RegisteredGPU{
		{UUID: gpuA, Split: 10, MemoryMiB: 40960, Model: "NVIDIA A100-SXM4-40GB", Healthy: true, Mode: api.VolcanoModeHAMiCore},
		{UUID: gpuB, Split: 4, MemoryMiB: 81920, Model: "odd,name:x", Healthy: false, Mode: api.VolcanoModeHAMiCore},
	})
	want := gpuA + ",10,40960,NVIDIA-NVIDIA A100-SXM4-40GB,true,hami-core:" + gpuB + ",4,81920,NVIDIA-odd name x,false,hami-core:"
	if got != want {
		t.Errorf("\n%s\nwant\n%s", got, want)
	}
	for _, e := range strings.Split(strings.TrimSuffix(got, ":"), ":") {
		if n := len(strings.Split(e, ",")); n != 6 {
			t.Errorf("entry %q has %d fields", e, n)
		}
	}
}
