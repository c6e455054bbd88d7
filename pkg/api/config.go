package api

import (
	"fmt"
	"math"
	"slices"
	"strconv"
)

// SchedulerName is the scheduler profile GPU pods are sent to: the profile
// of `tessera scheduler` (deploy/scheduler/config.yaml and the chart keep
// this literal; a test holds them equal), where the webhook routes GPU
// pods by default, and what `kubectl tessera` counts as Tessera's pods.
const SchedulerName = "tessera-scheduler"

// DefaultPlacementPolicy is the placement-core policy used when the cluster
// configuration names none (and no nodePolicy): "tessera", the
// fragmentation-aware policy the shipped scheduler configuration
// (deploy/scheduler/config.yaml, the chart) names; a test in
// internal/scheduler holds the two equal.
const DefaultPlacementPolicy = "tessera"

// DefaultSharesPerGPU is how many containers may share a GPU unless the
// node configuration says otherwise (HAMi's default split count).
const DefaultSharesPerGPU = 10

// ClusterConfig is the scheduler-wide configuration.
type ClusterConfig struct {
	// ResourcePrefix is the prefix of the resource names (NewResourceNames).
	ResourcePrefix string `json:"resourcePrefix"`
	// NodePolicy and GPUPolicy apply to pods that do not name their own.
	NodePolicy NodePolicy `json:"nodePolicy"`
	GPUPolicy  GPUPolicy  `json:"gpuPolicy"`
	// PlacementPolicy names a policy of the placement core, e.g. "binpack"
	// or "fgd". The core checks that it exists; here only its form is.
	// Unset, it is NodePolicy's policy; set, it decides and NodePolicy only
	// names the default a pod's node-policy annotation overrides.
	PlacementPolicy string `json:"placementPolicy"`
	// RecordSigning says where the scheduler keeps the key it signs
	// allocation records with (docs/security.md).
	RecordSigning RecordSigning `json:"recordSigning,omitempty"`
}

// RecordSigning configures the signatures of allocation records. Unset
// names take the defaults of internal/recordsig (Secret
// tessera-system/tessera-record-signing-key, ConfigMap
// tessera-system/tessera-record-keys).
type RecordSigning struct {
	// Disabled writes unsigned records: node agents must then run with
	// --accept-unsigned-records, and only the admission policy vouches for
	// the records (docs/security.md).
	Disabled bool `json:"disabled,omitempty"`
	// Namespace of the Secret and the ConfigMap.
	Namespace string `json:"namespace,omitempty"`
	// KeySecret holds the private keys; the scheduler creates it on first
	// start. Only the scheduler's identity may read it.
	KeySecret string `json:"keySecret,omitempty"`
	// PublicKeys is the ConfigMap the scheduler publishes the public keys
	// in, for node agents and tools.
	PublicKeys string `json:"publicKeys,omitempty"`
}

// Defaults fills the unset fields of c with the defaults.
func (c *ClusterConfig) Defaults() {
	if c.ResourcePrefix == "" {
		c.ResourcePrefix = DefaultResourcePrefix
	}
	if c.PlacementPolicy == "" && c.NodePolicy != "" {
		c.PlacementPolicy = string(c.NodePolicy)
	}
	if c.NodePolicy == "" {
		c.NodePolicy = DefaultNodePolicy
	}
	if c.GPUPolicy == "" {
		c.GPUPolicy = DefaultGPUPolicy
	}
	if c.PlacementPolicy == "" {
		c.PlacementPolicy = DefaultPlacementPolicy
	}
}

// Validate checks a configuration after Defaults.
func (c *ClusterConfig) Validate() error {
	if _, err := NewResourceNames(c.ResourcePrefix); err != nil {
		return fmt.Errorf("resourcePrefix: %w", err)
	}
	if !c.NodePolicy.Valid() {
		return fmt.Errorf("nodePolicy %q is not one of %s", c.NodePolicy, joinQuoted(NodePolicies()))
	}
	if !c.GPUPolicy.Valid() {
		return fmt.Errorf("gpuPolicy %q is not one of %s", c.GPUPolicy, joinQuoted(GPUPolicies()))
	}
	if !isPolicyName(c.PlacementPolicy) {
		return fmt.Errorf("placementPolicy %q is not a policy name (lowercase letters, digits and '-', at most 63)", c.PlacementPolicy)
	}
	return nil
}

