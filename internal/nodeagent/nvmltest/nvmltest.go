// Package nvmltest is for tests only: the emulated NVML of
// internal/lab/nvmlemu with what tests script on top of it — events
// injected into the event set (XIDs, ECC errors), utilisation figures set
// by hand — and fixtures of go-nvml's DGX servers. No binary links it
// (cmd/tessera-lab runs nvmlemu itself).
package nvmltest

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/tessera-gpu/tessera/internal/lab/nvmlemu"
)

// Node is an emulated node whose events and utilisation a test sets.
type Node struct {
	*nvmlemu.Node
	Events *EventQueue

	utilMu sync.Mutex
	util   map[int]nvml.Utilization  // by device position; zero when unset
	procSM map[int]map[uint32]uint32 // device position → host PID → SM %
}

// Wiring says how the GPUs of a mock node are connected.
type Wiring = nvmlemu.Wiring

// Complete is nvmlemu.Complete with the test's event queue and
// utilisation figures.
func Complete(s *server.Server, w Wiring) *Node { return scripted(nvmlemu.Complete(s, w)) }

// NewModel is nvmlemu.NewModel with the test's event queue and
// utilisation figures.
func NewModel(name string, count int, seed string) (*Node, error) {
	n, err := nvmlemu.NewModel(name, count, seed)
	if err != nil {
		return nil, err
	}
	return scripted(n), nil
}

// DGXA100 is an 8× A100 node: 12 NVLinks per GPU through NVSwitch, GPUs 0-3
// on NUMA node 0 and 4-7 on node 1.
func DGXA100() *Node { return Complete(dgxa100.New(), Wiring{SwitchLinks: 12, GPUsPerNUMA: 4}) }

// DGXH100 is an 8× H100 node with 18 NVLinks per GPU.
func DGXH100() *Node { return Complete(dgxh100.New(), Wiring{SwitchLinks: 18, GPUsPerNUMA: 4}) }

// PCIeA100 is the dgxa100 server's GPUs without NVLink: the links come
// from the PCIe topology.
func PCIeA100() *Node { return Complete(dgxa100.New(), Wiring{GPUsPerNUMA: 4}) }

// scripted answers the node's event set from a queue the test fills and
// its utilisation queries from SetUtilization and SetProcessSM.
func scripted(e *nvmlemu.Node) *Node {
	n := &Node{Node: e, Events: NewEventQueue(), util: map[int]nvml.Utilization{}, procSM: map[int]map[uint32]uint32{}}
	for i, d := range e.Devices {
		dev := d.(*server.Device)
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
	e.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return n.Events.set, nvml.SUCCESS }
	return n
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
