// Package dra is the node agent's DRA kubelet plugin for the driver
// gpu.tessera.io (api.DRADriverName): it publishes the node's GPUs as
// ResourceSlice devices whose memory and cores are consumable capacity,
// and prepares the claims the kubelet hands it: a CDI spec per claim
// carrying the GPUs, the limiter's read-only limits file computed from the
// capacity the claim consumed, a writable limiter state directory and the
// preload, all recorded in a checkpoint so an agent restart keeps them and
// unprepare removes exactly what prepare wrote. It is built on
// k8s.io/dynamic-resource-allocation (kubeletplugin, resourceslice) and
// the CDI library; docs/dra.md describes the design.
package dra

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// GPU is one GPU as the driver publishes it: the inventory's view (health,
// sharing mode, share count already applied by the agent) and what only
// the ResourceSlice carries.
type GPU struct {
	api.GPU
	// Architecture ("Ampere", "Hopper"…) and Brand ("Tesla", "Nvidia"…)
	// as NVML names them; empty when unknown.
	Architecture, Brand string
}

// System is what NVML says of the node's driver.
type System struct {
	// DriverVersion is NVML's driver version ("550.54.15"), CUDAVersion
	// the CUDA driver API version (12040 = 12.4).
	DriverVersion string
	CUDAVersion   int
}

// mib is one MiB, the limiter's unit: memory requests are rounded up to it.
var mib = resource.MustParse("1Mi")

// DeviceName is the ResourceSlice device name of the GPU with this NVML
// index.
func DeviceName(index int) string { return "gpu-" + strconv.Itoa(index) }

// Devices builds the ResourceSlice devices of the node's GPUs.
//
// A GPU in shared mode allows multiple allocations: its memory (bytes),
// cores (percent of SMs) and shares (the profile's sharesPerGPU) are
// consumable, each with a request policy that sets what a claim consumes
// when it does not ask: all of the memory (so a claim that asks nothing
// holds the GPU whole), no cores (no compute guarantee: the limiter does
// not pace it), one share. The gpu.nvidia.com/memory capacity mirrors the
// memory for selectors and is never consumed. A GPU in exclusive mode
// allows one allocation and carries the same capacities as plain values.
//
// An unhealthy GPU stays in the slice, tainted NoSchedule, so claims that
// hold it keep it visible and no new claim gets it.
func Devices(gpus []GPU, sys System) []resourceapi.Device {
	out := make([]resourceapi.Device, 0, len(gpus))
	for _, g := range gpus {
		out = append(out, device(g, sys))
	}
	return out
}

