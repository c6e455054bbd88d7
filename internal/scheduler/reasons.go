package scheduler

// What a node that does not fit a pod tells kube-scheduler.

import (
	"github.com/tessera-gpu/tessera/internal/placement"
)

// unresolvable reasons cannot be cured by removing pods from the node.
func unresolvable(k placement.ReasonKind) bool {
	switch k {
	case placement.ReasonNoGPUs, placement.ReasonUnhealthy, placement.ReasonModelExcluded,
		placement.ReasonModelNotIncluded, placement.ReasonUUID, placement.ReasonGPUMemoryPhysical:
		return true
	}
	return false
}

func shortReason(k placement.ReasonKind) string {
	switch k {
	case placement.ReasonNoGPUs:
		return "node has no Tessera GPUs"
	case placement.ReasonGPUMemory, placement.ReasonGPUMemoryPhysical:
		return "not enough free GPU memory"
	case placement.ReasonGPUCores:
		return "not enough free GPU cores"
	case placement.ReasonShares:
		return "GPU share slots exhausted"
	case placement.ReasonWholeGPUs, placement.ReasonGPUCount:
		return "not enough free GPUs"
	case placement.ReasonModelExcluded, placement.ReasonModelNotIncluded, placement.ReasonUUID:
		return "GPUs not selected by the pod's GPU selectors"
	case placement.ReasonSharingMode:
		return "GPUs offered only whole (exclusive mode)"
	case placement.ReasonHeldWhole:
		return "GPUs held whole by other pods"
	case placement.ReasonUnhealthy:
		return "GPUs unhealthy"
	case placement.ReasonNUMA:
		return "no NUMA node with enough suitable GPUs"
	case placement.ReasonCPU, placement.ReasonMemory:
		return "not enough CPU or memory"
	}
	return "GPU request does not fit: " + k.String()
}
