// Package nvmlmig holds what the node agent's MIG manager and the mock
// NVML that emulates MIG must agree on about NVML's MIG constants (one
// home, so the emulation cannot drift from what the manager asks for).
package nvmlmig

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// ComputeInstanceProfile is the compute-instance profile that spans a GPU
// instance of that many compute slices (one compute instance per GPU
// instance, as mig-parted creates).
func ComputeInstanceProfile(slices int) int {
	switch slices {
	case 1:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
	case 2:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE
	case 3:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE
	case 4:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE
	case 6:
		return nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE
	case 7:
		return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE
	}
	return nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE
}
