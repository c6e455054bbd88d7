package api

import "testing"

func TestReservedEnv(t *testing.T) {
	for name, want := range map[string]bool{
		"NVIDIA_VISIBLE_DEVICES":          true,
		"CUDA_DEVICE_MEMORY_LIMIT_0":      true,
		"CUDA_DEVICE_MEMORY_LIMIT_":       true,
		"CUDA_DEVICE_SM_LIMIT":            true,
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": true,
		"CUDA_MPS_PIPE_DIRECTORY":         true,
		"LD_PRELOAD":                      true,
		"LD_AUDIT":                        true,
		"TESSERA_SM_ELASTIC":              true,
		"GPU_CORE_UTILIZATION_POLICY":     true,
		"TESSERA_LIMITER_DEBUG":           false,
		"CUDA_VISIBLE_DEVICES":            false,
		"NVIDIA_DRIVER_CAPABILITIES":      false,
		"LD_LIBRARY_PATH":                 false,
		"PATH":                            false,
	} {
		if got := ReservedEnv(name); got != want {
			t.Errorf("ReservedEnv(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestEnvPrefixReaches(t *testing.T) {
	for prefix, want := range map[string]bool{
		"":                      true,
		"N":                     true,
		"NVIDIA_":               true,
		"CUDA_":                 true,
		"CUDA_DEVICE_MEMORY_":   true,
		"TESSERA_LIMITER_DEBUG": true, // + "X" is reserved
		"LD_":                   true,
		"LD_PRELOAD":            false, // the name itself needs an empty key
		"APP_":                  false,
		"CUDA_VISIBLE_":         false,
		"NV_":                   false,
	} {
		if got := EnvPrefixReaches(prefix); got != want {
			t.Errorf("EnvPrefixReaches(%q) = %v, want %v", prefix, got, want)
		}
	}
}
