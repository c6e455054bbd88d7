package api

import (
	"strings"
	"testing"
)

func TestDecodeGPUConfig(t *testing.T) {
	c, err := DecodeGPUConfig([]byte(`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","elastic":true,"contextReserveMiB":0}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Elastic == nil || !*c.Elastic || c.ContextReserveMiB == nil || *c.ContextReserveMiB != 0 {
		t.Errorf("got %+v", c)
	}
	// A config written before memoryCeilingMiB existed decodes as it did.
	if c, err := DecodeGPUConfig([]byte(`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig"}`)); err != nil || c.Elastic != nil || c.ContextReserveMiB != nil || c.MemoryCeilingMiB != nil {
		t.Errorf("empty config: %+v, %v", c, err)
	}
	bad := []struct{ in, want string }{
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","elastic":"yes"}`, `parameters.elastic: string is not a bool`},
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memory":"1Gi"}`, `parameters: unknown field "memory" (GPUConfig has apiVersion, kind, elastic, contextReserveMiB, memoryCeilingMiB)`},
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memoryCeilingMiB":0}`, `parameters.memoryCeilingMiB 0 outside [1, 16777216] (MiB per GPU)`},
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memoryCeilingMiB":16777217}`, `parameters.memoryCeilingMiB 16777217 outside [1, 16777216] (MiB per GPU)`},
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memoryCeilingMiB":"30Gi"}`, `parameters.memoryCeilingMiB: string is not a int64`},
		{`{"apiVersion":"gpu.tessera.io/v1","kind":"GPUConfig"}`, `parameters.apiVersion "gpu.tessera.io/v1": want "gpu.tessera.io/v1alpha1"`},
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GpuConfig"}`, `parameters.kind "GpuConfig": want "GPUConfig"`},
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","contextReserveMiB":-1}`, `parameters.contextReserveMiB -1 outside [0, 4096]`},
		{`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig"} {}`, `parameters: trailing data after the object`},
		{`[1]`, `parameters: array is not an object`},
		{`{`, `parameters: unexpected EOF`},
	}
	for _, b := range bad {
		if _, err := DecodeGPUConfig([]byte(b.in)); err == nil || err.Error() != b.want {
			t.Errorf("%s:\n got %v\nwant %s", b.in, err, b.want)
		}
	}
}

func TestDecodeGPUConfigCeiling(t *testing.T) {
	c, err := DecodeGPUConfig([]byte(`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memoryCeilingMiB":30720}`))
	if err != nil || c.MemoryCeilingMiB == nil || *c.MemoryCeilingMiB != 30720 {
		t.Errorf("got %+v, %v; want a ceiling of 30720 MiB", c, err)
	}
}

func TestDRANames(t *testing.T) {
	// The capacity the guides' CEL reads must be in NVIDIA's domain, and
	// Tessera's own names in the driver's (unqualified).
	if !strings.HasPrefix(CapacityNVIDIAMemory, NVIDIADomain+"/") {
		t.Errorf("%s is not in %s", CapacityNVIDIAMemory, NVIDIADomain)
	}
	for _, n := range []string{CapacityMemory, CapacityCores, CapacityShares} {
		if strings.Contains(n, "/") {
			t.Errorf("capacity %s is qualified", n)
		}
	}
}
