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
// the container. A pod's own volumes may not be mounted on, under or
// above any of them (the webhook refuses it), so the agent's mounts are
// what the container sees there.
const (
	// ContainerLimiterDir holds the limiter library (read-only).
	ContainerLimiterDir = "/usr/local/tessera"
	// ContainerPreload is the dynamic loader's preload list, naming the
	// limiter (read-only).
	ContainerPreload = "/etc/ld.so.preload"
	// ContainerConfigDir holds the limiter's read-only limits file
	// (limiter.conf) and, where the driver holds the container's GPU
	// memory limits, their confirmation (driver-memory).
	ContainerConfigDir = "/etc/tessera"
	// ContainerStateDir is the container's writable limiter state.
	ContainerStateDir = "/tessera/state"
)

// CDIKindMemoryLimits is the CDI kind ("vendor/class") of the devices
// the node agent writes per container whose GPU memory limits the driver
// holds: their edits run the memory-limits hook.
const CDIKindMemoryLimits = "tessera.io/memory-limits"

// ContainerReservedPaths are the container paths above.
func ContainerReservedPaths() []string {
	return []string{ContainerLimiterDir, ContainerPreload, ContainerConfigDir, ContainerStateDir}
}

// DeviceListStrategy is how a container's GPUs reach the container
// runtime (NVIDIA's device plugin offers the same choice). It decides
// whether a pod's own environment can select devices, so the node agent
// (which answers with it) and the webhook (which refuses what would
// select devices) read the same setting.
type DeviceListStrategy string

const (
	// DeviceListEnvvar: NVIDIA_VISIBLE_DEVICES in the container's
	// environment, which the NVIDIA runtime reads before the container's
	// code runs; a pod's own value would win over the device plugin's.
	DeviceListEnvvar DeviceListStrategy = "envvar"
	// DeviceListCDI: CDI device names (nvidia.com/gpu=<UUID>) in the CRI
	// request; the environment plays no part, provided the NVIDIA runtime
	// ignores it for unprivileged containers
	// (accept-nvidia-visible-devices-envvar-when-unprivileged = false).
	DeviceListCDI DeviceListStrategy = "cdi-cri"
	// DeviceListVolumeMounts: /dev/null mounted at
	// /var/run/nvidia-container-devices/<UUID> per GPU, which the NVIDIA
	// runtime reads when it ignores the environment of unprivileged
	// containers (the same setting).
	DeviceListVolumeMounts DeviceListStrategy = "volume-mounts"
)

// DeviceListStrategies are the strategies, the default first.
func DeviceListStrategies() []DeviceListStrategy {
	return []DeviceListStrategy{DeviceListEnvvar, DeviceListCDI, DeviceListVolumeMounts}
}

// EnvSelectsDevices reports whether, under s, a container's environment
// chooses its devices (s is "" or DeviceListEnvvar).
func (s DeviceListStrategy) EnvSelectsDevices() bool {
	return s == "" || s == DeviceListEnvvar
}

// deviceSelectionEnv are the variables the NVIDIA container runtime reads
// from a container's environment to choose the devices it mounts into
// the container, before any of the container's code runs: the GPUs (or
// MIG devices), the MIG configuration and monitoring devices, and the
// IMEX channels.
var deviceSelectionEnv = []string{
	EnvVisibleDevices,
	"NVIDIA_MIG_CONFIG_DEVICES",
	"NVIDIA_MIG_MONITOR_DEVICES",
	"NVIDIA_IMEX_CHANNELS",
}

// DeviceSelectionEnv lists the variables that select devices where the
// runtime reads the environment (DeviceListStrategy.EnvSelectsDevices).
// Every other variable is the container's own: whatever it says, the
// limiter takes its limits from the read-only limits file when there is
// one (docs/isolation.md), the reconciler holds the container to its
// grant from the host, and a variable the spec could set, the tenant can
// set inside the container anyway.
func DeviceSelectionEnv() []string { return append([]string(nil), deviceSelectionEnv...) }

// SelectsDevices reports whether name is one of DeviceSelectionEnv.
func SelectsDevices(name string) bool {
	for _, n := range deviceSelectionEnv {
		if name == n {
			return true
		}
	}
	return false
}

// EnvPrefixSelectsDevices reports whether prefix followed by some
// non-empty key can be one of DeviceSelectionEnv: envFrom with that
// prefix imports keys the webhook cannot see (they live in a ConfigMap or
// Secret and may change after admission), so only a prefix that reaches
// none of them keeps them out. The empty prefix reaches every name.
func EnvPrefixSelectsDevices(prefix string) bool {
	for _, name := range deviceSelectionEnv {
		if len(prefix) < len(name) && strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// EnvVoidDevices is the value of EnvVisibleDevices under which the NVIDIA
// runtime mounts no GPU and behaves as the plain runtime: the webhook
// writes it into containers that ask for no GPU but import variables it
// cannot see (envFrom), so that an imported NVIDIA_VISIBLE_DEVICES cannot
// select GPUs (a variable in env wins over one from envFrom).
const EnvVoidDevices = "void"
