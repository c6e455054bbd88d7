package nodeagent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// agentMetrics are the trust checks' Prometheus metrics, served with the
// agent's others (observe.go, --metrics-address).
type agentMetrics struct {
	refused  prometheus.Counter
	breaches *prometheus.CounterVec
	held     *prometheus.GaugeVec
}

func newAgentMetrics() *agentMetrics {
	m := &agentMetrics{
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
	return m
}
