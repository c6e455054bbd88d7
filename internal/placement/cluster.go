package placement

import (
	"fmt"
	"sort"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Cluster is the placement state of a set of nodes: their GPUs and the pods
// allocated on them. It does no locking: callers serialise mutations
// (UpsertNode, RemoveNode, Assign, AssignRecord, Release); fit checks and
// scoring only read, so many may run at once between mutations.
type Cluster struct {
	// DefaultGPUPolicy chooses GPUs within a node for requests that name
	// no GPU policy. (The node-level default is the Policy the caller
	// passes to Search.Best or scores with.)
	DefaultGPUPolicy api.GPUPolicy

	nodes  []*Node
	byName map[string]int
	pods   map[string]*podEntry
	// onNode indexes pods by the node their record names.
	onNode map[string]map[string]struct{}
	models modelTable
}

// podEntry is what one pod holds: the record it was assigned with and the
// exact per-GPU charges derived from it, so Release subtracts what Assign added.
type podEntry struct {
	key      string
	node     string
	cpu, mem int64
	record   *api.PodAllocation
	charges  []gpushare.Charge
}

// NewCluster returns an empty cluster with the default policies.
func NewCluster() *Cluster {
	return &Cluster{
		DefaultGPUPolicy: api.DefaultGPUPolicy,
		byName:           map[string]int{},
		pods:             map[string]*podEntry{},
		onNode:           map[string]map[string]struct{}{},
	}
}

// Nodes returns the nodes in the order they were added. The slice and the
// nodes are the cluster's own: read them, do not modify them.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the named node, or nil.
func (c *Cluster) Node(name string) *Node {
	i, ok := c.byName[name]
	if !ok {
		return nil
	}
	return c.nodes[i]
}

// PodCount is the number of pods holding an allocation.
func (c *Cluster) PodCount() int { return len(c.pods) }

// Allocation returns the record a pod was assigned with, or nil.
func (c *Cluster) Allocation(pod string) *api.PodAllocation {
	if e := c.pods[pod]; e != nil {
		return e.record
	}
	return nil
}

// PodsOn returns the keys of the pods allocated on a node, sorted.
func (c *Cluster) PodsOn(node string) []string {
	out := make([]string, 0, len(c.onNode[node]))
	for k := range c.onNode[node] {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// UpsertNode adds a node or replaces its inventory and capacity. Pods
// already allocated on it keep their charges: they are applied again to the
// new GPU state (a GPU that disappeared from the inventory simply no longer
// carries them).
func (c *Cluster) UpsertNode(n *Node) {
	for i := range n.GPUs {
		n.GPUs[i].modelID = c.models.id(n.GPUs[i].Model)
		n.GPUs[i].Used = Usage{}
	}
	n.CPUUsed, n.MemUsed = 0, 0
	if i, ok := c.byName[n.Name]; ok {
		n.Version = c.nodes[i].Version + 1
		n.index = i
		c.nodes[i] = n
	} else {
		n.index = len(c.nodes)
		c.byName[n.Name] = len(c.nodes)
		c.nodes = append(c.nodes, n)
	}
	for k := range c.onNode[n.Name] {
		c.apply(n, c.pods[k], false)
	}
}

// RemoveNode forgets a node. Pods on it keep their records (they are
// released when the pods go away) but charge nothing.
func (c *Cluster) RemoveNode(name string) {
	i, ok := c.byName[name]
	if !ok {
		return
	}
	last := len(c.nodes) - 1
	c.nodes[i] = c.nodes[last]
	c.nodes[i].index = i
	c.byName[c.nodes[i].Name] = i
	c.nodes = c.nodes[:last]
	delete(c.byName, name)
}

// Assign records a placement chosen by Fit (directly or through
// Search.Best) for the request and returns the pod's allocation record.
func (c *Cluster) Assign(cr *Compiled, p *Placement) (*api.PodAllocation, error) {
	rec := p.Record(cr)
	if err := c.AssignRecord(cr.Req.Pod, cr.Req.CPUMilli, cr.Req.MemoryMiB, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// AssignRecord charges a pod's allocation record to its node, as when the
// scheduler rebuilds its state from pod annotations after a restart. The
// record is trusted (it was written by a scheduler): it is applied even if
// the node is now over capacity, which Check then reports. It fails if the
// pod already holds an allocation or a device is not on the node.
func (c *Cluster) AssignRecord(pod string, cpuMilli, memMiB int64, rec *api.PodAllocation) error {
	if _, dup := c.pods[pod]; dup {
		return fmt.Errorf("pod %s already holds an allocation", pod)
	}
	e := &podEntry{key: pod, node: rec.Node, cpu: cpuMilli, mem: memMiB, record: rec}
	n := c.Node(rec.Node)
	if n != nil {
		for _, ca := range rec.Containers {
			for _, d := range ca.Devices {
				if n.GPUByUUID(d.UUID) < 0 {
					return fmt.Errorf("pod %s: container %q holds GPU %s, which node %s does not have", pod, ca.Name, d.UUID, rec.Node)
				}
			}
		}
	}
	e.charges = chargesOf(rec, n)
	c.pods[pod] = e
	if c.onNode[rec.Node] == nil {
		c.onNode[rec.Node] = map[string]struct{}{}
	}
	c.onNode[rec.Node][pod] = struct{}{}
	if n != nil {
		c.apply(n, e, true)
	}
	return nil
}

// Release returns everything a pod holds. It reports whether the pod held anything.
func (c *Cluster) Release(pod string) bool {
	e, ok := c.pods[pod]
	if !ok {
		return false
	}
	delete(c.pods, pod)
	delete(c.onNode[e.node], pod)
	if len(c.onNode[e.node]) == 0 {
		delete(c.onNode, e.node)
	}
	if n := c.Node(e.node); n != nil {
		unapply(n, e)
	}
	return true
}

// SetUsage sets what is allocated on each GPU of a node whose
// allocations the cluster holds no records for (Tessera's DRA GPUs, whose
// claims the structured allocator allocates): used[i] is the usage of
// GPU i, in the node's GPU order. It reports whether the node exists
// with as many GPUs; the node's Version changes only if some usage did.
// A node's GPUs are either charged by records (Assign, AssignRecord) or
// set here, never both.
func (c *Cluster) SetUsage(node string, used []Usage) bool {
	n := c.Node(node)
	if n == nil || len(used) != len(n.GPUs) {
		return false
	}
	changed := false
	for i := range n.GPUs {
		if n.GPUs[i].Used != used[i] {
			n.GPUs[i].Used = used[i]
			changed = true
		}
	}
	if changed {
		n.Version++
	}
	return true
}

// unapply takes what e charges off n, the inverse of apply.
func unapply(n *Node, e *podEntry) {
	n.CPUUsed -= e.cpu
	n.MemUsed -= e.mem
	for _, ch := range e.charges {
		if i := n.GPUByUUID(ch.UUID); i >= 0 {
			n.GPUs[i].Used.sub(Usage(ch.Usage))
		}
	}
	if n.hasMIG {
		migHold(n, e.key, e.record, false)
	}
	n.Version++
}

func (c *Cluster) apply(n *Node, e *podEntry, bump bool) {
	n.CPUUsed += e.cpu
	n.MemUsed += e.mem
	for _, ch := range e.charges {
		if i := n.GPUByUUID(ch.UUID); i >= 0 {
			n.GPUs[i].Used.add(Usage(ch.Usage))
		}
	}
	if n.hasMIG {
		migHold(n, e.key, e.record, true)
	}
	if bump {
		n.Version++
	}
}

// chargesOf derives what a record holds on each GPU (gpushare.Charges:
// app containers add, init containers one at a time, a whole GPU is all
// of its capacity). n may be nil (node unknown): then whole-GPU grants
// charge their granted memory.
func chargesOf(rec *api.PodAllocation, n *Node) []gpushare.Charge {
	return gpushare.Charges(rec, func(uuid string) (int64, bool) {
		if n == nil {
			return 0, false
		}
		if i := n.GPUByUUID(uuid); i >= 0 {
			return n.GPUs[i].MemoryCap, true
		}
		return 0, false
	})
}
