package api

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
