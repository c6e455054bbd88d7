package kubeobj

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
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
		{"two requests add", spec(exact(api.DeviceClassGPU, 1, "1Gi"), func() resourceapi.DeviceRequest {
			r := exact(api.DeviceClassGPU, 1, "2Gi")
			r.Name = "second"
			return r
		}()), 3072},
	} {
		if got := ClaimChargeMiB(tc.spec, largest); got != tc.want {
			t.Errorf("%s: charged %d MiB, want %d", tc.name, got, tc.want)
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
