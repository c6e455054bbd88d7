package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Dynamic Resource Allocation (resource.k8s.io/v1): the names Tessera's
// DRA driver publishes and users write in their claims (docs/dra.md).

// DRADriverName is the driver of Tessera's ResourceSlices and the domain
// of its unqualified attribute and capacity names.
const DRADriverName = "gpu.tessera.io"

// DeviceClasses shipped in deploy/dra.
const (
	// DeviceClassGPU is Tessera's own class: every Tessera GPU.
	DeviceClassGPU = "gpu.tessera.io"
	// DeviceClassExtendedResource maps the GPU extended resource
	// (spec.extendedResourceName: nvidia.com/gpu, KEP-5004), so an
	// unchanged "nvidia.com/gpu: 1" pod gets whole GPUs on DRA nodes.
	DeviceClassExtendedResource = "extended-resource.gpu.tessera.io"
	// DeviceClassNVIDIA and DeviceClassNVIDIAGPU are the names the GPU
	// guides' claims use (NVIDIA's DRA driver's class, and the generic
	// one); optional in the install, since they clash with NVIDIA's
	// driver.
	DeviceClassNVIDIA    = "gpu.nvidia.com"
	DeviceClassNVIDIAGPU = "nvidia-gpu"
)

// DeviceClasses returns the classes whose claims Tessera's driver serves.
func DeviceClasses() []string {
	return []string{DeviceClassGPU, DeviceClassExtendedResource, DeviceClassNVIDIA, DeviceClassNVIDIAGPU}
}

// Capacities of a Tessera device. Memory and cores are consumable on GPUs
// in shared mode (allowMultipleAllocations): a claim asks
// capacity.requests {memory: 20Gi, cores: "25"}.
const (
	// CapacityMemory is the GPU's memory in bytes. Not asked, a claim
	// consumes all of it (the GPU whole); asked, it is rounded up to a
	// whole MiB and is the claim's memory limit.
	CapacityMemory = "memory"
	// CapacityCores is the GPU's compute, 100 (percent of its SMs). Not
	// asked, a claim consumes 0: no compute guarantee, no pacing (as
	// gpumem without gpucores on the device-plugin path).
	CapacityCores = "cores"
	// CapacityShares is the node profile's sharesPerGPU: every
	// allocation of the GPU consumes one.
	CapacityShares = "shares"
	// CapacityNVIDIAMemory mirrors CapacityMemory under NVIDIA's domain,
	// so the guides' selector device.capacity["gpu.nvidia.com"].memory
	// works. It is never consumed: its only valid request is 0, so a
	// claim that asks it by mistake is not allocated (and the shipped
	// admission policy refuses it, naming memory).
	CapacityNVIDIAMemory = "gpu.nvidia.com/memory"
)

// Attributes of a Tessera device, in the driver's domain unless
// qualified. The gpu.nvidia.com ones mirror the names NVIDIA's DRA driver
// publishes, so selectors written for it keep working.
const (
	AttrType              = "type" // "gpu"
	AttrUUID              = "uuid"
	AttrIndex             = "index"
	AttrProductName       = "productName"
	AttrBrand             = "brand"
	AttrArchitecture      = "architecture"
	AttrComputeCapability = "computeCapability" // version, "8.0.0"
	AttrDriverVersion     = "driverVersion"     // version
	AttrCUDADriverVersion = "cudaDriverVersion" // version
	AttrPCIBusID          = "pcieBusID"
	AttrNUMANode          = "numaNode"
	AttrMIGCapable        = "migCapable"
	AttrSharing           = "sharing" // "shared" or "exclusive"
	AttrSMCount           = "smCount"
)

