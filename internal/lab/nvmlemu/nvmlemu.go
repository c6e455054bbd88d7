// Package nvmlemu is the emulated cluster's NVML: go-nvml's mock servers
// completed with what they leave unset and the node agent reads (PCI bus
// IDs, NUMA nodes, NVLink wiring, PCIe topology, an event set), MIG
// emulated from internal/mig's documented tables, and memory, process and
// utilisation queries answered from what the node's processes really do
// (UseUsage; in tessera-lab, the fake GPUs' shared state of
// internal/lab/fakegpu). tessera-lab's node agents run over it, and so do
// the node agent's tests (internal/nodeagent/nvmltest adds what only tests
// script: injected events, utilisation figures, DGX fixtures).
package nvmlemu

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Node is an emulated node's NVML: a mock server, completed.
type Node struct {
	*server.Server

	migMu sync.Mutex
	mig   map[int]*migGPU // by device position; see mig.go
}

// Wiring says how the GPUs of a mock node are connected.
type Wiring struct {
	// SwitchLinks is the number of NVLinks from each GPU to NVSwitches
	// (12 on DGX A100, 18 on DGX H100); 0 = no NVLink.
	SwitchLinks int
	// GPUsPerNUMA is how many consecutive GPUs share a NUMA node and, on
	// PCIe, a host bridge; pairs of consecutive GPUs share a PCIe switch.
	GPUsPerNUMA int
	// NoNUMA makes GetNumaNodeId unsupported (older drivers).
	NoNUMA bool
}

// Complete fills in the functions the agent calls that the mock leaves nil.
func Complete(s *server.Server, w Wiring) *Node {
	n := &Node{Server: s}
	busOf := func(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x10*(i+1)) }
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.PciBusID = busOf(i)
		i := i
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			p := nvml.PciInfo{PciDeviceId: dev.Config.PciDeviceId, Bus: uint32(0x10 * (i + 1))}
			copy(p.BusId[:], toInt8(dev.PciBusID))
			return p, nvml.SUCCESS
		}
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) {
			if w.NoNUMA {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return i / max(w.GPUsPerNUMA, 1), nvml.SUCCESS
		}
		dev.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
		}
		dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if w.SwitchLinks == 0 {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if link < w.SwitchLinks {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			copy(p.BusId[:], toInt8(fmt.Sprintf("00000000:%02X:00.0", 0xC0+link%6))) // six NVSwitches
			return p, nvml.SUCCESS
		}
		dev.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			j := other.(*server.Device).Index
			per := max(w.GPUsPerNUMA, 1)
			switch {
			case i/2 == j/2:
				return nvml.TOPOLOGY_SINGLE, nvml.SUCCESS
			case i/per == j/per:
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
			return nvml.SUCCESS
		}
		// An idle GPU until UseUsage says what runs on it.
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.SUCCESS }
		dev.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return nil, nvml.SUCCESS }
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return idleEvents(), nvml.SUCCESS }
	n.emulateMIG()
	return n
}

// Device returns the mock device at index i.
func (n *Node) Device(i int) *server.Device { return n.Devices[i].(*server.Device) }

func toInt8(s string) []int8 {
	b := make([]int8, len(s))
	for i := range s {
		b[i] = int8(s[i])
	}
	return b
}

// idleEvents is the event set of GPUs that raise no event: its Wait
// returns ERROR_TIMEOUT when its timeout ends, as NVML's does.
func idleEvents() nvml.EventSet {
	return &mock.EventSet{
		WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			time.Sleep(time.Duration(timeoutMs) * time.Millisecond)
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
}
