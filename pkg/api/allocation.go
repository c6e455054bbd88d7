package api

// AllocationAPIVersion is the wire version of PodAllocation written by this build.
const AllocationAPIVersion = "tessera.io/v1"

// AllocationKind is the kind field of an encoded PodAllocation.
const AllocationKind = "PodGPUAllocation"

// PodAllocation is the scheduler's decision for one pod, written on the pod
// (AnnotationAllocation) before it is bound. The node agent reads it to answer
// the kubelet's Allocate calls; the scheduler rebuilds its state from it after
// a restart. It is the single record of which GPU shares a pod holds.
type PodAllocation struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Node is the node the pod was placed on.
	Node string `json:"node"`
	// Containers lists every container that holds GPUs, init containers
	// included (Init = true), in pod spec order. Containers without GPUs
	// are omitted.
	Containers []ContainerAllocation `json:"containers"`
}

// ContainerAllocation is the set of GPU shares granted to one container.
type ContainerAllocation struct {
	Name string `json:"name"`
	Init bool   `json:"init,omitempty"`
	// Devices are distinct GPUs of the node, in the order the container
	// sees them (device 0 first).
	Devices []DeviceGrant `json:"devices"`
}

// DeviceGrant is one container's share of one GPU.
type DeviceGrant struct {
	UUID string `json:"uuid"`
	// MemoryMiB is the memory limit the limiter enforces on this GPU.
	MemoryMiB int64 `json:"memoryMiB"`
	// Cores is the compute share in percent of the GPU's SMs (0..100;
	// 0 means the limiter enforces no compute share).
	Cores int `json:"cores"`
	// Exclusive means no other container may hold a share of this GPU
	// while this one does (whole-GPU requests).
	Exclusive bool `json:"exclusive,omitempty"`
}

// MaxContainersPerPod bounds the number of containers a record may hold.
const MaxContainersPerPod = 256