func isPolicyName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// NodeConfig is the node agent's configuration: how the node's GPUs are
// offered. It becomes the Sharing, MaxShares and MemoryOvercommit of the
// node's inventory.
type NodeConfig struct {
	// Mode is how the node serves its GPUs: the kubelet device plugin
	// (ModeDevicePlugin; empty means it) or DRA ResourceClaims through the
	// driver gpu.tessera.io (ModeDRA; docs/dra.md), or Volcano's vGPU
	// protocol (ModeVolcano; docs/volcano.md). Never two.
	Mode NodeMode `json:"mode,omitempty"`
	// SharesPerGPU is the most containers sharing one GPU (MaxShares).
	SharesPerGPU int `json:"sharesPerGPU"`
	// MemoryOvercommit multiplies GPU memory for placement (1.0 = none).
	MemoryOvercommit float64 `json:"memoryOvercommit"`
	// ExcludeGPUs lists GPUs, by UUID or by index, the agent does not offer.
	ExcludeGPUs []string `json:"excludeGPUs,omitempty"`
	// Sharing is how the offered GPUs may be used.
	Sharing SharingMode `json:"sharing"`
	// MIGStrategy is how MIG devices are offered (sharing "mig"): NVIDIA's
	// "single" (as the GPU resource) or "mixed" (one resource per
	// profile). Default mixed for sharing "mig", none otherwise.
	MIGStrategy MIGStrategy `json:"migStrategy,omitempty"`
	// MIGLayout names the mig-parted layout (a key of a mig-configs
	// document in the same ConfigMap) a "mig" node is partitioned by; the
	// node label nvidia.com/mig.config overrides it.
	MIGLayout string `json:"migLayout,omitempty"`
	// RenameShared serves the GPU resource under its shared name
	// (ResourceNames.Shared, e.g. nvidia.com/gpu.shared), as NVIDIA's
	// renameByDefault does (time-slicing and mps only).
	RenameShared bool `json:"renameShared,omitempty"`
	// FailRequestsGreaterThanOne refuses containers asking more than one
	// device of the shared resource, as NVIDIA's option of that name does
	// (time-slicing and mps only).
	FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne,omitempty"`
}

// NodeConfigSharingModes are the sharing modes a node configuration may
// name: the modes the node agent implements.
func NodeConfigSharingModes() []SharingMode {
	return []SharingMode{SharingShared, SharingExclusive, SharingTimeSlicing, SharingMPS, SharingMIG, SharingMIGDynamic}
}

// Defaults fills the unset fields of c: shared GPUs, 10 shares per GPU
// (1 for exclusive GPUs) and no memory overcommit.
func (c *NodeConfig) Defaults() {
	if c.Sharing == "" {
		c.Sharing = SharingShared
	}
	if c.SharesPerGPU == 0 {
		c.SharesPerGPU = DefaultSharesPerGPU
		if c.Sharing == SharingExclusive {
			c.SharesPerGPU = 1
		}
	}
	if c.MemoryOvercommit == 0 {
		c.MemoryOvercommit = 1
	}
	switch {
	case c.Sharing == SharingMIG && c.MIGStrategy == "":
		c.MIGStrategy = MIGStrategyMixed
	case c.MIGStrategy == "":
		c.MIGStrategy = MIGStrategyNone
	}
}

