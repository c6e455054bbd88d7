package health

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/testenv/poll"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func start(t *testing.T, n *nvmltest.Node, opts Options) (*Monitor, *fakeClock) {
	t.Helper()
	clk := &fakeClock{now: time.Unix(1000, 0)}
	opts.Now = clk.Now
	opts.WaitTimeout = 5 * time.Millisecond
	handles := map[string]nvml.Device{}
	for i := range n.Devices {
		handles[n.Device(i).UUID] = n.Devices[i]
	}
	m := New(n, handles, opts, ktesting.NewLogger(t, ktesting.NewConfig()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return m, clk
}

// settle waits until the monitor has consumed everything injected.
func settle(t *testing.T, n *nvmltest.Node) {
	t.Helper()
	w := n.Events.Waits()
	poll.Until(t, "the event loop", 5*time.Second, func() bool { return n.Events.Waits() > w+2 })
}

func TestXIDMakesUnhealthyAndRecovers(t *testing.T) {
	n := nvmltest.DGXA100()
	m, clk := start(t, n, Options{IgnoredXIDs: DefaultIgnoredXIDs, RecoveryPeriod: time.Minute})
	u := n.Device(2).UUID
	n.Events.Inject(n.Devices[2], nvml.EventTypeXidCriticalError, 79)
	<-m.Changes()
	s := m.Snapshot()
	if s[u].Healthy || s[u].Reason != "XID 79" {
		t.Fatalf("gpu 2: %+v", s[u])
	}
	for i := range n.Devices {
		if i != 2 && !s[n.Device(i).UUID].Healthy {
			t.Errorf("gpu %d unhealthy", i)
		}
	}
	// A new error half-way restarts the period.
	clk.Add(40 * time.Second)
	n.Events.Inject(n.Devices[2], nvml.EventTypeDoubleBitEccError, 0)
	settle(t, n)
	clk.Add(40 * time.Second)
	settle(t, n)
	if s := m.Snapshot()[u]; s.Healthy || s.Reason != "double-bit ECC error" {
		t.Fatalf("recovered too early: %+v", s)
	}
	clk.Add(21 * time.Second)
	<-m.Changes()
	if s := m.Snapshot()[u]; !s.Healthy || s.Reason != "" {
		t.Fatalf("not recovered: %+v", s)
	}
}

func TestIgnoredXIDs(t *testing.T) {
	n := nvmltest.DGXA100()
	m, _ := start(t, n, Options{IgnoredXIDs: []uint64{13, 31, 43, 45, 68, 109, 94}})
	for _, x := range []uint64{13, 31, 43, 45, 68, 109, 94} {
		n.Events.Inject(n.Devices[0], nvml.EventTypeXidCriticalError, x)
	}
	n.Events.Inject(n.Devices[1], nvml.EventTypeSingleBitEccError, 0)
	settle(t, n)
	for u, s := range m.Snapshot() {
		if !s.Healthy {
			t.Errorf("%s unhealthy: %+v", u, s)
		}
	}
	// The list is configurable: without it 13 counts.
	n2 := nvmltest.DGXA100()
	m2, _ := start(t, n2, Options{})
	n2.Events.Inject(n2.Devices[0], nvml.EventTypeXidCriticalError, 13)
	<-m2.Changes()
	if s := m2.Snapshot()[n2.Device(0).UUID]; s.Healthy || s.Reason != "XID 13" {
		t.Errorf("%+v", s)
	}
}

func TestUnknownDeviceAndLostMarkAll(t *testing.T) {
	n := nvmltest.DGXA100()
	m, clk := start(t, n, Options{RecoveryPeriod: time.Second})
	n.Events.Inject(nil, nvml.EventTypeXidCriticalError, 48)
	<-m.Changes()
	settle(t, n)
	for u, s := range m.Snapshot() {
		if s.Healthy || s.Reason != "XID 48 (device unknown)" {
			t.Errorf("%s: %+v", u, s)
		}
	}
	// GPU 4 no longer answers: everything else recovers, it does not.
	n.Device(4).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	clk.Add(2 * time.Second)
	poll.Until(t, "recovery", 5*time.Second, func() bool { return m.Snapshot()[n.Device(0).UUID].Healthy })
	settle(t, n)
	s := m.Snapshot()
	for i := range n.Devices {
		if s[n.Device(i).UUID].Healthy == (i == 4) {
			t.Errorf("gpu %d: %+v", i, s[n.Device(i).UUID])
		}
	}
}

func TestNoRecoveryWhenDisabled(t *testing.T) {
	n := nvmltest.DGXH100()
	m, clk := start(t, n, Options{})
	n.Events.Inject(n.Devices[7], nvml.EventTypeGpuUnavailableError, 0)
	<-m.Changes()
	clk.Add(24 * time.Hour)
	settle(t, n)
	if s := m.Snapshot()[n.Device(7).UUID]; s.Healthy || s.Reason != "GPU lost" {
		t.Errorf("%+v", s)
	}
}

func TestParseXIDs(t *testing.T) {
	x, err := ParseXIDs(" 13, 31,,109 ")
	if err != nil || len(x) != 3 || x[2] != 109 {
		t.Errorf("%v %v", x, err)
	}
	if _, err := ParseXIDs("13,x"); err == nil || err.Error() != `XID "x" is not a non-negative integer` {
		t.Errorf("%v", err)
	}
	if x, err := ParseXIDs(""); err != nil || x != nil {
		t.Errorf("%v %v", x, err)
	}
}

func TestLostGPUFoundByProbe(t *testing.T) {
	n := nvmltest.DGXA100()
	var mu sync.Mutex
	lost := false
	n.Device(6).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		if lost {
			return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
		}
		return nvml.Memory{Total: 40 << 30}, nvml.SUCCESS
	}
	m, _ := start(t, n, Options{RecoveryPeriod: time.Hour})
	settle(t, n)
	mu.Lock()
	lost = true
	mu.Unlock()
	<-m.Changes()
	if s := m.Snapshot()[n.Device(6).UUID]; s.Healthy || s.Reason != "GPU lost" {
		t.Errorf("%+v", s)
	}
	for i := range n.Devices {
		if i != 6 && !m.Snapshot()[n.Device(i).UUID].Healthy {
			t.Errorf("gpu %d unhealthy", i)
		}
	}
}
