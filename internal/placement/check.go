package placement

import (
	"errors"
	"fmt"
	"sort"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Check verifies the cluster's invariants: every GPU's usage equals the sum
// of the charges of the pods on it, and no GPU is over its memory (with
// overcommit), 100% of its cores, its share count, or held exclusively by
// more than one pod. It returns every violation found, joined.
func (c *Cluster) Check() error {
	var errs []error
	want := map[string][]Usage{}
	holders := map[string][]string{} // node/uuid → pods holding a share of it
	exclusive := map[string]bool{}   // node/uuid held exclusively by some pod
	pods := make([]string, 0, len(c.pods))
	for k := range c.pods {
		pods = append(pods, k)
	}
	sort.Strings(pods)
	for _, k := range pods {
		e := c.pods[k]
		n := c.Node(e.node)
		if n == nil {
			continue
		}
		if want[n.Name] == nil {
			want[n.Name] = make([]Usage, len(n.GPUs))
		}
		for _, ch := range e.charges {
			i := n.GPUByUUID(ch.UUID)
			if i < 0 {
				continue
			}
			want[n.Name][i].add(Usage(ch.Usage))
			key := n.Name + "/" + ch.UUID
			holders[key] = append(holders[key], k)
			exclusive[key] = exclusive[key] || ch.Usage.Exclusive > 0
		}
	}
	for _, n := range c.nodes {
		for i := range n.GPUs {
			g := &n.GPUs[i]
			var w Usage
			if want[n.Name] != nil {
				w = want[n.Name][i]
			}
			if g.Used != w {
				errs = append(errs, fmt.Errorf("node %s GPU %s: usage %+v differs from the sum of its pods' charges %+v", n.Name, g.UUID, g.Used, w))
			}
			errs = append(errs, checkGPU(n.Name, g)...)
			errs = append(errs, checkMIG(n.Name, g)...)
			if key := n.Name + "/" + g.UUID; exclusive[key] && len(holders[key]) > 1 {
				errs = append(errs, fmt.Errorf("node %s GPU %s: held exclusively but shared by %d pods %v", n.Name, g.UUID, len(holders[key]), holders[key]))
			}
		}
		if n.CPUUsed > n.CPUCapacity || n.MemUsed > n.MemCapacity {
			errs = append(errs, fmt.Errorf("node %s: CPU %dm of %dm or memory %d of %d MiB over capacity", n.Name, n.CPUUsed, n.CPUCapacity, n.MemUsed, n.MemCapacity))
		}
	}
	return errors.Join(errs...)
}

// checkGPU reports every limit of the GPU its usage exceeds (the limits
// Fit keeps, gpushare.Capacity.Exceeded) and negative usage.
func checkGPU(node string, g *GPU) []error {
	var errs []error
	u := g.Used
	over := g.capacity().Exceeded(gpushare.Usage(u))
	if over&gpushare.LimitMemory != 0 {
		errs = append(errs, fmt.Errorf("node %s GPU %s: %d MiB allocated, capacity %d MiB", node, g.UUID, u.MemoryMiB, g.MemoryCap))
	}
	if over&gpushare.LimitCores != 0 {
		errs = append(errs, fmt.Errorf("node %s GPU %s: %d%% cores allocated, limit %d%%", node, g.UUID, u.Cores, gpushare.FullCores))
	}
	if over&gpushare.LimitShares != 0 {
		errs = append(errs, fmt.Errorf("node %s GPU %s: %d shares, limit %d", node, g.UUID, u.Shares, g.MaxShares))
	}
	if over&gpushare.LimitWhole != 0 {
		errs = append(errs, fmt.Errorf("node %s GPU %s: held exclusively %d times", node, g.UUID, u.Exclusive))
	}
	if u.MemoryMiB < 0 || u.Cores < 0 || u.Shares < 0 || u.Exclusive < 0 {
		errs = append(errs, fmt.Errorf("node %s GPU %s: negative usage %+v", node, g.UUID, u))
	}
	return errs
}

// CheckRecords is the invariant checker for a whole cluster's published
// state: given each node's inventory and every pod's allocation record, it
// reports any GPU over its memory, cores or share count, any record naming
// a GPU its node does not have, and any exclusive GPU shared. Integration
// and end-to-end tests run it over what the API server holds.
func CheckRecords(inventories map[string]*api.NodeInventory, records map[string]*api.PodAllocation) error {
	c := NewCluster()
	names := make([]string, 0, len(inventories))
	for n := range inventories {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		n, err := NewNode(name, Unlimited, Unlimited, inventories[name])
		if err != nil {
			return err
		}
		c.UpsertNode(n)
	}
	pods := make([]string, 0, len(records))
	for p := range records {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	var errs []error
	for _, p := range pods {
		rec := records[p]
		if c.Node(rec.Node) == nil {
			errs = append(errs, fmt.Errorf("pod %s: allocated on node %s, which has no inventory", p, rec.Node))
			continue
		}
		if err := c.AssignRecord(p, 0, 0, rec); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.Check())
	return errors.Join(errs...)
}
