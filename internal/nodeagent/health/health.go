// Package health watches NVML events and keeps each GPU's health. A GPU
// turns Unhealthy at once on a critical XID (other than the
// application-caused ones, which are ignored), a double-bit ECC error or
// when it is lost; it turns Healthy again after it has been quiet for the
// recovery period and still answers NVML. NVIDIA's device plugin never
// recovers a device without a restart; that strands GPUs after transient
// errors.
package health

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// DefaultIgnoredXIDs are XIDs caused by the application, not the GPU:
// 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
// processing (the context was reset), 45 preemptive cleanup, 68 video
// processor exception, 109 context switch timeout.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// ParseXIDs reads a comma-separated XID list ("13,31"); empty means none.
func ParseXIDs(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		x, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("XID %q is not a non-negative integer", f)
		}
		out = append(out, x)
	}
	return out, nil
}

// State is one GPU's health.
type State struct {
	Healthy bool
	// Reason says why the GPU is unhealthy ("XID 79").
	Reason string
	// Since is when the GPU last turned unhealthy or had a new error.
	Since time.Time
	// XIDErrors counts the XID events seen on the GPU since the agent
	// started, the ignored (application) XIDs included.
	XIDErrors uint64
}

// Options tune the monitor.
type Options struct {
	// IgnoredXIDs are XIDs that leave the GPU healthy.
	IgnoredXIDs []uint64
	// RecoveryPeriod is how long an unhealthy GPU must stay free of errors
	// before it is healthy again; 0 means it never recovers.
	RecoveryPeriod time.Duration
	// WaitTimeout bounds one NVML event wait; recovery is checked between
	// waits (default 5s).
	WaitTimeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Monitor tracks the health of a fixed set of GPUs.
type Monitor struct {
	lib     nvml.Interface
	opts    Options
	ignored map[uint64]bool
	handles map[string]nvml.Device // by UUID
	logger  klog.Logger

	mu      sync.Mutex
	state   map[string]*State
	changes chan struct{}
}

// New returns a monitor for the GPUs (UUID → handle); all start healthy.
func New(lib nvml.Interface, handles map[string]nvml.Device, opts Options, logger klog.Logger) *Monitor {
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Monitor{
		lib: lib, opts: opts, handles: handles, logger: logger,
		ignored: map[uint64]bool{},
		state:   map[string]*State{},
		changes: make(chan struct{}, 1),
	}
	for _, x := range opts.IgnoredXIDs {
		m.ignored[x] = true
	}
	for u := range handles {
		m.state[u] = &State{Healthy: true}
	}
	return m
}

// Changes receives a value (coalesced) whenever some GPU's health changes.
func (m *Monitor) Changes() <-chan struct{} { return m.changes }

// Snapshot returns every GPU's health.
func (m *Monitor) Snapshot() map[string]State {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]State, len(m.state))
	for u, s := range m.state {
		out[u] = *s
	}
	return out
}

// watched are the event types that make a GPU unhealthy.
const watched = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeGpuUnavailableError

// Run registers for events and handles them until ctx ends. It returns an
// error only if NVML cannot create an event set; GPUs that cannot be
// registered are logged and left healthy (nothing to watch them with).
func (m *Monitor) Run(ctx context.Context) error {
	set, ret := m.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml EventSetCreate: %v", ret)
	}
	defer set.Free()
	for _, u := range m.uuids() {
		h := m.handles[u]
		types := uint64(watched)
		if sup, ret := h.GetSupportedEventTypes(); ret == nvml.SUCCESS {
			types &= sup
		}
		if ret := h.RegisterEvents(types, set); ret != nvml.SUCCESS {
			m.logger.Error(ret, "Cannot watch GPU events; its errors will not be detected", "gpu", u)
		}
	}
	timeout := uint32(m.opts.WaitTimeout / time.Millisecond)
	for ctx.Err() == nil {
		e, ret := set.Wait(timeout)
		switch ret {
		case nvml.SUCCESS:
			m.handle(e)
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			// NVML cannot say which GPU: all of them are suspect.
			m.markAll("GPU lost")
		default:
			m.logger.Error(ret, "NVML event wait failed")
			select {
			case <-ctx.Done():
			case <-time.After(m.opts.WaitTimeout):
			}
		}
		m.probeLost()
		m.recover()
	}
	return nil
}

