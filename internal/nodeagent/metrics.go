package nodeagent

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// agentMetrics are the node agent's Prometheus metrics, in a registry of
// its own (served with --metrics-address).
type agentMetrics struct {
	reg      *prometheus.Registry
	refused  prometheus.Counter
	breaches *prometheus.CounterVec
	held     *prometheus.GaugeVec
}

func newAgentMetrics() *agentMetrics {
	m := &agentMetrics{
		reg: prometheus.NewRegistry(),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tessera_node_agent_allocations_refused_total",
			Help: "Allocate requests refused by the agent's own checks of the record (signature, request, physical GPU, the node's ledger).",
		}),
		breaches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_node_agent_grant_breaches_total",
			Help: "Reconciler passes that found a container holding more GPU memory than granted (TesseraGPUMemoryOverGrant) or using a GPU it was not granted (TesseraGPUNotGranted).",
		}, []string{"reason"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tessera_node_agent_container_gpu_memory_mib",
			Help: "GPU memory NVML reports held by each container's processes, per GPU, at the last reconciler pass.",
		}, []string{"namespace", "pod", "container", "gpu"}),
	}
	m.reg.MustRegister(m.refused, m.breaches, m.held)
	return m
}

func (m *agentMetrics) serve(ctx context.Context, addr string, logger klog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error(err, "Serving metrics", "address", addr)
	}
}
