package api

import "strings"

// Container environment the node agent sets and the limiter reads. The
// names are the ones HAMi-core reads, so either limiter enforces the same
// allocation record.
const (
	// EnvVisibleDevices lists the container's GPU UUIDs, comma-separated.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvMemoryLimit + "_<i>" is the memory limit of the container's
	// device i, written "<MiB>m"; without the suffix it applies to all.
	EnvMemoryLimit = "CUDA_DEVICE_MEMORY_LIMIT"
	// EnvSMLimit is the compute share in percent (0 or 100: no limit);
	// Tessera's limiter also reads EnvSMLimit + "_<i>" per device.
	EnvSMLimit = "CUDA_DEVICE_SM_LIMIT"
	// EnvSharedCache is the path of the limiter's shared-state file, one
	// per container.
	EnvSharedCache = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
)

// Paths inside a GPU container where the node agent mounts what it gives
// the container. A pod's own volumes may not be mounted on or under any of
// them (the webhook refuses it), so the agent's mounts are what the
// container sees there.
const (
	// ContainerLimiterDir holds the limiter library (read-only).
	ContainerLimiterDir = "/usr/local/tessera"
	// ContainerPreload is the dynamic loader's preload list, naming the
	// limiter (read-only).
	ContainerPreload = "/etc/ld.so.preload"
	// ContainerConfigDir holds the limiter's read-only limits file
	// (limiter.conf).
	ContainerConfigDir = "/etc/tessera"
	// ContainerStateDir is the container's writable limiter state.
	ContainerStateDir = "/tessera/state"
)

// ContainerReservedPaths are the container paths above.
func ContainerReservedPaths() []string {
	return []string{ContainerLimiterDir, ContainerPreload, ContainerConfigDir, ContainerStateDir}
}

// reservedEnvNames are variables that choose a container's devices (read
// by the NVIDIA container runtime), load code ahead of the limiter, or
// are HAMi-core settings that loosen its limits (Tessera's limiter does
// not implement them).
var reservedEnvNames = map[string]bool{
	EnvVisibleDevices:             true,
	"NVIDIA_MIG_CONFIG_DEVICES":   true,
	"NVIDIA_MIG_MONITOR_DEVICES":  true,
	"NVIDIA_IMEX_CHANNELS":        true,
	"LD_PRELOAD":                  true,
	"LD_AUDIT":                    true,
	"CUDA_DISABLE_CONTROL":        true,
	"CUDA_OVERSUBSCRIBE":          true,
	"GPU_CORE_UTILIZATION_POLICY": true,
	"CUDA_TASK_PRIORITY":          true,
}

// reservedEnvPrefixes: the limiter's variables (CUDA_DEVICE_MEMORY_LIMIT*,
// CUDA_DEVICE_SM_LIMIT*, CUDA_DEVICE_MEMORY_SHARED_CACHE), MPS's
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
// the pipe and log directories) and Tessera's own.
var reservedEnvPrefixes = []string{"CUDA_DEVICE_", "CUDA_MPS_", "TESSERA_"}

// envAllowed are names under a reserved prefix that change no limit.
var envAllowed = map[string]bool{"TESSERA_LIMITER_DEBUG": true}

// ReservedEnv reports whether a GPU container's spec may not set the
// environment variable name: the node agent sets it, or it selects the
// container's devices, or it would load code ahead of the limiter or
// loosen a limit. The kubelet puts a pod's own variables after the device
// plugin's, so a reserved name in the spec would win.
func ReservedEnv(name string) bool {
	if envAllowed[name] {
		return false
	}
	if reservedEnvNames[name] {
		return true
	}
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// EnvPrefixReaches reports whether prefix followed by some non-empty name
// can be a reserved variable: envFrom with that prefix imports keys the
// webhook cannot see (they live in a ConfigMap or Secret and may change
// after admission), so only a prefix that can reach no reserved name keeps
// them out. The empty prefix reaches every name.
func EnvPrefixReaches(prefix string) bool {
	for name := range reservedEnvNames {
		if len(prefix) < len(name) && strings.HasPrefix(name, prefix) {
			return true
		}
	}
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(p, prefix) || strings.HasPrefix(prefix, p) {
			return true
		}
	}
	return false
}
