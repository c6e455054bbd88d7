package parts

// The trust part: the device plugins' checks of records
// (deviceplugin.Guard), the scheduler's public keys they verify
// signatures with, the host-side reconciler, and the Warning events and
// metrics both raise (docs/security.md).

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TrustOptions are what the trust part needs.
type TrustOptions struct {
	Names api.ResourceNames
	// RecordKeys locates the scheduler's published public keys: every
	// record is checked against them before it is served. Nil:
	// signatures are not checked.
	RecordKeys *recordsig.Store
	// AcceptUnsigned serves records without a signature.
	AcceptUnsigned bool
	// Client reads the public keys.
	Client kubernetes.Interface
	// Reconcile configures the host-side check; it runs when Interval > 0.
	Reconcile reconcile.Options
	Devices   *Devices
	State     statedir.Dirs
	Logger    klog.Logger
}

// Trust is the node's checks of what it serves.
type Trust struct {
	opts  TrustOptions
	guard *deviceplugin.Guard
	keys  *recordsig.KeySource

	pods     corelisters.PodLister
	recorder record.EventRecorder
	wg       sync.WaitGroup

	refused  prometheus.Counter
	breaches *prometheus.CounterVec
	held     *prometheus.GaugeVec
	reclaims *prometheus.CounterVec

	recMu sync.Mutex
	rec   *reconcile.Reconciler // once started
}

// NewTrust returns the trust part.
func NewTrust(opts TrustOptions) *Trust {
	t := &Trust{
		opts: opts,
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tessera_node_agent_allocations_refused_total",
			Help: "Allocate requests refused by the agent's own checks of the record (signature, request, physical GPU, the node's ledger).",
		}),
		breaches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_node_agent_grant_breaches_total",
			Help: "Reconciler passes that found a container holding more GPU memory than granted (TesseraGPUMemoryOverGrant), using a GPU it was not granted (TesseraGPUNotGranted), or holding GPU memory in processes that never registered with its limiter (TesseraGPUMemoryWithoutLimiter).",
		}, []string{"reason"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tessera_node_agent_container_gpu_memory_mib",
			Help: "GPU memory NVML reports held by each container's processes, per GPU, at the last reconciler pass.",
		}, []string{"namespace", "pod", "container", "gpu"}),
		reclaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_node_agent_gpu_memory_reclaims_total",
			Help: "Containers stopped because they held GPU memory past their guarantee (bursting toward their ceiling) that a guarantee on the same GPU needed (TesseraGPUMemoryReclaimed), per GPU and trigger (admission: a container served on the GPU; pass: a reconciler pass; refusal: the driver refused an allocation within a container's guarantee).",
		}, []string{"gpu", "trigger"}),
	}
	t.guard = &deviceplugin.Guard{
		Names:          opts.Names,
		AcceptUnsigned: opts.AcceptUnsigned,
		NodePods:       t.nodePods,
		Admitted:       t.admitted,
		Refused: func(pod *v1.Pod, reason string) {
			t.refused.Inc()
			t.recorder.Event(pod, v1.EventTypeWarning, deviceplugin.ReasonRefused, reason)
		},
	}
	if opts.RecordKeys != nil {
		t.keys = recordsig.NewKeySource(opts.Client, *opts.RecordKeys)
		t.guard.Verify = t.keys.Verify
	}
	return t
}

// Guard is the device plugins' checks of records.
func (t *Trust) Guard() *deviceplugin.Guard { return t.guard }

// Collectors are the trust checks' metrics.
func (t *Trust) Collectors() []prometheus.Collector {
	return []prometheus.Collector{t.refused, t.breaches, t.held, t.reclaims}
}

// admitted runs the reconciler's budget part for a container just served.
func (t *Trust) admitted() {
	t.recMu.Lock()
	r := t.rec
	t.recMu.Unlock()
	if r != nil {
		r.Admitted()
	}
}

// Start implements Part: it watches the scheduler's public keys and runs
// the host-side reconciler.
func (t *Trust) Start(ctx context.Context, c Cluster) error {
	t.pods, t.recorder = c.Pods, c.Recorder
	if t.keys != nil {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			if err := t.keys.Run(ctx); err != nil {
				t.opts.Logger.Error(err, "Watching the scheduler's public keys")
			}
		}()
	} else {
		t.opts.Logger.Info("Record signatures are not checked (no --record-keys): records rest on the admission policy alone")
	}
	if t.opts.Reconcile.Interval > 0 {
		r := t.reconciler()
		t.recMu.Lock()
		t.rec = r
		t.recMu.Unlock()
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			r.Run(ctx)
		}()
	}
	return nil
}

// Reconcile implements Part: the checks follow the cluster, not the
// node's configuration.
func (t *Trust) Reconcile(context.Context, *Node) {}

// Stop implements Part.
func (t *Trust) Stop() { t.wg.Wait() }

// nodePods are the pods bound to this node, from the informer cache.
func (t *Trust) nodePods() []*v1.Pod {
	pods, err := t.pods.List(labels.Everything())
	if err != nil {
		t.opts.Logger.Error(err, "Listing the node's pods")
	}
	return pods
}

// reconciler builds the host-side backstop over the discovered GPUs.
func (t *Trust) reconciler() *reconcile.Reconciler {
	var gpus []reconcile.GPU
	for _, d := range t.opts.Devices.List() {
		gpus = append(gpus, reconcile.GPU{UUID: d.GPU.UUID, MemoryMiB: d.GPU.MemoryMiB, Handle: d.Handle})
	}
	r := reconcile.New(t.opts.Reconcile, gpus, t.opts.State, t.nodePods, t.opts.Logger.WithName("reconcile"))
	r.Report = func(b reconcile.Breach) {
		t.breaches.WithLabelValues(b.Reason()).Inc()
		msg := b.String()
		if len(b.Killed) > 0 {
			msg += fmt.Sprintf("; killed its processes %v", b.Killed)
		}
		t.recorder.Event(b.Pod, v1.EventTypeWarning, b.Reason(), msg)
	}
	r.Reclaimed = func(c reconcile.Reclaim) {
		t.reclaims.WithLabelValues(c.GPU, c.Trigger).Inc()
		msg := c.String()
		if len(c.Killed) > 0 {
			msg += fmt.Sprintf("; killed its processes %v", c.Killed)
		}
		t.recorder.Event(c.Pod, v1.EventTypeWarning, reconcile.ReasonReclaimed, msg)
	}
	r.Observe = func(pod *v1.Pod, container, gpu string, usedMiB int64) {
		t.held.WithLabelValues(pod.Namespace, pod.Name, container, gpu).Set(float64(usedMiB))
	}
	return r
}
