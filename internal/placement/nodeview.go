package placement

import (
	"fmt"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// NodeView is a private copy of one node of a Cluster on which pods can be
// taken off and put on without changing the cluster: what a scheduler's
// preemption needs (its dry runs take a node's lower-priority pods off and
// put some back) and what pods nominated to a node need (they are put on
// the copy before the node is checked for a pod that must not take the
// room freed for them). Fit, scores and Victims read View.Node like any
// node.
//
// A view reads the cluster's records of the pods it takes off, so it is
// used under the same lock as the cluster's other readers; it is one
// goroutine's at a time (Clone gives another its own).
type NodeView struct {
	// Node is the copy. Its Version changes with every change of the view.
	Node *Node
	c    *Cluster
	// off are the cluster's pods on the node taken off, with what they
	// charged when they were taken off (Add puts exactly that back).
	off map[string]*podEntry
	// on are the pods put on that the cluster does not hold on the node.
	on map[string]*podEntry
}

// View returns a view of the named node as the cluster holds it now, or
// nil when the cluster has no such node.
func (c *Cluster) View(name string) *NodeView {
	n := c.Node(name)
	if n == nil {
		return nil
	}
	cp := n.Clone()
	// A value a policy keeps for the node (by index, node and version)
	// is not the copy's.
	cp.Version++
	return &NodeView{Node: cp, c: c}
}

// Clone returns an independent copy of the view.
func (v *NodeView) Clone() *NodeView {
	cp := &NodeView{Node: v.Node.Clone(), c: v.c}
	if len(v.off) > 0 {
		cp.off = make(map[string]*podEntry, len(v.off))
		for k, e := range v.off {
			cp.off[k] = e
		}
	}
	if len(v.on) > 0 {
		cp.on = make(map[string]*podEntry, len(v.on))
		for k, e := range v.on {
			cp.on[k] = e
		}
	}
	return cp
}

// Holds reports whether the view charges the pod: one of the cluster's
// pods on the node not taken off, or a pod put on.
func (v *NodeView) Holds(pod string) bool {
	if _, ok := v.on[pod]; ok {
		return true
	}
	if _, ok := v.off[pod]; ok {
		return false
	}
	return v.c.holdsOn(pod, v.Node.Name)
}

// ClusterPods are the cluster's pods on the node the view charges (not
// those taken off, nor those put on), in no order.
func (v *NodeView) ClusterPods() []string {
	out := make([]string, 0, len(v.c.onNode[v.Node.Name]))
	for k := range v.c.onNode[v.Node.Name] {
		if _, off := v.off[k]; !off {
			out = append(out, k)
		}
	}
	return out
}

// holdsOn reports whether the cluster charges pod to the node.
func (c *Cluster) holdsOn(pod, node string) bool {
	_, ok := c.onNode[node][pod]
	return ok
}

// Remove takes the pod off the view: one of the cluster's pods on the
// node, or a pod put on. It reports whether the view held it. A dynamic
// MIG instance of a pod taken off is free on the view even while the
// node's inventory still lists it (the node agent destroys it once the
// pod is gone).
func (v *NodeView) Remove(pod string) bool {
	if e, ok := v.on[pod]; ok {
		delete(v.on, pod)
		unapply(v.Node, e)
		return true
	}
	if _, ok := v.off[pod]; ok || !v.c.holdsOn(pod, v.Node.Name) {
		return false
	}
	e := v.c.pods[pod]
	if v.off == nil {
		v.off = map[string]*podEntry{}
	}
	v.off[pod] = e
	unapply(v.Node, e)
	if v.Node.hasMIG {
		migGone(v.Node, e.record, true)
	}
	return true
}

// Add puts back a pod Remove took off the cluster's pods, and reports
// whether it did.
func (v *NodeView) Add(pod string) bool {
	e, ok := v.off[pod]
	if !ok {
		return false
	}
	delete(v.off, pod)
	if v.Node.hasMIG {
		migGone(v.Node, e.record, false)
	}
	v.c.apply(v.Node, e, true)
	return true
}

// Put charges the view with a pod the cluster does not hold on the node,
// allocated by rec (a placement's Record, or a record planned for the
// pod); cpuMilli and memMiB are its CPU and memory. It fails, changing
// nothing, if the view holds the pod already or rec names a GPU the node
// does not have. Like AssignRecord, it does not check that the record fits.
func (v *NodeView) Put(pod string, cpuMilli, memMiB int64, rec *api.PodAllocation) error {
	if v.Holds(pod) {
		return fmt.Errorf("pod %s is on node %s already", pod, v.Node.Name)
	}
	for _, ca := range rec.Containers {
		for _, d := range ca.Devices {
			if v.Node.GPUByUUID(d.UUID) < 0 {
				return fmt.Errorf("pod %s: container %q holds GPU %s, which node %s does not have", pod, ca.Name, d.UUID, v.Node.Name)
			}
		}
	}
	e := &podEntry{key: pod, node: v.Node.Name, cpu: cpuMilli, mem: memMiB, record: rec, charges: chargesOf(rec, v.Node)}
	if v.on == nil {
		v.on = map[string]*podEntry{}
	}
	v.on[pod] = e
	v.c.apply(v.Node, e, true)
	return nil
}

// gpusOf is the set of GPU positions (bits) the view's pod charges or
// holds a MIG instance of; 0 for a pod the view does not know.
func (v *NodeView) gpusOf(pod string) uint64 {
	e := v.on[pod]
	if e == nil {
		e = v.off[pod]
	}
	if e == nil {
		if !v.c.holdsOn(pod, v.Node.Name) {
			return 0
		}
		e = v.c.pods[pod]
	}
	var m uint64
	for _, ch := range e.charges {
		if i := v.Node.GPUByUUID(ch.UUID); i >= 0 {
			m |= 1 << i
		}
	}
	for _, ca := range e.record.Containers {
		for _, d := range ca.Devices {
			if i := v.Node.GPUByUUID(d.UUID); i >= 0 {
				m |= 1 << i
			}
		}
	}
	return m
}
