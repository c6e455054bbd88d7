package scheduler

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Metrics are registered in component-base's legacy registry, which
// kube-scheduler serves on its /metrics endpoint.
var (
	placementsTotal = metrics.NewCounter(&metrics.CounterOpts{
		Namespace:      "tessera",
		Subsystem:      "scheduler",
		Name:           "placements_total",
		Help:           "GPU pods placed (reserved) by the Tessera plugin.",
		StabilityLevel: metrics.ALPHA,
	})
	failuresTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "tessera",
		Subsystem:      "scheduler",
		Name:           "failures_total",
		Help:           "Scheduling attempts of GPU pods that found no node, by reason (counted once per reason and attempt).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	gpuMemory      = perGPUGauge("gpu_allocated_memory_mib", "GPU memory allocated to pods, per GPU, in MiB.")
	gpuCores       = perGPUGauge("gpu_allocated_cores_percent", "GPU compute allocated to pods, per GPU, in percent of its SMs.")
	gpuShares      = perGPUGauge("gpu_allocated_shares", "Containers holding a share of the GPU.")
	pluginDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Namespace:      "tessera",
		Subsystem:      "scheduler",
		Name:           "plugin_duration_seconds",
		Help:           "Latency of the Tessera plugin per extension point.",
		Buckets:        metrics.ExponentialBuckets(0.00001, 4, 10),
		StabilityLevel: metrics.ALPHA,
	}, []string{"extension_point"})
)

// perGPUGauge is a gauge of the scheduler's state labelled by node and GPU.
func perGPUGauge(name, help string) *metrics.GaugeVec {
	return metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      "tessera",
		Subsystem:      "scheduler",
		Name:           name,
		Help:           help,
		StabilityLevel: metrics.ALPHA,
	}, []string{"node", "gpu"})
}

// deleteGPUSeries drops the per-GPU series of a GPU that holds nothing.
func deleteGPUSeries(node, uuid string) {
	gpuMemory.DeleteLabelValues(node, uuid)
	gpuCores.DeleteLabelValues(node, uuid)
	gpuShares.DeleteLabelValues(node, uuid)
}

var registerOnce sync.Once

// registerMetrics registers the metrics once per process (a test may build
// several plugins).
func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(placementsTotal, failuresTotal, gpuMemory, gpuCores, gpuShares, pluginDuration)
	})
}
