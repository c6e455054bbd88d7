// Package status is what the emulated cluster shows: the report
// `tessera-lab status` and the demo print (the code of `kubectl tessera
// nodes`, with each node's lab mode and the memory in use on its emulated
// GPUs), the physical invariant checker over what the containers were
// actually given, and the wait until a namespace's pods have settled.
package status

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/clusterview"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
)

// Report is the cluster view `tessera-lab status` prints: the code of
// `kubectl tessera nodes` (internal/clusterview), plus what only the lab
// knows (each node's lab mode, the memory in use on its emulated GPUs).
type Report struct{ *clusterview.Report }

// Collect reads the report from the API server (clusterview.Collect) and
// names each node's lab mode (its modes.Label label).
func Collect(ctx context.Context, client kubernetes.Interface) (*Report, error) {
	r, err := clusterview.Collect(ctx, client)
	if err != nil {
		return nil, err
	}
	for i := range r.Nodes {
		r.Nodes[i].Mode = r.Nodes[i].Labels[modes.Label]
	}
	return &Report{r}, nil
}

// AddUsage reads what the processes hold on each GPU of the lab's nodes
// (the GPUs' state files, which the nodes' NVML reads too).
func (r *Report) AddUsage(d labdir.Dir) {
	for i := range r.Nodes {
		n := &r.Nodes[i]
		files := &fakegpu.Node{Dir: d.Node(n.Name).GPUs()}
		for j := range n.GPUs {
			g := &n.GPUs[j]
			if _, procs, err := fakegpu.Read(files.File(g.UUID)); err == nil {
				g.InUseMiB, g.Processes = 0, len(procs)
				for _, p := range procs {
					g.InUseMiB += int64(p.UsedBytes >> 20)
				}
			}
		}
	}
}
