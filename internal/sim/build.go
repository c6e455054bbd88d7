package sim

import (
	"fmt"
	"strings"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// modelMemoryMiB is the GPU memory the simulator gives each model. Requests
// are percentages of a GPU, so the size does not change results; sizes are
// multiples of 100 MiB so that every percentage is a whole number of MiB
// and memory and compute shares stay equal. G2 and G3 are undisclosed
// models and get defaultMemoryMiB.
var modelMemoryMiB = map[string]int64{
	"T4":      15100,
	"P100":    16300,
	"V100M16": 16200,
	"V100M32": 32500,
	"A10":     22700,
}

const (
	defaultMemoryMiB = 16000
	// simMaxShares does not bind: the trace has no share-count limit and
	// a share is at least 1% of a GPU.
	simMaxShares = 100
)

// BuildCluster makes a fresh placement cluster from a node list.
func BuildCluster(rows []NodeRow) (*placement.Cluster, error) {
	c := placement.NewCluster()
	for _, r := range rows {
		n, err := buildNode(r)
		if err != nil {
			return nil, err
		}
		c.UpsertNode(n)
	}
	return c, nil
}

func buildNode(r NodeRow) (*placement.Node, error) {
	inv := NodeInventory(r)
	n, err := placement.NewNode(r.Name, r.CPUMilli, r.MemMiB, inv)
	if err != nil {
		return nil, err
	}
	// CPU-only nodes still need a model for frag accounting; keep it.
	n.Labels = map[string]string{"model": r.Model}
	return n, nil
}

// NodeInventory is the GPU inventory the simulator gives a node of the
// trace (what the scheduler reads from the node's inventory annotation
// when the trace is replayed through it).
func NodeInventory(r NodeRow) *api.NodeInventory {
	mem, ok := modelMemoryMiB[r.Model]
	if !ok {
		mem = defaultMemoryMiB
	}
	inv := &api.NodeInventory{
		APIVersion:       api.InventoryAPIVersion,
		Kind:             api.InventoryKind,
		MemoryOvercommit: 1,
	}
	for i := 0; i < r.GPUs; i++ {
		inv.GPUs = append(inv.GPUs, api.GPU{
			UUID:      fmt.Sprintf("GPU-%s-%d", r.Name, i),
			Index:     i,
			Model:     r.Model,
			MemoryMiB: mem,
			Health:    api.Healthy,
			Sharing:   api.SharingShared,
			MaxShares: simMaxShares,
		})
	}
	return inv
}

// SharePercent is the per-GPU share, in percent, that a GPU-sharing task
// asks for: gpu_milli / 10 rounded up, so a task never gets less than it
// asked. (All openb shares are multiples of 10.)
func SharePercent(milli int64) int { return int((milli + 9) / 10) }

// Request maps a trace row to a placement request; key must be unique
// among the pods placed in one run.
func Request(p PodRow, key string) *placement.Request {
	r := &placement.Request{Pod: key, CPUMilli: p.CPUMilli, MemoryMiB: p.MemMiB}
	switch {
	case p.NumGPU == 0:
	case p.NumGPU == 1 && p.GPUMilli < 1000:
		pct := SharePercent(p.GPUMilli)
		r.Containers = []placement.Container{{Name: "main", GPUs: 1, MemoryPercent: pct, Cores: pct}}
	default:
		r.Containers = []placement.Container{{Name: "main", GPUs: p.NumGPU, MemoryPercent: 100, Cores: 100}}
	}
	r.IncludeModels = SpecModels(p.Spec)
	return r
}

// SpecModels splits a gpu_spec ("A10|T4") into model names.
func SpecModels(spec string) []string {
	if spec == "" {
		return nil
	}
	var out []string
	for _, m := range strings.Split(spec, "|") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// PlacedMilli is the GPU a placed request holds, in thousandths, as the
// core charges it (shares rounded up to whole percent).
func PlacedMilli(p PodRow) int64 {
	if p.NumGPU == 1 && p.GPUMilli < 1000 {
		return int64(SharePercent(p.GPUMilli)) * 10
	}
	return int64(p.NumGPU) * 1000
}
