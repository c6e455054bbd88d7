package api

import "fmt"

// Volcano's vGPU protocol (docs/volcano.md): the names Volcano's scheduler
// (its deviceshare plugin with VGPUEnable, package
// pkg/scheduler/api/devices/nvidia/vgpu) and a node's device plugin use
// to talk about GPU shares. They are Volcano's, spelled as Volcano
// v1.14–v1.16 spell them; Tessera's node agent speaks them on nodes whose
// profile says mode volcano. This file is their one home in Tessera.

// Resources a Volcano pod asks for, per container.
const (
	// VolcanoVGPUNumber is the number of GPUs (each a share of a physical
	// GPU); the kubelet allocates it through the node agent's device
	// plugin.
	VolcanoVGPUNumber = "volcano.sh/vgpu-number"
	// VolcanoVGPUMemory is the memory per GPU, MiB.
	VolcanoVGPUMemory = "volcano.sh/vgpu-memory"
	// VolcanoVGPUMemoryPercentage is the memory per GPU as a percentage
	// of the GPU's memory.
	VolcanoVGPUMemoryPercentage = "volcano.sh/vgpu-memory-percentage"
	// VolcanoVGPUCores is the compute per GPU, percent (100: the GPU
	// alone).
	VolcanoVGPUCores = "volcano.sh/vgpu-cores"
)

// VolcanoResources are the resource names of Volcano's vGPU protocol.
func VolcanoResources() []string {
	return []string{VolcanoVGPUNumber, VolcanoVGPUMemory, VolcanoVGPUMemoryPercentage, VolcanoVGPUCores}
}

// Node annotations of the protocol, written by the node's device plugin.
const (
	// AnnotationVolcanoRegister lists the node's GPUs for Volcano's
	// scheduler: "<uuid>,<split>,<MiB>,<type>,<healthy>,<mode>:" per GPU.
	AnnotationVolcanoRegister = "volcano.sh/node-vgpu-register"
	// AnnotationVolcanoHandshake is refreshed by the device plugin
	// ("Reported_<time>"); Volcano up to v1.15.0 writes
	// "Requesting_<time>" and drops the node's GPUs when no report
	// follows within 60 s. Later releases ignore it.
	AnnotationVolcanoHandshake = "volcano.sh/node-vgpu-handshake"
	// VolcanoHandshakeRequesting starts the handshake Volcano's scheduler
	// (up to v1.15.0) writes each time it reads the node's registration
	// with its vGPU sharing on.
	VolcanoHandshakeRequesting = "Requesting_"
)

// Pod annotations of the protocol. Volcano's scheduler writes them when it
// allocates a pod (v1.15 patches the pod, v1.16 puts them on the
// Binding); the device plugin writes AnnotationVolcanoBindPhase.
const (
	// AnnotationVolcanoNode is the node the GPUs were allocated on.
	AnnotationVolcanoNode = "volcano.sh/vgpu-node"
	// AnnotationVolcanoTime is when they were allocated (Unix seconds).
	AnnotationVolcanoTime = "volcano.sh/vgpu-time"
	// AnnotationVolcanoBindTime is when the scheduler bound the pod.
	AnnotationVolcanoBindTime = "volcano.sh/bind-time"
	// AnnotationVolcanoIDs are the GPUs of each vGPU container:
	// "<uuid>,NVIDIA,<MiB>,<cores>:" per GPU, ";" between containers.
	// Volcano rebuilds its usage from it: never removed or changed.
	AnnotationVolcanoIDs = "volcano.sh/vgpu-ids-new"
	// AnnotationVolcanoToAllocate starts equal to AnnotationVolcanoIDs;
	// HAMi's device plugin erases the containers it served from it.
	AnnotationVolcanoToAllocate = "volcano.sh/devices-to-allocate"
	// AnnotationVolcanoBindPhase is "allocating" (the scheduler), then
	// "success" or "failed" (the device plugin). Once "success", the
	// scheduler leaves the pod's annotations alone.
	AnnotationVolcanoBindPhase = "volcano.sh/bind-phase"
	// AnnotationVolcanoMode asks for a sharing mode ("hami-core", "mig").
	AnnotationVolcanoMode = "volcano.sh/vgpu-mode"
)