// Names in other domains.
const (
	// NVIDIADomain is NVIDIA's DRA driver's domain; Tessera mirrors its
	// attributes type, uuid, productName, brand, architecture,
	// cudaComputeCapability, driverVersion and cudaDriverVersion there.
	NVIDIADomain = "gpu.nvidia.com"
	// AttrNVIDIACUDAComputeCapability is NVIDIA's name of the compute
	// capability (a version).
	AttrNVIDIACUDAComputeCapability = "cudaComputeCapability"
	// AttrStandardPCIBusID and AttrStandardNUMANode are Kubernetes'
	// standard attributes (resource.kubernetes.io).
	AttrStandardPCIBusID = "resource.kubernetes.io/pciBusID"
	AttrStandardNUMANode = "resource.kubernetes.io/numaNode"
	// AttrTypeGPU is the value of the type attribute.
	AttrTypeGPU = "gpu"
	// TaintUnhealthy is the device taint (effect NoSchedule) of an
	// unhealthy GPU; its value is the reason ("XID-79").
	TaintUnhealthy = DRADriverName + "/unhealthy"
)

// CDIKind is the CDI kind ("vendor/class") of the devices Tessera's
// driver writes per prepared claim request.
const CDIKind = DRADriverName + "/claim"

// GPUConfig is the opaque configuration a claim (or a DeviceClass) may
// pass to Tessera's driver:
//
//	config:
//	- opaque:
//	    driver: gpu.tessera.io
//	    parameters:
//	      apiVersion: gpu.tessera.io/v1alpha1
//	      kind: GPUConfig
//	      elastic: true
//
// Every field is optional; an unknown field or a wrong type fails the
// claim's preparation with an error naming it.
type GPUConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Elastic lets the claim's kernels use GPU time the other claims on
	// the GPU leave idle beyond its cores (the limiter's "elastic").
	Elastic *bool `json:"elastic,omitempty"`
	// ContextReserveMiB is what the limiter charges per CUDA context, in
	// MiB; 0 turns context charges off; unset: measured.
	ContextReserveMiB *int64 `json:"contextReserveMiB,omitempty"`
	// MemoryCeilingMiB is the most GPU memory, in MiB per GPU, the
	// claim's containers may hold: the request's memory capacity is the
	// guarantee (what the scheduler packs by), the ceiling what they may
	// burst to while the GPU's memory is free (docs/dra.md, "A memory
	// ceiling"). It needs a memory capacity request at most that much, on
	// a GPU with at least that much memory.
	MemoryCeilingMiB *int64 `json:"memoryCeilingMiB,omitempty"`
}

// GPUConfigAPIVersion and GPUConfigKind identify GPUConfig.
const (
	GPUConfigAPIVersion = DRADriverName + "/v1alpha1"
	GPUConfigKind       = "GPUConfig"
	// MaxContextReserveMiB bounds GPUConfig.ContextReserveMiB.
	MaxContextReserveMiB = 4096
)

// DecodeGPUConfig decodes a claim's opaque parameters strictly. Errors
// name the field, the value and what is allowed.
func DecodeGPUConfig(b []byte) (GPUConfig, error) {
	var c GPUConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field == "":
			return c, fmt.Errorf("parameters: %s is not an object", te.Value)
		case errors.As(err, &te):
			return c, fmt.Errorf("parameters.%s: %s is not a %s", te.Field, te.Value, te.Type)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return c, fmt.Errorf("parameters: unknown field %s (%s has apiVersion, kind, elastic, contextReserveMiB, memoryCeilingMiB)", strings.TrimPrefix(err.Error(), "json: unknown field "), GPUConfigKind)
		}
		return c, fmt.Errorf("parameters: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return c, fmt.Errorf("parameters: trailing data after the object")
	}
	if c.APIVersion != GPUConfigAPIVersion {
		return c, fmt.Errorf("parameters.apiVersion %q: want %q", c.APIVersion, GPUConfigAPIVersion)
	}
	if c.Kind != GPUConfigKind {
		return c, fmt.Errorf("parameters.kind %q: want %q", c.Kind, GPUConfigKind)
	}
	if r := c.ContextReserveMiB; r != nil && (*r < 0 || *r > MaxContextReserveMiB) {
		return c, fmt.Errorf("parameters.contextReserveMiB %d outside [0, %d]", *r, MaxContextReserveMiB)
	}
	if m := c.MemoryCeilingMiB; m != nil && (*m < 1 || *m > MaxGPUMemoryMiB) {
		return c, fmt.Errorf("parameters.memoryCeilingMiB %d outside [1, %d] (MiB per GPU)", *m, MaxGPUMemoryMiB)
	}
	return c, nil
}
