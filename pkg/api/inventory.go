package api

// InventoryAPIVersion is the wire version of NodeInventory written by this
// build. Decoders reject every other version with an error that names both.
const InventoryAPIVersion = "tessera.io/v1"

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
	GPUs             []GPU   `json:"gpus"`
}

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
}

// MIG is the GPU's Multi-Instance GPU state.
type MIG struct {
	Capable bool `json:"capable"`
	Enabled bool `json:"enabled"`
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
	MaxMemoryOvercommit = 4.0
	MaxNVLinks          = 64
)