// VolcanoSchedulerAnnotations are the pod annotations only Volcano's
// scheduler writes (the admission policy holds them to its identity).
func VolcanoSchedulerAnnotations() []string {
	return []string{AnnotationVolcanoNode, AnnotationVolcanoTime, AnnotationVolcanoBindTime, AnnotationVolcanoIDs, AnnotationVolcanoToAllocate}
}

// Values of AnnotationVolcanoBindPhase.
const (
	VolcanoBindAllocating = "allocating"
	VolcanoBindSuccess    = "success"
	VolcanoBindFailed     = "failed"
)

// Sharing modes of a GPU in the registration annotation.
const (
	VolcanoModeHAMiCore = "hami-core"
	VolcanoModeMIG      = "mig"
)

// Volcano's device configuration: the ConfigMap its scheduler's
// deviceshare plugin reads at start (deviceshare.KnownGeometriesCMName
// and KnownGeometriesCMNamespace change it), whose key holds the vGPU
// resource names and, for mig mode, the MIG geometries of each GPU model
// (nvidia.knownMigGeometries). A node in Volcano's mig mode reads the
// same geometries to find the instance Volcano chose.
const (
	VolcanoDeviceConfigNamespace = "kube-system"
	VolcanoDeviceConfigName      = "volcano-vgpu-device-config"
	VolcanoDeviceConfigKey       = "device-config.yaml"
)

// VolcanoDeviceType is the device type Volcano writes per allocated GPU;
// a GPU's type in the registration starts with it ("NVIDIA-<model>").
const VolcanoDeviceType = "NVIDIA"

// VolcanoSchedulerName is the schedulerName of Volcano's pods.
const VolcanoSchedulerName = "volcano"

// ModeVolcano is the mode of a node profile whose GPUs Volcano's scheduler
// places: the node agent speaks Volcano's vGPU protocol and publishes no
// Tessera inventory, so Tessera's scheduler does not offer the node. It is
// a profile's mode only; an inventory never carries it.
const ModeVolcano NodeMode = "volcano"

// validateVolcano checks what a volcano node supports: shares enforced by
// the limiter (Volcano's hami-core mode) or MIG instances made for each
// pod (Volcano's mig mode, sharing mig-dynamic), sharesPerGPU as Volcano's
// split count, and memory as NVML reports it (Volcano's memory scaling is
// not offered: the registration is the GPUs' physical memory).
func (c *NodeConfig) validateVolcano() error {
	if c.Sharing != SharingShared && c.Sharing != SharingMIGDynamic {
		return fmt.Errorf("sharing %q with mode %q: a volcano node shares its GPUs through the limiter (%q, Volcano's %s mode) or by MIG instances made for each pod (%q, Volcano's %s mode)",
			c.Sharing, ModeVolcano, SharingShared, VolcanoModeHAMiCore, SharingMIGDynamic, VolcanoModeMIG)
	}
	if c.MemoryOvercommit != 1 {
		return fmt.Errorf("memoryOvercommit %v with mode %q: the GPUs are registered with Volcano at their physical memory (must be 1)", c.MemoryOvercommit, ModeVolcano)
	}
	return nil
}

// VolcanoResourceNames are Volcano's resources in the shape of Tessera's
// (the count, memory MiB, memory percentage and cores), so that one reader
// (kubeobj.ReadResources) checks their bounds.
var VolcanoResourceNames = ResourceNames{
	Prefix: "volcano.sh", GPU: VolcanoVGPUNumber, Memory: VolcanoVGPUMemory,
	MemoryPercentage: VolcanoVGPUMemoryPercentage, Cores: VolcanoVGPUCores,
}
