package policies

import (
	"fmt"
	"strings"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Entry is one placement policy a scheduler, the simulator or a tool can
// run: its name (what placementPolicy and --policy take) and how to make a
// fresh instance.
type Entry struct {
	Name string
	// New makes an instance for cluster c (read only; policies that weigh
	// the cluster's GPU models read its nodes when they build their
	// workload model). seed drives the random choices of the policies
	// that make any. Policies with state (a random source, a learned
	// workload, caches) need a fresh instance per cluster and run.
	New func(c *placement.Cluster, seed int64) placement.Policy
}

// All lists every placement policy: the placement core's binpack and
// spread, the baselines of the simulator (random, dotproduct,
// gpuclustering, gpupacking, bestfit, fgd) and tessera. There is no other
// registry: every binary that imports this package can run every policy.
func All() []Entry {
	return []Entry{
		{string(api.NodeBinpack), func(*placement.Cluster, int64) placement.Policy { return placement.Binpack{} }},
		{string(api.NodeSpread), func(*placement.Cluster, int64) placement.Policy { return placement.Spread{} }},
		{NameRandom, func(_ *placement.Cluster, seed int64) placement.Policy { return &Random{base: base{seed: seed}} }},
		{NameDotProduct, func(_ *placement.Cluster, seed int64) placement.Policy { return &DotProduct{base: base{seed: seed}} }},
		{NameGPUClustering, func(c *placement.Cluster, seed int64) placement.Policy { return newGPUClustering(c, seed) }},
		{NameGPUPacking, func(_ *placement.Cluster, seed int64) placement.Policy { return &GPUPacking{base: base{seed: seed}} }},
		{NameBestFit, func(_ *placement.Cluster, seed int64) placement.Policy { return &BestFit{base: base{seed: seed}} }},
		{NameFGD, func(_ *placement.Cluster, seed int64) placement.Policy { return NewFGD(seed) }},
		{NameTessera, func(c *placement.Cluster, seed int64) placement.Policy {
			return NewTessera(c, seed, DefaultTesseraParams())
		}},
	}
}

// Names lists the names of All, in its order.
func Names() []string {
	all := All()
	out := make([]string, len(all))
	for i, e := range all {
		out[i] = e.Name
	}
	return out
}

// Compared lists the seven policies the simulator compares by default, in
// report order (the published baselines, then tessera).
func Compared() []string {
	return []string{NameRandom, NameDotProduct, NameGPUClustering, NameGPUPacking, NameBestFit, NameFGD, NameTessera}
}

// New returns a fresh instance of the named policy for cluster c, or an
// error naming the policies there are.
func New(name string, c *placement.Cluster, seed int64) (placement.Policy, error) {
	for _, e := range All() {
		if e.Name == name {
			return e.New(c, seed), nil
		}
	}
	return nil, fmt.Errorf("unknown placement policy %q (known: %s)", name, strings.Join(Names(), ", "))
}
