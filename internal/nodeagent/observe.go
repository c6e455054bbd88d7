package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/nodeagent/metrics"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nodelabels"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// This file holds what the agent shows operators: the GFD-style Node
// labels (nodelabels) and the Prometheus metrics (metrics).

// driverInfo reads the driver's versions once (they do not change while
// the agent runs: a driver upgrade restarts it).
func driverInfo(lib nvml.Interface) nodelabels.Driver {
	var d nodelabels.Driver
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		d.Version = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		d.CUDA = v
	}
	return d
}

// remember keeps the inventory last built, for the metrics.
func (a *Agent) remember(inv *api.NodeInventory) {
	a.mu.Lock()
	a.lastInv = inv
	a.mu.Unlock()
}

func (a *Agent) inventory() *api.NodeInventory {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastInv
}

// publishLabels keeps the node's GFD-style labels in step with inv.
func (a *Agent) publishLabels(ctx context.Context, node *v1.Node, inv *api.NodeInventory) error {
	want := nodelabels.For(inv, a.driver)
	p := nodelabels.Patch(node.Labels, want)
	if p == nil {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": p}})
	if err != nil {
		return err
	}
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.opts.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	a.logger.Info("Node labels updated", "node", a.opts.NodeName, "labels", nodelabels.Describe(want))
	return nil
}

// claimsForMetrics lists the DRA claims prepared on the node, with each
// request's GPUs in the order of its limits file.
func (a *Agent) claimsForMetrics() []metrics.Claim {
	dr := a.DRADriver()
	if dr == nil {
		return nil
	}
	var out []metrics.Claim
	for _, p := range dr.Prepared() {
		c := metrics.Claim{Namespace: p.Namespace, Name: p.Name}
		for _, r := range p.Requests {
			cr := metrics.ClaimRequest{Request: r.Request, StateFile: r.StateFile()}
			for _, g := range p.Grants {
				if g.Request == r.Request {
					cr.Devices = append(cr.Devices, metrics.ClaimDevice{UUID: g.UUID, MemoryMiB: g.MemoryMiB, Cores: g.Cores, Whole: g.Whole, Admin: g.Admin})
				}
			}
			c.Requests = append(c.Requests, cr)
		}
		out = append(out, c)
	}
	return out
}

// MetricsHandler serves the agent's metrics (and Go runtime and process
// metrics) in Prometheus' text format.
func (a *Agent) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The trust checks' metrics (metrics.go).
	reg.MustRegister(a.metrics.refused, a.metrics.breaches, a.metrics.held)
	reg.MustRegister(metrics.New(metrics.Source{
		Node:      a.opts.NodeName,
		Inventory: a.inventory,
		Handles: func() map[string]nvml.Device {
			a.devMu.Lock()
			defer a.devMu.Unlock()
			h := make(map[string]nvml.Device, len(a.devices))
			for _, d := range a.devices {
				h[d.GPU.UUID] = d.Handle
			}
			return h
		},
		XIDs: func() map[string]uint64 {
			out := map[string]uint64{}
			for u, s := range a.monitor.Snapshot() {
				out[u] = s.XIDErrors
			}
			return out
		},
		Pods: func() ([]*v1.Pod, error) {
			a.mu.Lock()
			l := a.podsForMetrics
			a.mu.Unlock()
			if l == nil {
				return nil, nil
			}
			return l.List(labels.Everything())
		},
		State:  a.state,
		Claims: a.claimsForMetrics,
	}, a.logger.WithName("metrics")))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

// serveMetrics serves MetricsHandler on Options.MetricsAddress until ctx
// ends; the address actually bound is reported by MetricsAddr.
func (a *Agent) serveMetrics(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.opts.MetricsAddress)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.podsForMetrics = a.pods
	a.metricsAddr = ln.Addr().String()
	a.mu.Unlock()
	srv := &http.Server{Handler: a.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.logger.Error(err, "Metrics server stopped")
		}
	}()
	a.logger.Info("Serving metrics", "address", ln.Addr().String())
	return nil
}

// MetricsAddr is the address the metrics server listens on ("" when it
// does not run).
func (a *Agent) MetricsAddr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.metricsAddr
}
