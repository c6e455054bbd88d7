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

// Catalogue is the placement policies a program runs, by name. It is a
// value, not a registry: the scheduler runs All (or the catalogue its
// caller gives it), the simulator All and its research baselines.
type Catalogue []Entry

// All lists the policies the scheduler runs: the placement core's binpack
// and spread, fgd and tessera.
func All() Catalogue {
	return Catalogue{
		{string(api.NodeBinpack), func(*placement.Cluster, int64) placement.Policy { return placement.Binpack{} }},
		{string(api.NodeSpread), func(*placement.Cluster, int64) placement.Policy { return placement.Spread{} }},
		{NameFGD, func(*placement.Cluster, int64) placement.Policy { return NewFGD() }},
		{NameTessera, func(c *placement.Cluster, _ int64) placement.Policy {
			return NewTessera(c, DefaultTesseraParams())
		}},
	}
}

// Names lists the names of the catalogue, in its order.
func (cat Catalogue) Names() []string {
	out := make([]string, len(cat))
	for i, e := range cat {
		out[i] = e.Name
	}
	return out
}

// New returns a fresh instance of the named policy for cluster c, or an
// error naming the policies there are.
func (cat Catalogue) New(name string, c *placement.Cluster, seed int64) (placement.Policy, error) {
	for _, e := range cat {
		if e.Name == name {
			return e.New(c, seed), nil
		}
	}
	return nil, fmt.Errorf("unknown placement policy %q (known: %s)", name, strings.Join(cat.Names(), ", "))
}

// Names lists the names of All, in its order.
func Names() []string { return All().Names() }

// New returns a fresh instance of the named policy of All for cluster c,
// or an error naming the policies there are.
func New(name string, c *placement.Cluster, seed int64) (placement.Policy, error) {
	return All().New(name, c, seed)
}
