package api

import "slices"

// NodePolicy decides which node a pod goes to among the nodes that fit it.
type NodePolicy string

const (
	// NodeBinpack fills the most-used nodes first, leaving whole nodes free.
	NodeBinpack NodePolicy = "binpack"
	// NodeSpread puts each pod on the least-used node.
	NodeSpread NodePolicy = "spread"
)

// GPUPolicy decides which GPUs of the chosen node a container gets.
type GPUPolicy string

const (
	// GPUBinpack fills the most-used GPUs first.
	GPUBinpack GPUPolicy = "binpack"
	// GPUSpread gives each container the least-used GPUs.
	GPUSpread GPUPolicy = "spread"
	// GPUTopologyAware picks, for multi-GPU containers, the set of GPUs with
	// the strongest links (NVLink first), then binpacks.
	GPUTopologyAware GPUPolicy = "topology-aware"
)

// Defaults used when neither the cluster configuration nor the pod names a policy.
const (
	DefaultNodePolicy = NodeBinpack
	DefaultGPUPolicy  = GPUBinpack
)

// NodePolicies returns the known node policies.
func NodePolicies() []NodePolicy { return []NodePolicy{NodeBinpack, NodeSpread} }

// GPUPolicies returns the known GPU policies.
func GPUPolicies() []GPUPolicy { return []GPUPolicy{GPUBinpack, GPUSpread, GPUTopologyAware} }

// Valid reports whether p is a known node policy.
func (p NodePolicy) Valid() bool { return slices.Contains(NodePolicies(), p) }

// Valid reports whether p is a known GPU policy.
func (p GPUPolicy) Valid() bool { return slices.Contains(GPUPolicies(), p) }
