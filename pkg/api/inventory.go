package api

// Wire versions of NodeInventory. This build reads all three and writes
// the lowest one that expresses the inventory: tessera.io/v1 unless a field
// added in v2 (node mode, MIG strategy and devices, the mps and mig sharing
// modes) or in v3 (driver-enforced memory limits) is used. Decoders reject
// every other version with an error that names the versions they read. See
// docs/upgrading.md for the order in which to upgrade components across a
// version bump.
const (
	InventoryAPIVersion   = "tessera.io/v3"
	InventoryAPIVersionV2 = "tessera.io/v2"
	InventoryAPIVersionV1 = "tessera.io/v1"
)

// InventoryKind is the kind field of an encoded NodeInventory.
const InventoryKind = "NodeGPUInventory"

// NodeInventory is what the node agent publishes on its Node object (in the
// AnnotationInventory annotation): every GPU of the node as the agent sees it
// now, and the node-wide sharing settings the scheduler must respect.
type NodeInventory struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// MemoryOvercommit multiplies each GPU's memory for placement purposes
	// (1.0 = no overcommit). Values below 1 or above MaxMemoryOvercommit are
	// invalid.
	MemoryOvercommit float64 `json:"memoryOvercommit"`
	// Mode is how the node serves its GPUs (v2; empty = ModeDevicePlugin).
	Mode NodeMode `json:"mode,omitempty"`
	// MIGStrategy is how MIG devices are offered as resources (v2; empty =
	// MIGStrategyNone): NVIDIA's "single" (as the GPU resource) or
	// "mixed" (one resource per profile, e.g. nvidia.com/mig-1g.5gb).
	MIGStrategy MIGStrategy `json:"migStrategy,omitempty"`
	GPUs        []GPU       `json:"gpus"`
}

// NodeMode is how a node serves its GPUs to pods.
type NodeMode string

const (
	// ModeDevicePlugin: the kubelet device plugin serves the GPU
	// resources; the Tessera scheduler places GPU pods from this inventory.
	ModeDevicePlugin NodeMode = "device-plugin"
	// ModeDRA: the node's GPUs are allocated through ResourceClaims
	// (driver gpu.tessera.io); no device-plugin GPU pod may land there.
	ModeDRA NodeMode = "dra"
)

// MIGStrategy is how MIG devices are offered, in NVIDIA's terms.
type MIGStrategy string

const (
	MIGStrategyNone   MIGStrategy = "none"
	MIGStrategySingle MIGStrategy = "single"
	MIGStrategyMixed  MIGStrategy = "mixed"
)

// GPU describes one physical GPU of a node.
type GPU struct {
	// UUID is NVML's identifier ("GPU-…"); unique within the node.
	UUID string `json:"uuid"`
	// Index is NVML's device index, unique within the node. Excluded or
	// lost GPUs leave gaps, so indices need not be 0..n-1.
	Index int `json:"index"`
	// Model is the product name NVML reports, e.g. "NVIDIA A100-SXM4-40GB".
	Model string `json:"model"`
	// MemoryMiB is the GPU's total memory in MiB.
	MemoryMiB int64 `json:"memoryMiB"`
	// SMCount is the number of streaming multiprocessors (0 = unknown).
	SMCount int `json:"smCount,omitempty"`
	// ComputeCapability is "major.minor", e.g. "8.0"; empty = unknown.
	ComputeCapability string `json:"computeCapability,omitempty"`
	// NUMANode is the NUMA node the GPU is attached to; -1 = unknown.
	NUMANode int `json:"numaNode"`
	// PCIBusID is the PCI address, e.g. "00000000:07:00.0".
	PCIBusID string `json:"pciBusID,omitempty"`
	MIG      MIG    `json:"mig"`
	Health   Health `json:"health"`
	// HealthReason says why the GPU is unhealthy (e.g. "XID 79"); empty when healthy.
	HealthReason string `json:"healthReason,omitempty"`
	// Sharing is how pods may use this GPU.
	Sharing SharingMode `json:"sharing"`
	// MaxShares is the most containers that may hold a share of this GPU at
	// once (1..MaxSharesLimit). Exclusive GPUs have MaxShares 1.
	MaxShares int `json:"maxShares"`
	// Links are this GPU's connections to the node's other GPUs.
	Links []Link `json:"links,omitempty"`
	// DriverMemoryLimits (v3) says the GPU's driver partitions its memory
	// per cgroup (NVIDIA r615 and later, cgroup v2, MIG off) and the node
	// agent has it enforce the containers' memory limits (soft limit =
	// guarantee, hard limit = ceiling; set where the agent runs the
	// memory-limits hook, docs/isolation.md). False: the limiter
	// enforces them.
	DriverMemoryLimits bool `json:"driverMemoryLimits,omitempty"`
}

