package kubeobj

import (
	"fmt"
	"math"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/api"
)

func exact(class string, count int64, mem string) resourceapi.DeviceRequest {
	e := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	if mem != "" {
		e.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem)}}
	}
	return resourceapi.DeviceRequest{Name: "gpu", Exactly: e}
}

func TestClaimChargeMiB(t *testing.T) {
	const largest = 81920
	spec := func(reqs ...resourceapi.DeviceRequest) resourceapi.ResourceClaimSpec {
		return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
	}
	all := exact(api.DeviceClassGPU, 0, "1Gi")
	all.Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	qualified := exact(api.DeviceClassGPU, 1, "")
	qualified.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.DRADriverName + "/" + api.CapacityMemory: resource.MustParse("10Gi")}}
	prioritized := resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "small", DeviceClassName: api.DeviceClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse("4Gi")}}},
		{Name: "two", DeviceClassName: api.DeviceClassNVIDIA, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse("3Gi")}}},
	}}
	for _, tc := range []struct {
		name string
		spec resourceapi.ResourceClaimSpec
		want int64
	}{
		{"20Gi share", spec(exact(api.DeviceClassGPU, 1, "20Gi")), 20480},
		{"two GPUs of 8Gi, compatibility class", spec(exact(api.DeviceClassNVIDIAGPU, 2, "8Gi")), 16384},
		{"no memory: the largest GPU whole", spec(exact(api.DeviceClassNVIDIA, 1, "")), largest},
		{"extended-resource class, whole", spec(exact(api.DeviceClassExtendedResource, 2, "")), 2 * largest},
		{"memory rounded up to a MiB", spec(exact(api.DeviceClassGPU, 1, "1000001")), 1},
		{"qualified capacity name", spec(qualified), 10240},
		{"allocationMode All: the worst case", spec(all), resourceapi.AllocationResultsMaxSize * 1024},
		{"prioritized list: the costliest", spec(prioritized), 6144},
		{"another driver's class", spec(exact("other.example.com", 4, "")), 0},
		{"count beyond what an allocation holds", spec(exact(api.DeviceClassGPU, 1<<62, "4Gi")), resourceapi.AllocationResultsMaxSize * 4096},
		{"count beyond what an allocation holds, whole", spec(exact(api.DeviceClassGPU, 1<<40, "")), resourceapi.AllocationResultsMaxSize * largest},
		{"the most memory a GPU may have", spec(exact(api.DeviceClassGPU, 2, "16Ti")), 2 * api.MaxGPUMemoryMiB},
		{"two requests add", spec(exact(api.DeviceClassGPU, 1, "1Gi"), func() resourceapi.DeviceRequest {
			r := exact(api.DeviceClassGPU, 1, "2Gi")
			r.Name = "second"
			return r
		}()), 3072},
	} {
		if got, err := ClaimChargeMiB(tc.spec, nil, largest); err != nil || got != tc.want {
			t.Errorf("%s: charged %d MiB (%v), want %d", tc.name, got, err, tc.want)
		}
	}
}

