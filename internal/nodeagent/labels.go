package nodeagent

import (
	"context"
	"encoding/json"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/nodeagent/nodelabels"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// The GFD-style Node labels (nodelabels), published with the inventory.
// The Prometheus metrics are a part (parts.Metrics).

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