func device(g GPU, sys System) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	ver := func(s string) resourceapi.DeviceAttribute {
		return resourceapi.DeviceAttribute{VersionValue: ptr.To(s)}
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		api.AttrType:        str(api.AttrTypeGPU),
		api.AttrUUID:        str(g.UUID),
		api.AttrIndex:       {IntValue: ptr.To(int64(g.Index))},
		api.AttrProductName: str(g.Model),
		api.AttrMIGCapable:  {BoolValue: ptr.To(g.MIG.Capable)},
		api.AttrSharing:     str(string(g.Sharing)),
	}
	nv := func(name string, a resourceapi.DeviceAttribute) {
		attrs[resourceapi.QualifiedName(api.NVIDIADomain+"/"+name)] = a
	}
	nv(api.AttrType, str(api.AttrTypeGPU))
	nv(api.AttrUUID, str(g.UUID))
	nv(api.AttrProductName, str(g.Model))
	if g.Brand != "" {
		attrs[api.AttrBrand] = str(g.Brand)
		nv(api.AttrBrand, str(g.Brand))
	}
	if g.Architecture != "" {
		attrs[api.AttrArchitecture] = str(g.Architecture)
		nv(api.AttrArchitecture, str(g.Architecture))
	}
	if v, ok := semver(g.ComputeCapability); ok {
		attrs[api.AttrComputeCapability] = ver(v)
		nv(api.AttrNVIDIACUDAComputeCapability, ver(v))
	}
	if v, ok := semver(sys.DriverVersion); ok {
		attrs[api.AttrDriverVersion] = ver(v)
		nv(api.AttrDriverVersion, ver(v))
	}
	if sys.CUDAVersion > 0 {
		v := fmt.Sprintf("%d.%d.0", sys.CUDAVersion/1000, sys.CUDAVersion%1000/10)
		attrs[api.AttrCUDADriverVersion] = ver(v)
		nv(api.AttrCUDADriverVersion, ver(v))
	}
	if g.PCIBusID != "" {
		attrs[api.AttrPCIBusID] = str(g.PCIBusID)
		if a, err := deviceattribute.GetPCIBusIDAttribute(standardBusID(g.PCIBusID)); err == nil {
			attrs[a.Name] = a.Value
		}
	}
	if g.NUMANode >= 0 {
		attrs[api.AttrNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
		attrs[api.AttrStandardNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
	}
	if g.SMCount > 0 {
		attrs[api.AttrSMCount] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.SMCount))}
	}

	memory := *resource.NewQuantity(g.MemoryMiB<<20, resource.BinarySI)
	cores := *resource.NewQuantity(api.MaxCores, resource.DecimalSI)
	d := resourceapi.Device{
		Name:       DeviceName(g.Index),
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			api.CapacityMemory:       {Value: memory},
			api.CapacityCores:        {Value: cores},
			api.CapacityNVIDIAMemory: {Value: memory},
		},
	}
	if g.Sharing == api.SharingShared {
		zero := *resource.NewQuantity(0, resource.DecimalSI)
		one := *resource.NewQuantity(1, resource.DecimalSI)
		d.AllowMultipleAllocations = ptr.To(true)
		d.Capacity[api.CapacityMemory] = resourceapi.DeviceCapacity{Value: memory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    ptr.To(memory.DeepCopy()),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(mib.DeepCopy()), Max: ptr.To(memory.DeepCopy()), Step: ptr.To(mib.DeepCopy())},
		}}
		d.Capacity[api.CapacityCores] = resourceapi.DeviceCapacity{Value: cores, RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    ptr.To(zero.DeepCopy()),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(zero.DeepCopy()), Max: ptr.To(cores.DeepCopy()), Step: ptr.To(one.DeepCopy())},
		}}
		d.Capacity[api.CapacityShares] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(max(g.MaxShares, 1)), resource.DecimalSI), RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default: ptr.To(one.DeepCopy()), ValidValues: []resource.Quantity{one.DeepCopy()},
		}}
		d.Capacity[api.CapacityNVIDIAMemory] = resourceapi.DeviceCapacity{Value: memory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default: ptr.To(zero.DeepCopy()), ValidValues: []resource.Quantity{zero.DeepCopy()},
		}}
	}
	if g.Health != api.Healthy {
		d.Taints = []resourceapi.DeviceTaint{{Key: api.TaintUnhealthy, Value: taintValue(g.HealthReason), Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return d
}

// semver writes a dotted version as semver 2.0 ("8.0" -> "8.0.0",
// "535.129.03" -> "535.129.3"); false when it is not one.
func semver(s string) (string, bool) {
	parts := strings.Split(s, ".")
	if s == "" || len(parts) > 3 {
		return "", false
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return "", false
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, "."), true
}

// standardBusID writes NVML's PCI address ("00000000:07:00.0") in the
// standard attribute's form ("0000:07:00.0", lower case).
func standardBusID(id string) string {
	id = strings.ToLower(id)
	dom, rest, ok := strings.Cut(id, ":")
	if ok && len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	return dom + ":" + rest
}

// taintValue makes a health reason ("XID 79", "double-bit ECC error") a
// taint value: a label value of at most 63 characters.
func taintValue(reason string) string {
	var b strings.Builder
	for _, c := range reason {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	v := strings.Trim(b.String(), "-._")
	if len(v) > 63 {
		v = strings.TrimRight(v[:63], "-._")
	}
	if v == "" {
		v = "unhealthy"
	}
	return v
}

// Architecture names NVML's architecture as NVIDIA's tools print it; ""
// when unknown.
func Architecture(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	case nvml.DEVICE_ARCH_RUBIN:
		return "Rubin"
	}
	return ""
}

// Brand names NVML's brand; "" when unknown.
func Brand(b nvml.BrandType) string {
	names := map[nvml.BrandType]string{
		nvml.BRAND_QUADRO: "Quadro", nvml.BRAND_TESLA: "Tesla", nvml.BRAND_NVS: "NVS", nvml.BRAND_GRID: "Grid",
		nvml.BRAND_GEFORCE: "GeForce", nvml.BRAND_TITAN: "Titan", nvml.BRAND_NVIDIA_VAPPS: "NvidiaVApps",
		nvml.BRAND_NVIDIA_VPC: "NvidiaVPC", nvml.BRAND_NVIDIA_VCS: "NvidiaVCS", nvml.BRAND_NVIDIA_VWS: "NvidiaVWS",
		nvml.BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming", nvml.BRAND_QUADRO_RTX: "QuadroRTX",
		nvml.BRAND_NVIDIA_RTX: "NvidiaRTX", nvml.BRAND_NVIDIA: "Nvidia", nvml.BRAND_GEFORCE_RTX: "GeForceRTX", nvml.BRAND_TITAN_RTX: "TitanRTX",
	}
	return names[b]
}

// ReadGPU reads what a slice carries beyond the inventory from the GPU's
// NVML handle (unknown values stay empty).
func ReadGPU(g api.GPU, h nvml.Device) GPU {
	out := GPU{GPU: g}
	if h == nil {
		return out
	}
	if a, ret := h.GetArchitecture(); ret == nvml.SUCCESS {
		out.Architecture = Architecture(a)
	}
	if b, ret := h.GetBrand(); ret == nvml.SUCCESS {
		out.Brand = Brand(b)
	}
	return out
}

// ReadSystem reads the driver's versions from NVML.
func ReadSystem(lib nvml.Interface) System {
	var s System
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		s.DriverVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		s.CUDAVersion = v
	}
	return s
}
