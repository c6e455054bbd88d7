package nvmlemu

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Usage is what the processes on a node's GPUs use, by GPU UUID: on an
// emulated node of tessera-lab, the state its fake GPUs share with the
// containers' processes (internal/lab/fakegpu).
type Usage interface {
	// UsedBytes is the device memory the GPU's processes hold.
	UsedBytes(uuid string) (uint64, error)
	// Processes are the GPU's processes, by host pid.
	Processes(uuid string) ([]nvml.ProcessInfo, error)
	// Utilization is the GPU's SM utilisation (percent) and each
	// process's, since the previous call.
	Utilization(uuid string) (uint32, []nvml.ProcessUtilizationSample, error)
}

// UseUsage makes the node's memory, process and utilisation queries
// answer from u instead of an idle GPU: memory used and free, the compute
// process lists, utilisation rates and per-process utilisation.
func (n *Node) UseUsage(u Usage) {
	for _, d := range n.Devices {
		dev := d.(*server.Device)
		total := dev.MemoryInfo.Total
		uuid := func() string {
			dev.RLock()
			defer dev.RUnlock()
			return dev.UUID
		}
		memory := func() (uint64, uint64, nvml.Return) {
			used, err := u.UsedBytes(uuid())
			if err != nil {
				return 0, 0, nvml.ERROR_UNKNOWN
			}
			return min(used, total), total - min(used, total), nvml.SUCCESS
		}
		dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			used, free, ret := memory()
			return nvml.Memory{Total: total, Used: used, Free: free}, ret
		}
		dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			used, free, ret := memory()
			return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: total, Used: used, Free: free}, ret
		}
		procs := func() ([]nvml.ProcessInfo, nvml.Return) {
			p, err := u.Processes(uuid())
			if err != nil {
				return nil, nvml.ERROR_UNKNOWN
			}
			return p, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = procs
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		dev.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			gpu, _, err := u.Utilization(uuid())
			if err != nil {
				return nvml.Utilization{}, nvml.ERROR_UNKNOWN
			}
			return nvml.Utilization{Gpu: gpu}, nvml.SUCCESS
		}
		dev.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			_, per, err := u.Utilization(uuid())
			if err != nil {
				return nil, nvml.ERROR_UNKNOWN
			}
			return per, nvml.SUCCESS
		}
	}
}
