package api

import "testing"

func TestSelectsDevices(t *testing.T) {
	for name, want := range map[string]bool{
		"NVIDIA_VISIBLE_DEVICES":     true,
		"NVIDIA_MIG_CONFIG_DEVICES":  true,
		"NVIDIA_MIG_MONITOR_DEVICES": true,
		"NVIDIA_IMEX_CHANNELS":       true,
		// the limiter's variables: the read-only limits file wins over them
		"CUDA_DEVICE_MEMORY_LIMIT_0":      false,
		"CUDA_DEVICE_SM_LIMIT":            false,
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": false,
		// read by CUDA inside the container, select no device
		"CUDA_DEVICE_ORDER":           false,
		"CUDA_DEVICE_MAX_CONNECTIONS": false,
		"CUDA_VISIBLE_DEVICES":        false,
		"CUDA_MPS_PIPE_DIRECTORY":     false,
		"LD_PRELOAD":                  false,
		"LD_AUDIT":                    false,
		"TESSERA_SM_ELASTIC":          false,
		"GPU_CORE_UTILIZATION_POLICY": false,
		"NVIDIA_DRIVER_CAPABILITIES":  false,
		"PATH":                        false,
	} {
		if got := SelectsDevices(name); got != want {
			t.Errorf("SelectsDevices(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestEnvPrefixSelectsDevices(t *testing.T) {
	for prefix, want := range map[string]bool{
		"":                         true,
		"N":                        true,
		"NVIDIA_":                  true,
		"NVIDIA_VISIBLE_":          true,
		"NVIDIA_VISIBLE_DEVICES":   false, // the name itself needs an empty key
		"CUDA_":                    false,
		"CUDA_DEVICE_MEMORY_":      false,
		"LD_":                      false,
		"TESSERA_":                 false,
		"APP_":                     false,
		"NV_":                      false,
		"NVIDIA_DRIVER_":           false,
		"NVIDIA_VISIBLE_DEVICES_X": false,
	} {
		if got := EnvPrefixSelectsDevices(prefix); got != want {
			t.Errorf("EnvPrefixSelectsDevices(%q) = %v, want %v", prefix, got, want)
		}
	}
}

func TestEnvSelectsDevicesByStrategy(t *testing.T) {
	for s, want := range map[DeviceListStrategy]bool{"": true, DeviceListEnvvar: true, DeviceListCDI: false, DeviceListVolumeMounts: false} {
		if got := s.EnvSelectsDevices(); got != want {
			t.Errorf("%q: %v, want %v", s, got, want)
		}
	}
}