// MIG is the GPU's Multi-Instance GPU state.
type MIG struct {
	Capable bool `json:"capable"`
	Enabled bool `json:"enabled"`
	// Devices are the MIG devices (GPU instances, each with one compute
	// instance) that exist on the GPU now (v2): a static layout's devices,
	// or in dynamic mode the instances created for pods.
	Devices []MIGDevice `json:"devices,omitempty"`
	// ProfileMemoryMiB is, in dynamic mode, the memory of each GPU-instance
	// profile as this GPU's NVML reports it (v2), so placement uses the
	// node's real sizes rather than a table's.
	ProfileMemoryMiB map[string]int64 `json:"profileMemoryMiB,omitempty"`
}

// MIGDevice is one MIG device of a GPU.
type MIGDevice struct {
	// UUID is NVML's identifier of the MIG device ("MIG-…").
	UUID string `json:"uuid"`
	// Profile is the GPU-instance profile, e.g. "1g.5gb" (ParseMIGProfile).
	Profile string `json:"profile"`
	// Start is the memory slice its placement starts at.
	Start int `json:"start"`
	// MemoryMiB and SMCount are the device's memory and multiprocessors.
	MemoryMiB int64 `json:"memoryMiB"`
	SMCount   int   `json:"smCount,omitempty"`
	// Health is the device's; a parent GPU's XID makes all its devices
	// unhealthy.
	Health       Health `json:"health"`
	HealthReason string `json:"healthReason,omitempty"`
}

// Health of a GPU as the node agent last saw it.
type Health string

const (
	Healthy   Health = "Healthy"
	Unhealthy Health = "Unhealthy"
)

// SharingMode is how a GPU may be used by pods.
type SharingMode string

const (
	// SharingShared: fractional shares enforced by the limiter.
	SharingShared SharingMode = "shared"
	// SharingExclusive: whole GPUs only, one container at a time.
	SharingExclusive SharingMode = "exclusive"
	// SharingTimeSlicing: replicas without memory or compute isolation.
	SharingTimeSlicing SharingMode = "time-slicing"
	// SharingMPS: clients of an MPS control daemon, each with its own
	// memory and thread-percentage limit (v2).
	SharingMPS SharingMode = "mps"
	// SharingMIG: the GPU is split into the MIG devices its layout
	// created; each device serves one container whole (v2).
	SharingMIG SharingMode = "mig"
	// SharingMIGDynamic: MIG instances are created per pod, sized to its
	// request (v2).
	SharingMIGDynamic SharingMode = "mig-dynamic"
)

// LinkType is the kind of connection between two GPUs, from strongest to
// weakest. The PCIe levels follow NVML's topology levels.
type LinkType string

const (
	LinkNVLink         LinkType = "nvlink"          // direct NVLink, NVLinks = number of links
	LinkPCIeSingle     LinkType = "pcie-single"     // one PCIe switch between them
	LinkPCIeMultiple   LinkType = "pcie-multiple"   // several PCIe switches, no host bridge
	LinkPCIeHostBridge LinkType = "pcie-hostbridge" // through one host bridge
	LinkPCIeNUMA       LinkType = "pcie-numa"       // host bridges within one NUMA node
	LinkSystem         LinkType = "system"          // across NUMA nodes (SMP interconnect)
)

// Link is a connection from one GPU to a peer GPU on the same node.
type Link struct {
	PeerUUID string   `json:"peerUUID"`
	Type     LinkType `json:"type"`
	// NVLinks is the number of NVLink links to the peer (only for LinkNVLink, >= 1).
	NVLinks int `json:"nvlinks,omitempty"`
}

// Strength orders links: higher is a faster connection. NVLink ranks above
// every PCIe path and grows with the number of links; 0 means unknown type.
func (l Link) Strength() int {
	switch l.Type {
	case LinkNVLink:
		return 100 + l.NVLinks
	case LinkPCIeSingle:
		return 50
	case LinkPCIeMultiple:
		return 40
	case LinkPCIeHostBridge:
		return 30
	case LinkPCIeNUMA:
		return 20
	case LinkSystem:
		return 10
	}
	return 0
}

// Limits that validation enforces on inventories.
const (
	MaxGPUsPerNode      = 64
	MaxSharesLimit      = 128
	MaxMPSClients       = 48 // NVIDIA's limit of MPS clients per GPU
	MaxMemoryOvercommit = 4.0
	MaxNVLinks          = 64
)
