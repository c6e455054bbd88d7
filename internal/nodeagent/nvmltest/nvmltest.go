// Package nvmltest completes go-nvml's mock servers (dgxa100, dgxh100) with
// what they leave unset and the node agent reads: PCI bus IDs, NUMA nodes,
// NVLink wiring, PCIe topology and an event set tests can inject events
// into. It is used by tests only.
package nvmltest

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Node is a mock server plus the event queue behind its event set.
type Node struct {
	*server.Server
	Events *EventQueue

	migMu sync.Mutex
	mig   map[int]*migGPU // by device position; see mig.go

	utilMu sync.Mutex
	util   map[int]nvml.Utilization  // by device position; zero when unset
	procSM map[int]map[uint32]uint32 // device position → host PID → SM %
}

// SetUtilization sets what GetUtilizationRates reports for device i.
func (n *Node) SetUtilization(i int, gpu, memory uint32) {
	n.utilMu.Lock()
	defer n.utilMu.Unlock()
	n.util[i] = nvml.Utilization{Gpu: gpu, Memory: memory}
}

// SetProcessSM sets the SM utilisation GetProcessUtilization reports for
// the process hostPID on device i (0 removes the sample).
func (n *Node) SetProcessSM(i int, hostPID, sm uint32) {
	n.utilMu.Lock()
	defer n.utilMu.Unlock()
	if n.procSM[i] == nil {
		n.procSM[i] = map[uint32]uint32{}
	}
	if sm == 0 {
		delete(n.procSM[i], hostPID)
		return
	}
	n.procSM[i][hostPID] = sm
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

// DGXA100 is an 8× A100 node: 12 NVLinks per GPU through NVSwitch, GPUs 0-3
// on NUMA node 0 and 4-7 on node 1.
func DGXA100() *Node { return Complete(dgxa100.New(), Wiring{SwitchLinks: 12, GPUsPerNUMA: 4}) }

// DGXH100 is an 8× H100 node with 18 NVLinks per GPU.
func DGXH100() *Node { return Complete(dgxh100.New(), Wiring{SwitchLinks: 18, GPUsPerNUMA: 4}) }

// PCIeA100 is the dgxa100 server's GPUs without NVLink: the links come
// from the PCIe topology.
func PCIeA100() *Node { return Complete(dgxa100.New(), Wiring{GPUsPerNUMA: 4}) }

// Complete fills in the functions the agent calls that the mock leaves nil.
func Complete(s *server.Server, w Wiring) *Node {
	n := &Node{Server: s, Events: NewEventQueue(), util: map[int]nvml.Utilization{}, procSM: map[int]map[uint32]uint32{}}
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
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			n.utilMu.Lock()
			defer n.utilMu.Unlock()
			return n.util[i], nvml.SUCCESS
		}
		dev.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			n.utilMu.Lock()
			defer n.utilMu.Unlock()
			var out []nvml.ProcessUtilizationSample
			for pid, sm := range n.procSM[i] {
				out = append(out, nvml.ProcessUtilizationSample{Pid: pid, SmUtil: sm, TimeStamp: uint64(time.Now().UnixMicro())})
			}
			return out, nvml.SUCCESS
		}
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return n.Events.set, nvml.SUCCESS
	}
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

// EventQueue feeds events to the mock event set's Wait.
type EventQueue struct {
	mu     sync.Mutex
	queue  []nvml.EventData
	ready  chan struct{}
	set    *mock.EventSet
	waits  int
	closed bool
}

// NewEventQueue returns an empty queue with its event set.
func NewEventQueue() *EventQueue {
	q := &EventQueue{ready: make(chan struct{}, 1)}
	q.set = &mock.EventSet{
		WaitFunc: q.wait,
		FreeFunc: func() nvml.Return {
			q.mu.Lock()
			q.closed = true
			q.mu.Unlock()
			return nvml.SUCCESS
		},
	}
	return q
}

// Inject queues an event for the device.
func (q *EventQueue) Inject(d nvml.Device, eventType, data uint64) {
	q.mu.Lock()
	q.queue = append(q.queue, nvml.EventData{Device: d, EventType: eventType, EventData: data})
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// Waits returns how many times Wait has been called.
func (q *EventQueue) Waits() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waits
}

// wait returns the next event or ERROR_TIMEOUT after at most timeout ms.
func (q *EventQueue) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	deadline := time.After(time.Duration(timeoutMs) * time.Millisecond)
	for {
		q.mu.Lock()
		q.waits++
		if len(q.queue) > 0 {
			e := q.queue[0]
			q.queue = q.queue[1:]
			q.mu.Unlock()
			return e, nvml.SUCCESS
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-deadline:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
}
