package parts

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/metrics"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// MetricsOptions are what the metrics part needs.
type MetricsOptions struct {
	// Address is where the metrics are served ("host:port").
	Address  string
	NodeName string
	Devices  *Devices
	// Health is the GPUs' health now (their XID counts).
	Health func() map[string]health.State
	// State locates the containers' limiter state.
	State statedir.Dirs
	// Claims lists the DRA claims prepared on the node (nil: none).
	Claims func() []metrics.Claim
	// Collectors are other parts' metrics, served with these.
	Collectors []prometheus.Collector
	Logger     klog.Logger
}

// Metrics serves the agent's Prometheus metrics per GPU and per
// container (internal/nodeagent/metrics; docs/operations.md), and Go
// runtime and process metrics, with /healthz.
type Metrics struct {
	opts MetricsOptions
	wg   sync.WaitGroup

	mu   sync.Mutex
	inv  *api.NodeInventory // the inventory last built
	pods corelisters.PodLister
	addr string
}

// NewMetrics returns the metrics part.
func NewMetrics(opts MetricsOptions) *Metrics { return &Metrics{opts: opts} }

// Addr is the address the metrics server listens on ("" before it does).
func (m *Metrics) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr
}

// Reconcile implements Part: the inventory is kept for the metrics.
func (m *Metrics) Reconcile(_ context.Context, n *Node) {
	m.mu.Lock()
	m.inv = n.Inventory
	m.mu.Unlock()
}

// Stop implements Part: the server has shut down with Start's context.
func (m *Metrics) Stop() { m.wg.Wait() }

// Handler serves the metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(m.opts.Collectors...)
	reg.MustRegister(metrics.New(metrics.Source{
		Node: m.opts.NodeName,
		Inventory: func() *api.NodeInventory {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.inv
		},
		Handles: m.opts.Devices.Handles,
		XIDs: func() map[string]uint64 {
			out := map[string]uint64{}
			for u, s := range m.opts.Health() {
				out[u] = s.XIDErrors
			}
			return out
		},
		Pods: func() ([]*v1.Pod, error) {
			m.mu.Lock()
			l := m.pods
			m.mu.Unlock()
			if l == nil {
				return nil, nil
			}
			return l.List(labels.Everything())
		},
		State:  m.opts.State,
		Claims: m.opts.Claims,
	}, m.opts.Logger.WithName("metrics")))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

// Start implements Part: it serves Handler on the address until ctx ends.
func (m *Metrics) Start(ctx context.Context, c Cluster) error {
	ln, err := net.Listen("tcp", m.opts.Address)
	if err != nil {
		return fmt.Errorf("metrics address %q: %w", m.opts.Address, err)
	}
	m.mu.Lock()
	m.pods = c.Pods
	m.addr = ln.Addr().String()
	m.mu.Unlock()
	srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 10 * time.Second}
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		defer m.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.opts.Logger.Error(err, "Metrics server stopped")
		}
	}()
	m.opts.Logger.Info("Serving metrics", "address", ln.Addr().String())
	return nil
}