func TestClaimDevices(t *testing.T) {
	share := ptr.To(types.UID("00000000-0000-4000-8000-000000000001"))
	claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "other", Driver: "other.example.com", Pool: "n", Device: "x"},
		{Request: "gpu", Driver: api.DRADriverName, Pool: "n", Device: "gpu-0", ShareID: share, ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			api.CapacityMemory: resource.MustParse("20Gi"), api.CapacityCores: resource.MustParse("25")}},
		{Request: "gpu", Driver: api.DRADriverName, Pool: "n", Device: "gpu-1"},
		{Request: "mon", Driver: api.DRADriverName, Pool: "n", Device: "gpu-2", AdminAccess: ptr.To(true)},
	}}}}}
	got, err := ClaimDevices(claim)
	if err != nil {
		t.Fatal(err)
	}
	want := []ClaimDevice{
		{Index: 1, Request: "gpu", Pool: "n", Device: "gpu-0", ShareID: string(*share), MemoryMiB: 20480, Cores: 25},
		{Index: 2, Request: "gpu", Pool: "n", Device: "gpu-1", Whole: true},
		{Index: 3, Request: "mon", Pool: "n", Device: "gpu-2", Admin: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	claim.Status.Allocation.Devices.Results[1].ConsumedCapacity[api.CapacityCores] = resource.MustParse("101")
	if _, err := ClaimDevices(claim); err == nil || !strings.Contains(err.Error(), "results[1].consumedCapacity[cores] 101") {
		t.Errorf("cores over 100: %v", err)
	}
	if d, err := ClaimDevices(&resourceapi.ResourceClaim{}); d != nil || err != nil {
		t.Errorf("unallocated claim: %v, %v", d, err)
	}
}

// TestClaimChargeMiBHuge: a memory request larger than any GPU is an
// error naming the field, the value and the limit, never a charge that
// wraps around: 4 GPUs of 4611686018435776k bytes (2^42+8 MiB) are
// 2^44+32 MiB, whose bytes wrapped to a charge of 32 MiB.
func TestClaimChargeMiBHuge(t *testing.T) {
	huge := resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "huge", DeviceClassName: api.DeviceClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse("4611686018435776k")}}},
		{Name: "eight", DeviceClassName: api.DeviceClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 8},
	}}
	qualified := exact(api.DeviceClassNVIDIA, 1, "")
	qualified.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.DRADriverName + "/" + api.CapacityMemory: resource.MustParse("16Ei")}}
	for _, tc := range []struct {
		name string
		req  resourceapi.DeviceRequest
		want []string
	}{
		{"prioritized list, first alternative", huge, []string{"spec.devices.requests[1].firstAvailable[0].capacity.requests[memory]", "4611686018435776k", "at most 16777216 MiB (16Ti) per GPU"}},
		{"a value only a decimal holds", exact(api.DeviceClassGPU, 1, "4398046511112Mi"), []string{"spec.devices.requests[1].exactly.capacity.requests[memory]", "4398046511112Mi"}},
		{"beyond an int64 of bytes, qualified", qualified, []string{"spec.devices.requests[1].exactly.capacity.requests[gpu.tessera.io/memory]", "16777216 MiB"}},
		{"one byte over", exact(api.DeviceClassGPU, 1, "17592186044417"), []string{"spec.devices.requests[1].exactly.capacity.requests[memory]", "17592186044417"}},
	} {
		first := exact(api.DeviceClassGPU, 1, "1Gi")
		first.Name = "first"
		spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{first, tc.req}}}
		got, err := ClaimChargeMiB(spec, field.NewPath("spec"), 40960)
		if err == nil {
			t.Errorf("%s: charged %d MiB, want an error", tc.name, got)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
		// The views still read what the claim asks.
		if reqs := ClaimRequests(spec); len(reqs) < 2 || reqs[1].MemoryMiB <= api.MaxGPUMemoryMiB || reqs[1].Field == "" {
			t.Errorf("%s: ClaimRequests %+v", tc.name, reqs)
		}
	}
}

func TestSaturatingMiB(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"add", AddMiB(3, 4), 7},
		{"add at the limit", AddMiB(MaxChargeMiB-1, 1), MaxChargeMiB},
		{"add over the limit", AddMiB(MaxChargeMiB, MaxChargeMiB), MaxChargeMiB},
		{"add a negative", AddMiB(-5, 4), 4},
		{"multiply", MulMiB(32, 1<<24), 1 << 29},
		{"multiply over the limit", MulMiB(1<<40, 1<<40), MaxChargeMiB},
		{"multiply by 0", MulMiB(0, MaxChargeMiB), 0},
		{"multiply a negative", MulMiB(-2, 5), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	if b := MaxChargeMiB << 20; b < 0 || b>>20 != MaxChargeMiB {
		t.Errorf("MaxChargeMiB %d MiB is no int64 of bytes", MaxChargeMiB)
	}
}