// probeLost asks every healthy GPU for its memory: a GPU that fell off the
// bus does not always produce an event, but answers GPU_IS_LOST. Other
// errors are not taken as a verdict.
func (m *Monitor) probeLost() {
	for _, u := range m.uuids() {
		m.mu.Lock()
		healthy := m.state[u].Healthy
		m.mu.Unlock()
		if !healthy {
			continue
		}
		if _, ret := m.handles[u].GetMemoryInfo(); ret == nvml.ERROR_GPU_IS_LOST {
			m.mark(u, "GPU lost")
		}
	}
}

func (m *Monitor) uuids() []string {
	u := make([]string, 0, len(m.handles))
	for k := range m.handles {
		u = append(u, k)
	}
	sort.Strings(u)
	return u
}

// handle applies one event.
func (m *Monitor) handle(e nvml.EventData) {
	var reason string
	switch {
	case e.EventType&nvml.EventTypeXidCriticalError != 0:
		m.countXID(e.Device)
		if m.ignored[e.EventData] {
			m.logger.V(2).Info("Ignoring application XID", "xid", e.EventData, "gpu", m.uuidOf(e.Device))
			return
		}
		reason = fmt.Sprintf("XID %d", e.EventData)
	case e.EventType&nvml.EventTypeDoubleBitEccError != 0:
		reason = "double-bit ECC error"
	case e.EventType&nvml.EventTypeGpuUnavailableError != 0:
		reason = "GPU lost"
	default:
		return
	}
	u := m.uuidOf(e.Device)
	if u == "" {
		m.markAll(reason + " (device unknown)")
		return
	}
	m.mark(u, reason)
}

// uuidOf returns the UUID of one of the monitored GPUs, or "".
func (m *Monitor) uuidOf(d nvml.Device) string {
	if d == nil {
		return ""
	}
	for u, h := range m.handles {
		if h == d {
			return u
		}
	}
	if u, ret := d.GetUUID(); ret == nvml.SUCCESS {
		if _, ok := m.handles[u]; ok {
			return u
		}
	}
	return ""
}

// countXID counts an XID event on its GPU (events of unknown devices are
// not counted).
func (m *Monitor) countXID(d nvml.Device) {
	u := m.uuidOf(d)
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.state[u]; s != nil {
		s.XIDErrors++
	}
}

func (m *Monitor) mark(u, reason string) {
	m.mu.Lock()
	s := m.state[u]
	was := s.Healthy
	s.Healthy, s.Reason, s.Since = false, reason, m.opts.Now()
	m.mu.Unlock()
	if was {
		m.logger.Info("GPU unhealthy", "gpu", u, "reason", reason)
		m.notify()
	} else {
		m.logger.V(2).Info("GPU error while unhealthy; recovery restarts", "gpu", u, "reason", reason)
	}
}

func (m *Monitor) markAll(reason string) {
	for _, u := range m.uuids() {
		m.mark(u, reason)
	}
}

// recover turns GPUs healthy that have been quiet for RecoveryPeriod and
// still answer NVML. A GPU that does not answer starts a new period.
func (m *Monitor) recover() {
	if m.opts.RecoveryPeriod <= 0 {
		return
	}
	now := m.opts.Now()
	var due []string
	m.mu.Lock()
	for u, s := range m.state {
		if !s.Healthy && now.Sub(s.Since) >= m.opts.RecoveryPeriod {
			due = append(due, u)
		}
	}
	m.mu.Unlock()
	changed := false
	for _, u := range due {
		_, ret := m.handles[u].GetMemoryInfo()
		m.mu.Lock()
		s := m.state[u]
		if ret != nvml.SUCCESS {
			s.Since = now
			m.mu.Unlock()
			m.logger.Info("GPU still failing; not recovering it", "gpu", u, "probe", ret.Error())
			continue
		}
		reason := s.Reason
		*s = State{Healthy: true}
		m.mu.Unlock()
		m.logger.Info("GPU recovered", "gpu", u, "after", reason, "quietFor", m.opts.RecoveryPeriod)
		changed = true
	}
	if changed {
		m.notify()
	}
}

func (m *Monitor) notify() {
	select {
	case m.changes <- struct{}{}:
	default:
	}
}
