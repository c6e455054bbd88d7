package scheduler

import (
	"sync"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/internal/placement"
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
	recordsIgnored = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "tessera",
		Subsystem:      "scheduler",
		Name:           "records_not_charged_total",
		Help:           "Bound GPU pods whose allocation record the scheduler did not charge, by reason (TesseraRecordIgnored: bad signature or not the pod's request; TesseraRecordMissing: no record).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	claimPodsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "tessera",
		Subsystem:      "scheduler",
		Name:           "claim_pods_total",
		Help:           "Scheduling attempts of pods with ResourceClaims, by whether the plugin narrowed them to its best DRA nodes (narrowed) or why not (the claims' feature it does not model, notFitting, retry, notReady).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
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

// gpuGauges publishes the plugin's state as the per-GPU gauges: the
// state's usageObserver.
type gpuGauges struct{}

// nodeChanged updates the gauges of a node's GPUs. Idle GPUs have no
// series: a large cluster would otherwise export three per GPU whether
// used or not.
func (gpuGauges) nodeChanged(n *placement.Node) {
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if g.Used == (placement.Usage{}) {
			deleteGPUSeries(n.Name, g.UUID)
			continue
		}
		gpuMemory.WithLabelValues(n.Name, g.UUID).Set(float64(g.Used.MemoryMiB))
		gpuCores.WithLabelValues(n.Name, g.UUID).Set(float64(g.Used.Cores))
		gpuShares.WithLabelValues(n.Name, g.UUID).Set(float64(g.Used.Shares))
	}
}

// nodeRemoved drops the series of a node's GPUs.
func (gpuGauges) nodeRemoved(n *placement.Node) {
	for i := range n.GPUs {
		deleteGPUSeries(n.Name, n.GPUs[i].UUID)
	}
}

var registerOnce sync.Once

// registerMetrics registers the metrics once per process (a test may build
// several plugins).
func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(placementsTotal, failuresTotal, recordsIgnored, claimPodsTotal, gpuMemory, gpuCores, gpuShares, pluginDuration)
	})
}

func since(point string, start time.Time) {
	pluginDuration.WithLabelValues(point).Observe(time.Since(start).Seconds())
}