func TestWholeMiB(t *testing.T) {
	for _, tc := range []struct {
		q    resource.Quantity
		want int64
	}{
		{resource.MustParse("1"), 1}, {resource.MustParse("1Mi"), 1}, {resource.MustParse("1048577"), 2}, {resource.MustParse("0"), 0},
		// b + 1 MiB - 1 wrapped around to a negative count here.
		{*resource.NewQuantity(math.MaxInt64, resource.BinarySI), 1 << 43},
	} {
		if got, err := WholeMiB(tc.q); err != nil || got != tc.want {
			t.Errorf("WholeMiB(%s) = %d, %v; want %d", tc.q.String(), got, err, tc.want)
		}
	}
}

// TestClaimCeiling: a memory ceiling in Tessera's opaque configuration is
// checked where the claim or template is created: at least the memory
// every request it applies to asks (the guarantee), which must ask some,
// and at most the largest GPU; the claim is charged its guarantee only.
func TestClaimCeiling(t *testing.T) {
	const largest = 81920
	ceiling := func(mib int64, requests ...string) resourceapi.DeviceClaimConfiguration {
		raw := fmt.Sprintf(`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memoryCeilingMiB":%d}`, mib)
		return resourceapi.DeviceClaimConfiguration{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DRADriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}
	}
	other := exact(api.DeviceClassGPU, 1, "")
	other.Name = "whole"
	for _, tc := range []struct {
		name   string
		reqs   []resourceapi.DeviceRequest
		config resourceapi.DeviceClaimConfiguration
		want   []string // the error's parts; none: admitted, charged 20480
	}{
		{"guarantee below the ceiling", []resourceapi.DeviceRequest{exact(api.DeviceClassGPU, 1, "20Gi")}, ceiling(30720), nil},
		{"ceiling equal to the guarantee", []resourceapi.DeviceRequest{exact(api.DeviceClassGPU, 1, "20Gi")}, ceiling(20480, "gpu"), nil},
		{"a whole GPU the ceiling does not name", []resourceapi.DeviceRequest{exact(api.DeviceClassGPU, 1, "20Gi"), other}, ceiling(30720, "gpu"), nil},
		{"guarantee above the ceiling", []resourceapi.DeviceRequest{exact(api.DeviceClassGPU, 1, "20Gi")}, ceiling(10240),
			[]string{"spec.devices.config[0].opaque.parameters.memoryCeilingMiB", "Invalid value: 10240", `below the memory request "gpu" asks (spec.devices.requests[0].exactly: 20480 MiB per GPU`}},
		{"no memory asked", []resourceapi.DeviceRequest{exact(api.DeviceClassGPU, 1, "20Gi"), other}, ceiling(30720),
			[]string{"spec.devices.config[0].opaque.parameters.memoryCeilingMiB", "Invalid value: 30720", `request "whole" (spec.devices.requests[1].exactly) asks no memory capacity`}},
		{"more than the largest GPU", []resourceapi.DeviceRequest{exact(api.DeviceClassGPU, 1, "20Gi")}, ceiling(81921),
			[]string{"memoryCeilingMiB", "Invalid value: 81921", "exceeds the largest GPU in the cluster (81920 MiB)"}},
		{"malformed", []resourceapi.DeviceRequest{exact(api.DeviceClassGPU, 1, "20Gi")}, func() resourceapi.DeviceClaimConfiguration {
			c := ceiling(1)
			c.Opaque.Parameters.Raw = []byte(`{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","memoryCeilingMiB":"30Gi"}`)
			return c
		}(), []string{"spec.devices.config[0].opaque.parameters", "memoryCeilingMiB: string is not a int64"}},
	} {
		spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: tc.reqs, Config: []resourceapi.DeviceClaimConfiguration{tc.config}}}
		got, err := ClaimChargeMiB(spec, field.NewPath("spec"), largest)
		if len(tc.want) == 0 {
			if err != nil || got != 20480+int64(len(tc.reqs)-1)*largest {
				t.Errorf("%s: charged %d MiB (%v), want the guarantee", tc.name, got, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: admitted (charged %d MiB), want an error", tc.name, got)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}
