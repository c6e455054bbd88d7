package api

import (
	"fmt"
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

// TestSelectorLimits: a placement annotation is hostile input read by the
// webhook and by every scheduling cycle. The 240 KB nouse-gputype of the
// trust issue (finding 8) took 9 s to admit (quadratic de-duplication); it
// is now refused by its size, and lists within the limits are parsed in
// linear time (BenchmarkParseSelectors).
func TestSelectorLimits(t *testing.T) {
	var huge strings.Builder
	for i := 0; huge.Len() < 240<<10; i++ {
		fmt.Fprintf(&huge, "model-%d,", i)
	}
	for _, key := range []string{AnnotationNoUseGPUType, "nvidia.com/nouse-gputype", AnnotationUseGPUUUID} {
		_, err := ParsePodSelectors(map[string]string{key: huge.String()})
		if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "more than the limit of 16384") {
			t.Errorf("%s of %d bytes: err = %v, want the size limit named", key, huge.Len(), err)
		}
	}
	// Within the size limit, more distinct entries than MaxSelectorEntries.
	var many []string
	for i := 0; i <= MaxSelectorEntries; i++ {
		many = append(many, fmt.Sprintf("m%d", i))
	}
	if _, err := ParsePodSelectors(map[string]string{AnnotationUseGPUType: strings.Join(many, ",")}); err == nil || !strings.Contains(err.Error(), "more than 512 distinct entries") {
		t.Errorf("%d entries: err = %v", len(many), err)
	}
	// Exactly the limit, with duplicates that fold together: accepted.
	dups := append(append([]string(nil), many[:MaxSelectorEntries]...), "M0", "m1", " m2 ")
	s, err := ParsePodSelectors(map[string]string{AnnotationUseGPUType: strings.Join(dups, ",")})
	if err != nil || len(s.IncludeModels) != MaxSelectorEntries {
		t.Errorf("%d entries with duplicates: %d kept, err %v", len(dups), len(s.IncludeModels), err)
	}
}

// TestFoldKeyIsEqualFold: de-duplication by key agrees with
// strings.EqualFold, Unicode folding (the Kelvin sign) included.
func TestFoldKeyIsEqualFold(t *testing.T) {
	words := []string{"a100", "A100", "\u212a80", "k80", "K80", "ß", "ẞ", "σς", "ΣΣ", "\xff", "\xfe", "Ǆ", "ǆ", "ǅ", ""}
	for _, a := range words {
		for _, b := range words {
			if got, want := foldKey(a) == foldKey(b), strings.EqualFold(a, b); got != want {
				t.Errorf("%q %q: same key %v, EqualFold %v", a, b, got, want)
			}
		}
	}
}

func BenchmarkParseSelectors(b *testing.B) {
	var list []string
	for i := 0; i < MaxSelectorEntries; i++ {
		list = append(list, fmt.Sprintf("NVIDIA-model-%04d", i))
	}
	ann := map[string]string{AnnotationNoUseGPUType: strings.Join(list, ",")}
	for b.Loop() {
		if _, err := ParsePodSelectors(ann); err != nil {
			b.Fatal(err)
		}
	}
}
