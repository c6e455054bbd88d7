package nvmlemu

import (
	"errors"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// PartitioningDriverVersion is the driver version a node whose driver
// partitions GPU memory per cgroup reports (NVIDIA's r615); the others
// report the mock's 550.
const PartitioningDriverVersion = "615.00.00"

// Limits is the driver's table of memory limits per cgroup, by GPU UUID
// (on tessera-lab's nodes, the fake GPUs' own, internal/lab/fakegpu).
type Limits interface {
	SetLimits(uuid, dir string, soft, hard uint64) error
	GetLimits(uuid, dir string) (soft, hard, used uint64, err error)
}

// Errors of Limits, mapped to NVML's return codes (an error that matches
// none is ERROR_UNKNOWN).
type LimitErrors map[error]nvml.Return

// UsePartitioning makes the node's driver an r615 one that partitions
// GPU memory per cgroup: the driver version is PartitioningDriverVersion
// and nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1 read and write l,
// their errors mapped by codes. MIG devices are the hardware's to
// partition: not theirs.
func (n *Node) UsePartitioning(l Limits, codes LimitErrors) {
	n.DriverVersion = PartitioningDriverVersion
	ret := func(err error) nvml.Return {
		if err == nil {
			return nvml.SUCCESS
		}
		for e, r := range codes {
			if errors.Is(err, e) {
				return r
			}
		}
		return nvml.ERROR_UNKNOWN
	}
	for i := range n.Devices {
		dev := n.Device(i)
		uuid := dev.UUID
		dev.SetMemoryLimits_v1Func = func(ns string, soft, hard uint64) nvml.Return {
			return ret(l.SetLimits(uuid, ns, soft, hard))
		}
		dev.GetMemoryLimits_v1Func = func(ns string) (nvml.MemoryLimits_v1, nvml.Return) {
			soft, hard, used, err := l.GetLimits(uuid, ns)
			return nvml.MemoryLimits_v1{NameSpace: ns, SoftLimit: soft, HardLimit: hard, CurrentUsed: used}, ret(err)
		}
	}
}
