package api

import (
	"fmt"
	"strings"
)

// DefaultResourcePrefix is the prefix of the extended resources pods request.
// It is HAMi's prefix, so HAMi manifests run on Tessera unchanged.
const DefaultResourcePrefix = "nvidia.com"

// Suffixes of the resource names; the full name is prefix + "/" + suffix.
const (
	resourceGPU              = "gpu"
	resourceMemory           = "gpumem"
	resourceMemoryPercentage = "gpumem-percentage"
	resourceMemoryCeiling    = "gpumem-ceiling"
	resourceCores            = "gpucores"
)

// ResourceNames are the extended resource names Tessera serves. The prefix is
// configurable so that Tessera can run beside NVIDIA's device plugin (which
// owns nvidia.com/gpu) under a prefix of its own, e.g. "tessera.io".
type ResourceNames struct {
	// Prefix is the resource prefix the names share ("nvidia.com").
	Prefix string
	// GPU is the number of GPUs a container uses (prefix/gpu).
	GPU string
	// Memory is the memory per GPU in MiB (prefix/gpumem).
	Memory string
	// MemoryPercentage is the memory per GPU in percent of the GPU's
	// memory (prefix/gpumem-percentage).
	MemoryPercentage string
	// Cores is the compute per GPU in percent of its SMs; 100 means
	// exclusive compute (prefix/gpucores).
	Cores string
	// MemoryCeiling is the most memory per GPU in MiB a container may use
	// above its guarantee (Memory) while no other container's guarantee
	// needs it (prefix/gpumem-ceiling). Kubernetes requires an extended
	// resource's request to equal its limit, so the ceiling is a resource
	// of its own rather than a limit of Memory.
	MemoryCeiling string
}

// DefaultResourceNames are the names under DefaultResourcePrefix.
var DefaultResourceNames = MustResourceNames(DefaultResourcePrefix)

// NewResourceNames returns the resource names under prefix, which must be a
// DNS-1123 subdomain as Kubernetes requires of extended resource prefixes.
func NewResourceNames(prefix string) (ResourceNames, error) {
	if err := validateDNSSubdomain(prefix); err != nil {
		return ResourceNames{}, fmt.Errorf("resource prefix %q: %w", prefix, err)
	}
	return ResourceNames{
		Prefix:           prefix,
		GPU:              prefix + "/" + resourceGPU,
		Memory:           prefix + "/" + resourceMemory,
		MemoryPercentage: prefix + "/" + resourceMemoryPercentage,
		Cores:            prefix + "/" + resourceCores,
		MemoryCeiling:    prefix + "/" + resourceMemoryCeiling,
	}, nil
}

// MustResourceNames is NewResourceNames for prefixes that are constants of
// the program; it panics on an invalid prefix. Use NewResourceNames for
// prefixes that come from configuration.
func MustResourceNames(prefix string) ResourceNames {
	n, err := NewResourceNames(prefix)
	if err != nil {
		panic(err)
	}
	return n
}

// All returns every resource name, the GPU count first.
func (n ResourceNames) All() []string {
	return []string{n.GPU, n.Memory, n.MemoryPercentage, n.Cores, n.MemoryCeiling}
}

// sharedSuffix is what NVIDIA's renameByDefault appends to a shared
// resource's name ("nvidia.com/gpu" → "nvidia.com/gpu.shared").
const sharedSuffix = ".shared"

// Shared is the name NVIDIA's device plugin gives a resource it shares
// under renameByDefault: name + ".shared" (nvidia.com/gpu.shared).
func (n ResourceNames) Shared(name string) string { return name + sharedSuffix }

// IsGPUResource reports whether name is one of n's resource names: those
// of All, the renamed shared GPU resource (Shared(GPU)) and the MIG device
// resources of the mixed strategy (MIG).
func (n ResourceNames) IsGPUResource(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range n.All() {
		if name == r {
			return true
		}
	}
	return n.IsCountResource(name)
}

// IsCountResource reports whether name is a resource whose value counts
// devices the kubelet allocates from a device plugin: the GPU resource,
// its shared rename (Shared(GPU)) or a MIG profile's resource (MIG).
func (n ResourceNames) IsCountResource(name string) bool {
	if name == n.GPU || name == n.Shared(n.GPU) {
		return true
	}
	_, ok := n.MIGProfileOf(name)
	return ok
}

// PseudoResources returns the names no kubelet advertises (memory, memory
// percentage, cores, memory ceiling): they only qualify the GPU count, so
// the scheduler accounts for them itself and the webhook may need to hide
// them from the kubelet's admission.
func (n ResourceNames) PseudoResources() []string {
	return []string{n.Memory, n.MemoryPercentage, n.Cores, n.MemoryCeiling}
}

// Limits of a DNS-1123 subdomain.
const (
	maxDNSSubdomainLen = 253
	maxDNSLabelLen     = 63
)

// validateDNSSubdomain checks s against RFC 1123 subdomain rules: dot
// separated labels of lowercase letters, digits and '-', each starting and
// ending with a letter or digit.
func validateDNSSubdomain(s string) error {
	if s == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(s) > maxDNSSubdomainLen {
		return fmt.Errorf("length %d exceeds %d characters", len(s), maxDNSSubdomainLen)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" {
			return fmt.Errorf("empty label (a DNS-1123 subdomain has no leading, trailing or double dots)")
		}
		if len(label) > maxDNSLabelLen {
			return fmt.Errorf("label %q is %d characters, more than %d", label, len(label), maxDNSLabelLen)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("label %q contains %q (only lowercase letters, digits and '-' are allowed)", label, c)
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q must start and end with a lowercase letter or digit", label)
		}
	}
	return nil
}
