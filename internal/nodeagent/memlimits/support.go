// Package memlimits is what the node agent knows of the driver's own GPU
// memory limits: NVIDIA's r615 driver partitions a GPU's memory per cgroup
// v2 group (nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1:
// a soft limit guaranteed to the group, a hard limit past which its
// allocations fail), on a GPU not in MIG mode. Detect says, per GPU,
// whether the node's driver can; the agent logs it and publishes it as a
// metric. The limiter enforces the containers' memory on every GPU either
// way (docs/isolation.md, "Which layer enforces what").
package memlimits

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
)

// MinDriverMajor is the first driver release that partitions GPU memory
// per cgroup (r615, CUDA 13.4).
const MinDriverMajor = 615

// The NVML entry points partitioning needs.
var symbols = []string{"nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"}

// Support says whether the driver can partition a GPU's memory per
// cgroup, and when not, why.
type Support struct {
	OK     bool
	Reason string
}

// DriverMajor is the major release of an NVIDIA driver version
// ("615.27.01" → 615).
func DriverMajor(version string) (int, error) {
	major, _, _ := strings.Cut(strings.TrimSpace(version), ".")
	n, err := strconv.Atoi(major)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("driver version %q is not <major>.<minor>", version)
	}
	return n, nil
}

// Detect says, for each device (by UUID), whether its driver can
// partition its memory per cgroup: a driver (version, as NVML reports it)
// of r615 or later whose NVML exports both calls, a cgroup v2 hierarchy
// mounted (mount, or mountErr why not), the GPU not in MIG mode
// (migEnabled), and the driver answering a query of the hierarchy's root
// group (NOT_SUPPORTED there: this GPU is not partitioned).
func Detect(version string, lib nvml.Interface, devices map[string]nvml.Device, migEnabled map[string]bool, mount cgroup2.Mount, mountErr error) map[string]Support {
	out := make(map[string]Support, len(devices))
	all := func(s Support) map[string]Support {
		for uuid := range devices {
			out[uuid] = s
		}
		return out
	}
	major, err := DriverMajor(version)
	if err != nil {
		return all(Support{Reason: err.Error()})
	}
	if major < MinDriverMajor {
		return all(Support{Reason: fmt.Sprintf("driver %s is older than r%d", version, MinDriverMajor)})
	}
	for _, sym := range symbols {
		if err := lib.Extensions().LookupSymbol(sym); err != nil {
			return all(Support{Reason: fmt.Sprintf("driver %s's NVML has no %s", version, sym)})
		}
	}
	if mountErr != nil {
		return all(Support{Reason: fmt.Sprintf("no cgroup v2 hierarchy: %v", mountErr)})
	}
	for uuid, dev := range devices {
		if migEnabled[uuid] {
			out[uuid] = Support{Reason: "the GPU is in MIG mode"}
			continue
		}
		switch _, ret := dev.GetMemoryLimits_v1(mount.Point); ret {
		case nvml.SUCCESS, nvml.ERROR_NOT_FOUND:
			out[uuid] = Support{OK: true}
		case nvml.ERROR_NOT_SUPPORTED:
			out[uuid] = Support{Reason: fmt.Sprintf("driver %s does not partition this GPU's memory", version)}
		default:
			out[uuid] = Support{Reason: fmt.Sprintf("the driver's memory limits of %s: %v", mount.Point, ret)}
		}
	}
	return out
}
