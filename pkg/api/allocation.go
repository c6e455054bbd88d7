package api

// Wire versions of PodAllocation. This build reads all three and writes
// the lowest one that expresses the record: tessera.io/v3 when a grant has
// a memory ceiling, else tessera.io/v2 whenever the record carries its
// pod's UID, a signature or a MIG grant (the scheduler always sets the
// UID), tessera.io/v1 otherwise. See docs/upgrading.md.
const (
	AllocationAPIVersion   = "tessera.io/v3"
	AllocationAPIVersionV2 = "tessera.io/v2"
	AllocationAPIVersionV1 = "tessera.io/v1"
)

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
	// PodUID is the UID of the pod the record was written for (v2): a
	// record copied onto another pod does not match it.
	PodUID string `json:"podUID,omitempty"`
	// Containers lists every container that holds GPUs, init containers
	// included (Init = true), in pod spec order. Containers without GPUs
	// are omitted.
	Containers []ContainerAllocation `json:"containers"`
	// Signature is the writer's proof of origin over the rest of the
	// record (v2; see SigningBytes): "<scheme>:<key id>:<base64>".
	Signature string `json:"signature,omitempty"`
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
	// MemoryMiB is the memory the container is guaranteed on this GPU:
	// what the scheduler charges the GPU, and the container's memory
	// limit.
	MemoryMiB int64 `json:"memoryMiB"`
	// CeilingMiB, when set (v3), is the ceiling the pod asked
	// (nvidia.com/gpumem-ceiling): more than MemoryMiB, at most the GPU's
	// memory; 0 means none. The scheduler places the grant on a GPU at
	// least that large; on a node in shared mode the container may hold
	// up to it from the GPU's memory no grant is guaranteed (Bursts;
	// docs/isolation.md, "Guaranteed plus burst"), elsewhere MemoryMiB.
	CeilingMiB int64 `json:"ceilingMiB,omitempty"`
	// Cores is the compute share in percent of the GPU's SMs (0..100;
	// 0 means the limiter enforces no compute share).
	Cores int `json:"cores"`
	// Exclusive means no other container may hold a share of this GPU
	// while this one does (whole-GPU requests).
	Exclusive bool `json:"exclusive,omitempty"`
	// MIG, when set, grants a MIG instance of the GPU named by UUID
	// instead of a share of it (v2): the instance's memory slices are
	// charged, not memory or cores.
	MIG *MIGGrant `json:"mig,omitempty"`
}

// Bursts reports whether the grant may hold memory past its guarantee, up
// to its ceiling, where the node lends it (a share of a GPU with a
// ceiling; docs/isolation.md, "Guaranteed plus burst").
func (d DeviceGrant) Bursts() bool {
	return d.CeilingMiB > d.MemoryMiB && d.MemoryMiB > 0 && !d.Exclusive && d.MIG == nil
}

// MIGGrant is a MIG instance granted to a container.
type MIGGrant struct {
	// Profile is the GPU-instance profile ("1g.5gb").
	Profile string `json:"profile"`
	// Start is the memory slice the instance starts at.
	Start int `json:"start"`
	// Device is the MIG device's UUID when it exists already (a static
	// layout); empty when the node agent creates the instance for the pod
	// (dynamic MIG).
	Device string `json:"device,omitempty"`
}

// MaxContainersPerPod bounds the number of containers a record may hold.
const MaxContainersPerPod = 256

// MaxSignatureLength bounds AllocationSignature values.
const MaxSignatureLength = 512
