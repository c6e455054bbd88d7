package lab

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/clusterview"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
)

// Report is the cluster view `tessera-lab status` prints: the code of
// `kubectl tessera nodes` (internal/clusterview), plus what only the lab
// knows (each node's lab mode, the memory in use on its emulated GPUs).
type Report struct{ *clusterview.Report }

// Collect reads the report from the API server (clusterview.Collect) and
// names each node's lab mode (its LabelMode label).
func Collect(ctx context.Context, client kubernetes.Interface) (*Report, error) {
	r, err := clusterview.Collect(ctx, client)
	if err != nil {
		return nil, err
	}
	for i := range r.Nodes {
		r.Nodes[i].Mode = r.Nodes[i].Labels[LabelMode]
	}
	return &Report{r}, nil
}

// AddUsage reads what the processes hold on each GPU of the lab's nodes
// (the GPUs' state files, which the nodes' NVML reads too).
func (r *Report) AddUsage(d Dir) {
	for i := range r.Nodes {
		n := &r.Nodes[i]
		files := &fakegpu.Node{Dir: nodeDir(d.Node(n.Name)).path("gpus")}
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
