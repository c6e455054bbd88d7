package api

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
)

// seedMutations returns the golden file and variants that reach the
// validation and strictness paths.
func seedMutations(t interface{ Fatal(...any) }, path string, replacements [][2]string) [][]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seeds := [][]byte{data, nil, []byte("{}"), []byte("null"), append(bytes.Clone(data), " {}"...)}
	for _, r := range replacements {
		seeds = append(seeds, bytes.Replace(data, []byte(r[0]), []byte(r[1]), 1))
	}
	return seeds
}

func FuzzDecodeInventory(f *testing.F) {
	for _, s := range seedMutations(f, inventoryGolden, [][2]string{
		{`"maxShares":10`, `"maxShares":0`},
		{`"tessera.io/v1"`, `"tessera.io/v2"`},
		{`"nvlinks":12`, `"nvlinks":12,"extra":1`},
		{`"index":1,`, `"index":0,`},
		{`"memoryOvercommit":1`, `"memoryOvercommit":1e309`},
		{`"healthReason":"XID 79"`, `"healthReason":"\u0000\ud800"`},
		{`"numaNode":0`, `"numaNode":-1`},
		{`"links":[`, `"links":[],"x":[`},
	}) {
		f.Add(s)
	}
	for _, s := range seedMutations(f, inventoryV2Golden, [][2]string{
		{`"start":4`, `"start":9`},
		{`"mode":"device-plugin"`, `"mode":"dra"`},
		{`"tessera.io/v2"`, `"tessera.io/v1"`},
		{`"sharing":"mps"`, `"sharing":"mig"`},
	}) {
		f.Add(s)
	}
	// A small valid inventory: mutations of it are cheap to minimise.
	small := goldenInventory()
	small.GPUs = small.GPUs[:2]
	small.GPUs[0].Links = small.GPUs[0].Links[:1]
	small.GPUs[1].Links = nil
	if data, err := EncodeInventory(small); err == nil {
		f.Add(data)
	} else {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		inv, err := DecodeInventory(data)
		if err != nil {
			return
		}
		assertInventoryRoundTrip(t, inv)
	})
}

func FuzzDecodeAllocation(f *testing.F) {
	for _, s := range seedMutations(f, allocationGolden, [][2]string{
		{`"cores":10`, `"cores":101`},
		{`"exclusive":true`, `"exclusive":false`},
		{`"init":true`, `"init":false`},
		{`"name":"metrics"`, `"name":"trainer"`},
		{`"PodGPUAllocation"`, `"podgpuallocation"`},
		{`"node":"gpu-node-01"`, `"NODE":"gpu-node-01"`},
		{`"devices":[`, `"devices":[],"d":[`},
	}) {
		f.Add(s)
	}
	for _, s := range seedMutations(f, allocationV2Golden, [][2]string{
		{`"start":6`, `"start":8`},
		{`"podUID":"6f1d0c2e-3b7a-4c55-9a0e-2f8b1d7c9e01",`, ``},
		{`"tessera.io/v2"`, `"tessera.io/v1"`},
	}) {
		f.Add(s)
	}
	f.Add([]byte(`{"apiVersion":"tessera.io/v1","kind":"PodGPUAllocation","node":"n","containers":[{"name":"c","devices":[{"uuid":"GPU-a","memoryMiB":1,"cores":0}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := DecodeAllocation(data)
		if err != nil {
			return
		}
		assertAllocationRoundTrip(t, a)
	})
}

func FuzzParsePodSelectors(f *testing.F) {
	f.Add("A100,H100", "V100", "GPU-a", "GPU-b", "binpack", "topology-aware", "true", "nvidia.com/use-gputype", "a100")
	f.Add("", "", "", "", "", "", "", "hami.io/gpu-scheduler-policy", "spread")
	f.Add(" , ", "a,A", "x,x", "y", "spread", "Binpack", "1", "nvidia.com/numa-bind", "0")
	f.Fuzz(func(t *testing.T, useType, noUseType, useUUID, noUseUUID, nodePolicy, gpuPolicy, numa, aliasKey, aliasValue string) {
		ann := map[string]string{
			AnnotationUseGPUType:   useType,
			AnnotationNoUseGPUType: noUseType,
			AnnotationUseGPUUUID:   useUUID,
			AnnotationNoUseGPUUUID: noUseUUID,
			AnnotationNodePolicy:   nodePolicy,
			AnnotationGPUPolicy:    gpuPolicy,
			AnnotationNUMABind:     numa,
			aliasKey:               aliasValue,
		}
		s, err := ParsePodSelectors(ann)
		if err != nil {
			return
		}
		for _, list := range [][]string{s.IncludeModels, s.ExcludeModels, s.IncludeUUIDs, s.ExcludeUUIDs} {
			for _, e := range list {
				if e == "" || e != strings.TrimSpace(e) || strings.Contains(e, ",") {
					t.Errorf("list entry %q is not a trimmed non-empty item", e)
				}
			}
		}
		if s.NodePolicy != "" && !s.NodePolicy.Valid() || s.GPUPolicy != "" && !s.GPUPolicy.Valid() {
			t.Errorf("invalid policy accepted: %+v", s)
		}
		// Parsing is a function of the annotations: the same input gives the same result.
		again, err := ParsePodSelectors(ann)
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Errorf("second parse differs: %+v, %v", again, err)
		}
	})
}

func FuzzModelMatches(f *testing.F) {
	f.Add("A100", "NVIDIA A100-SXM4-40GB")
	f.Add("A10", "NVIDIA A100-SXM4-40GB")
	f.Add(" ", "")
	f.Add("\u00a0x\u00a0", "Ｘ")
	f.Add("K", "\u212a")
	f.Add("\u212a", "k")
	f.Fuzz(func(t *testing.T, selector, model string) {
		got := ModelMatches(selector, model)
		trimmed := strings.TrimSpace(selector)
		// An empty selector selects nothing.
		if trimmed == "" && got {
			t.Errorf("blank selector %q matched %q", selector, model)
		}
		// A model selects itself.
		if strings.TrimSpace(model) != "" && !ModelMatches(model, model) {
			t.Errorf("ModelMatches(%q, itself) = false", model)
		}
		// Surrounding whitespace of the selector does not matter.
		if got != ModelMatches(trimmed, model) {
			t.Errorf("ModelMatches(%q, %q) differs from the trimmed selector", selector, model)
		}
		// A match survives adding words around the model.
		if got && !ModelMatches(selector, "NVIDIA "+model+" GPU") {
			t.Errorf("ModelMatches(%q, %q) but not with words around the model", selector, model)
		}
	})
}
