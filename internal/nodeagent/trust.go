package nodeagent

// The agent's trust wiring: the device plugin's checks of records
// (deviceplugin.Guard), the scheduler's public keys they verify
// signatures with, the host-side reconciler, and the Warning events and
// metrics both raise (docs/security.md).

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// nodePods are the pods bound to this node, from the informer cache.
func (a *Agent) nodePods() []*v1.Pod {
	pods, err := a.pods.List(labels.Everything())
	if err != nil {
		a.logger.Error(err, "Listing the node's pods")
	}
	return pods
}

// guard builds the device plugin's checks; a key source, when configured,
// is started in wg.
func (a *Agent) guard(ctx context.Context, wg *sync.WaitGroup) (*deviceplugin.Guard, error) {
	g := &deviceplugin.Guard{
		Names:          a.names,
		AcceptUnsigned: a.opts.AcceptUnsigned,
		NodePods:       a.nodePods,
		Refused: func(pod *v1.Pod, reason string) {
			a.metrics.refused.Inc()
			a.recorder.Event(pod, v1.EventTypeWarning, deviceplugin.ReasonRefused, reason)
		},
	}
	if a.opts.RecordKeys != nil {
		keys := recordsig.NewKeySource(a.client, *a.opts.RecordKeys)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := keys.Run(ctx); err != nil {
				a.logger.Error(err, "Watching the scheduler's public keys")
			}
		}()
		g.Verify = keys.Verify
	} else {
		a.logger.Info("Record signatures are not checked (no --record-keys): records rest on the admission policy alone")
	}
	return g, nil
}

// reconciler builds the host-side backstop over the discovered GPUs.
func (a *Agent) reconciler() *reconcile.Reconciler {
	var gpus []reconcile.GPU
	for _, d := range a.devices {
		gpus = append(gpus, reconcile.GPU{UUID: d.GPU.UUID, MemoryMiB: d.GPU.MemoryMiB, Handle: d.Handle})
	}
	opts := a.opts.Reconcile
	if opts.Shared == nil {
		opts.Shared = func() bool {
			cfg, _ := a.config.Current()
			return cfg.Sharing == api.SharingShared
		}
	}
	r := reconcile.New(opts, gpus, a.state, a.nodePods, a.logger.WithName("reconcile"))
	r.Report = func(b reconcile.Breach) {
		a.metrics.breaches.WithLabelValues(b.Reason()).Inc()
		msg := b.String()
		if len(b.Killed) > 0 {
			msg += fmt.Sprintf("; killed its processes %v", b.Killed)
		}
		a.recorder.Event(b.Pod, v1.EventTypeWarning, b.Reason(), msg)
	}
	r.Observe = func(pod *v1.Pod, container, gpu string, usedMiB int64) {
		a.metrics.held.WithLabelValues(pod.Namespace, pod.Name, container, gpu).Set(float64(usedMiB))
	}
	return r
}