// Validate checks a configuration after Defaults, with the limits that
// ValidateInventory applies to the inventory built from it.
func (c *NodeConfig) Validate() error {
	if !slices.Contains(NodeConfigSharingModes(), c.Sharing) {
		return fmt.Errorf("sharing %q is not one of %s", c.Sharing, joinQuoted(NodeConfigSharingModes()))
	}
	if err := c.validateMode(); err != nil {
		return err
	}
	if c.SharesPerGPU < 1 || c.SharesPerGPU > MaxSharesLimit {
		return fmt.Errorf("sharesPerGPU %d outside [1, %d]", c.SharesPerGPU, MaxSharesLimit)
	}
	if c.Sharing == SharingExclusive && c.SharesPerGPU != 1 {
		return fmt.Errorf("sharesPerGPU %d with exclusive sharing (must be 1)", c.SharesPerGPU)
	}
	if c.Sharing == SharingMPS && c.SharesPerGPU > MaxMPSClients {
		return fmt.Errorf("sharesPerGPU %d with mps sharing exceeds the %d clients MPS serves per GPU", c.SharesPerGPU, MaxMPSClients)
	}
	if !c.MIGStrategy.Valid() {
		return fmt.Errorf("migStrategy %q is not one of %s", c.MIGStrategy, joinQuoted(MIGStrategies()))
	}
	if c.Sharing == SharingMIG && c.MIGStrategy == MIGStrategyNone {
		return fmt.Errorf("migStrategy %q with mig sharing: MIG devices need the %q or %q strategy", c.MIGStrategy, MIGStrategySingle, MIGStrategyMixed)
	}
	if c.Sharing != SharingMIG && c.MIGStrategy != MIGStrategyNone {
		return fmt.Errorf("migStrategy %q with %s sharing: a MIG strategy needs sharing %q", c.MIGStrategy, c.Sharing, SharingMIG)
	}
	if c.MIGLayout != "" && c.Sharing != SharingMIG {
		return fmt.Errorf("migLayout %q with %s sharing: a MIG layout needs sharing %q", c.MIGLayout, c.Sharing, SharingMIG)
	}
	if (c.RenameShared || c.FailRequestsGreaterThanOne) && c.Sharing != SharingTimeSlicing && c.Sharing != SharingMPS {
		return fmt.Errorf("renameShared or failRequestsGreaterThanOne with %s sharing: they apply to %q and %q only", c.Sharing, SharingTimeSlicing, SharingMPS)
	}
	if math.IsNaN(c.MemoryOvercommit) || c.MemoryOvercommit < 1 || c.MemoryOvercommit > MaxMemoryOvercommit {
		return fmt.Errorf("memoryOvercommit %v outside [1, %v]", c.MemoryOvercommit, MaxMemoryOvercommit)
	}
	seen := make(map[string]bool, len(c.ExcludeGPUs))
	for i, e := range c.ExcludeGPUs {
		if n, err := strconv.Atoi(e); err == nil {
			if n < 0 || n >= MaxGPUsPerNode {
				return fmt.Errorf("excludeGPUs[%d]: index %d outside [0, %d]", i, n, MaxGPUsPerNode-1)
			}
		} else if err := checkUUID(e); err != nil {
			return fmt.Errorf("excludeGPUs[%d]: %w", i, err)
		}
		if seen[e] {
			return fmt.Errorf("excludeGPUs[%d]: %q listed twice", i, e)
		}
		seen[e] = true
	}
	return nil
}

// validateMode checks what a DRA node supports: GPUs shared by consumable
// capacity (shared, enforced by the limiter) or given whole (exclusive).
// Time-slicing, MPS and MIG are the device plugin's; DRA capacities are
// the GPUs' physical memory, so no overcommit.
func (c *NodeConfig) validateMode() error {
	if c.Mode == ModeVolcano {
		return c.validateVolcano()
	}
	if !c.Mode.Valid() {
		return fmt.Errorf("mode %q is not one of %s", c.Mode, joinQuoted(append(NodeModes(), ModeVolcano)))
	}
	if c.Mode != ModeDRA {
		return nil
	}
	if c.Sharing != SharingShared && c.Sharing != SharingExclusive {
		return fmt.Errorf("sharing %q with mode %q: a DRA node shares GPUs by capacity (%q) or gives them whole (%q); %s is served by the device plugin (mode %q)",
			c.Sharing, ModeDRA, SharingShared, SharingExclusive, c.Sharing, ModeDevicePlugin)
	}
	if c.MemoryOvercommit != 1 {
		return fmt.Errorf("memoryOvercommit %v with mode %q: DRA capacities are the GPUs' physical memory (must be 1)", c.MemoryOvercommit, ModeDRA)
	}
	return nil
}
