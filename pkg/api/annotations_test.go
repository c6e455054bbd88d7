package api

import (
	"reflect"
	"strings"
	"testing"
)

func TestAliases(t *testing.T) {
	want := map[string]string{
		AnnotationUseGPUType:   "nvidia.com/use-gputype",
		AnnotationNoUseGPUType: "nvidia.com/nouse-gputype",
		AnnotationUseGPUUUID:   "nvidia.com/use-gpuuuid",
		AnnotationNoUseGPUUUID: "nvidia.com/nouse-gpuuuid",
		AnnotationNodePolicy:   "hami.io/node-scheduler-policy",
		AnnotationGPUPolicy:    "hami.io/gpu-scheduler-policy",
		AnnotationNUMABind:     "nvidia.com/numa-bind",
	}
	keys := PodSelectorAnnotations()
	if len(keys) != len(want) {
		t.Fatalf("PodSelectorAnnotations() = %v", keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "tessera.io/") {
			t.Errorf("key %q is not under tessera.io/", k)
		}
		if got := AliasesOf(k); !reflect.DeepEqual(got, []string{want[k]}) {
			t.Errorf("AliasesOf(%q) = %v, want [%s]", k, got, want[k])
		}
	}
	if AliasesOf(AnnotationInventory) != nil {
		t.Error("the inventory annotation has no alias")
	}
	// AliasesOf returns a copy.
	AliasesOf(AnnotationNUMABind)[0] = "x"
	if AliasesOf(AnnotationNUMABind)[0] != "nvidia.com/numa-bind" {
		t.Error("AliasesOf shares its table")
	}
}

func TestParsePodSelectors(t *testing.T) {
	tests := []struct {
		name string
		ann  map[string]string
		want PodSelectors
	}{
		{"nil", nil, PodSelectors{}},
		{"lists", map[string]string{
			AnnotationUseGPUType:   " A100, ,H100,a100,A100 ",
			AnnotationNoUseGPUType: "V100",
			AnnotationUseGPUUUID:   "GPU-a,GPU-b,GPU-a,gpu-a",
			AnnotationNoUseGPUUUID: "GPU-c",
		}, PodSelectors{
			IncludeModels: []string{"A100", "H100"},
			ExcludeModels: []string{"V100"},
			IncludeUUIDs:  []string{"GPU-a", "GPU-b", "gpu-a"},
			ExcludeUUIDs:  []string{"GPU-c"},
		}},
		{"HAMi aliases", map[string]string{
			"nvidia.com/use-gputype":        "A100",
			"nvidia.com/nouse-gputype":      "T4",
			"nvidia.com/use-gpuuuid":        "GPU-a",
			"nvidia.com/nouse-gpuuuid":      "GPU-b",
			"hami.io/node-scheduler-policy": "spread",
			"hami.io/gpu-scheduler-policy":  "topology-aware",
			"nvidia.com/numa-bind":          "true",
		}, PodSelectors{
			IncludeModels: []string{"A100"}, ExcludeModels: []string{"T4"},
			IncludeUUIDs: []string{"GPU-a"}, ExcludeUUIDs: []string{"GPU-b"},
			NodePolicy: NodeSpread, GPUPolicy: GPUTopologyAware, NUMABind: true,
		}},
		{"key and alias agree", map[string]string{
			AnnotationNodePolicy: "binpack", "hami.io/node-scheduler-policy": " binpack",
		}, PodSelectors{NodePolicy: NodeBinpack}},
		{"blank alias ignored", map[string]string{
			AnnotationGPUPolicy: "spread", "hami.io/gpu-scheduler-policy": " ",
		}, PodSelectors{GPUPolicy: GPUSpread}},
		{"only separators", map[string]string{AnnotationUseGPUType: " , ,"}, PodSelectors{}},
		{"numa 1", map[string]string{AnnotationNUMABind: "1"}, PodSelectors{NUMABind: true}},
		{"numa TRUE", map[string]string{AnnotationNUMABind: "TRUE"}, PodSelectors{NUMABind: true}},
		{"numa False", map[string]string{AnnotationNUMABind: "False"}, PodSelectors{}},
		{"numa 0", map[string]string{AnnotationNUMABind: "0"}, PodSelectors{}},
		{"unrelated", map[string]string{"example.com/x": "y"}, PodSelectors{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePodSelectors(tt.ann)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParsePodSelectorsErrors(t *testing.T) {
	tests := []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"conflicting alias", map[string]string{AnnotationUseGPUType: "A100", "nvidia.com/use-gputype": "H100"},
			`annotations tessera.io/use-gputype="A100" and nvidia.com/use-gputype="H100" disagree; set only one`},
		{"conflicting policy alias", map[string]string{AnnotationGPUPolicy: "spread", "hami.io/gpu-scheduler-policy": "binpack"},
			`annotations tessera.io/gpu-policy="spread" and hami.io/gpu-scheduler-policy="binpack" disagree; set only one`},
		{"unknown node policy", map[string]string{"hami.io/node-scheduler-policy": "random"},
			`annotation hami.io/node-scheduler-policy: node policy "random" is not one of "binpack" or "spread"`},
		{"unknown GPU policy", map[string]string{AnnotationGPUPolicy: "Binpack"},
			`annotation tessera.io/gpu-policy: GPU policy "Binpack" is not one of "binpack", "spread" or "topology-aware"`},
		{"bad numa bind", map[string]string{AnnotationNUMABind: "yes"},
			`annotation tessera.io/numa-bind: "yes" is not a boolean (use "true" or "false")`},
		{"model in and out", map[string]string{AnnotationUseGPUType: "A100,H100", "nvidia.com/nouse-gputype": "h100"},
			`GPU model "H100" is both selected (tessera.io/use-gputype) and excluded (tessera.io/nouse-gputype)`},
		{"uuid in and out", map[string]string{AnnotationUseGPUUUID: "GPU-a", AnnotationNoUseGPUUUID: "GPU-b,GPU-a"},
			`GPU UUID "GPU-a" is both selected (tessera.io/use-gpuuuid) and excluded (tessera.io/nouse-gpuuuid)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePodSelectors(tt.ann)
			if err == nil {
				t.Fatalf("got %+v, want error %q", got, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %q\nwant %q", err, tt.want)
			}
		})
	}
}
