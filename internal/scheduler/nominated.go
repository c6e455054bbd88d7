package scheduler

// Pods added to and removed from a node within a cycle (PreFilterExtensions)
// and pods nominated to nodes: kube-scheduler's preemption dry runs take a
// node's lower-priority pods off and put some back, and a pod must not take
// the room freed for a pod of at least its priority nominated to the node.

import (
	"context"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const viewsKey fwk.StateKey = Name + "/views"

// nodeViews are the nodes kube-scheduler added pods to or removed pods
// from in one copy of a cycle's state (AddPod, RemovePod): private copies
// of the nodes (placement.NodeView) that Filter fits the pod on. The
// cycle's own state has none; kube-scheduler makes them on the copies it
// takes for its preemption dry runs and for nominated pods, one goroutine
// each.
type nodeViews struct {
	m map[string]*placement.NodeView
}

// Clone copies every view: the copy of a state changes apart.
func (n *nodeViews) Clone() fwk.StateData {
	c := &nodeViews{m: make(map[string]*placement.NodeView, len(n.m))}
	for k, v := range n.m {
		c.m[k] = v.Clone()
	}
	return c
}

func readViews(cs fwk.CycleState) *nodeViews {
	d, err := cs.Read(viewsKey)
	if err != nil {
		return nil
	}
	v, _ := d.(*nodeViews)
	return v
}

// view returns the state's view of the node, made from the cluster on
// first use; nil for a node the plugin does not hold. The caller holds
// st.mu.
func (p *Plugin) view(cs fwk.CycleState, node string) *placement.NodeView {
	vs := readViews(cs)
	if vs == nil {
		vs = &nodeViews{m: map[string]*placement.NodeView{}}
		cs.Write(viewsKey, vs)
	}
	v := vs.m[node]
	if v == nil {
		if v = p.st.cluster.View(node); v == nil {
			return nil
		}
		vs.m[node] = v
	}
	return v
}

// PreFilterExtensions: AddPod and RemovePod keep the state's views.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// AddPod puts a pod on the state's view of the node: one of its pods a
// preemption dry run took off, or a pod nominated to the node, not bound
// yet (placed where its preemption planned it, else where it fits now).
func (p *Plugin) AddPod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, added fwk.PodInfo, ni fwk.NodeInfo) *fwk.Status {
	p.onView(cs, ni, func(v *placement.NodeView) {
		pod := added.GetPod()
		key := kubeobj.Key(pod)
		if v.Add(key) || v.Holds(key) || pod.Spec.NodeName != "" {
			// A bound pod the view does not hold holds nothing the
			// plugin knows of (released a moment ago, or never charged).
			return
		}
		p.putNominated(v, pod)
	})
	return nil
}

// RemovePod takes a pod off the state's view of the node.
func (p *Plugin) RemovePod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, removed fwk.PodInfo, ni fwk.NodeInfo) *fwk.Status {
	p.onView(cs, ni, func(v *placement.NodeView) {
		pod := removed.GetPod()
		key := kubeobj.Key(pod)
		if uid, held := p.st.holders[key]; held && uid != pod.UID {
			return // the key names another pod now
		}
		v.Remove(key)
	})
	return nil
}

// onView runs f on the state's view of the node, under st.mu for
// reading: for a pod the plugin places by its GPUs, on a node it holds
// and places on (not in mode dra).
func (p *Plugin) onView(cs fwk.CycleState, ni fwk.NodeInfo, f func(v *placement.NodeView)) {
	s := readState(cs)
	if s == nil || s.cpuOnly {
		return
	}
	node := ni.Node().Name
	p.st.mu.RLock()
	defer p.st.mu.RUnlock()
	if p.st.isDRA(node) {
		return
	}
	if v := p.view(cs, node); v != nil {
		f(v)
	}
}

// putNominated charges the view with a pod nominated to its node: with
// the record this scheduler's preemption planned for it there (the room
// its victims free), else where it fits the view now, else with its CPU
// and memory alone (it waits for room that is not free yet). The caller
// holds st.mu.
func (p *Plugin) putNominated(v *placement.NodeView, pod *corev1.Pod) {
	key := kubeobj.Key(pod)
	node := v.Node.Name
	cpu, mem := podrequest.EffectiveCPUMemory(pod)
	if plan := p.planFor(pod.UID, node); plan != nil && plan.rec != nil && v.Put(key, cpu, mem, plan.rec) == nil {
		return
	}
	none := &api.PodAllocation{Node: node}
	if !kubeobj.RequestsGPU(pod, p.names) {
		_ = v.Put(key, cpu, mem, none)
		return
	}
	req, err := podrequest.FromPod(pod, p.names)
	if err != nil {
		_ = v.Put(key, cpu, mem, none)
		return
	}
	cr, err := p.st.cluster.Compile(req)
	if err != nil {
		_ = v.Put(key, cpu, mem, none)
		return
	}
	sc := p.scratchs.Get().(*scratch)
	defer p.scratchs.Put(sc)
	if cr.Fit(v.Node, nil, &sc.s, &sc.p).OK() {
		_ = v.Put(key, cr.Req.CPUMilli, cr.Req.MemoryMiB, sc.p.Record(cr))
		return
	}
	_ = v.Put(key, cpu, mem, none)
}

// nominatedViews are, for the nodes with pods nominated to them that pod
// must leave room for (kube-scheduler's rule: of at least its priority,
// not itself), views of the nodes with those pods put on; PreFilter's
// candidates are chosen on them. The caller holds st.mu for reading.
func (p *Plugin) nominatedViews(pod *corev1.Pod) map[string]*placement.NodeView {
	if p.handle == nil {
		return nil
	}
	nodes := p.nominatedNodes()
	if len(nodes) == 0 {
		return nil
	}
	prio := corev1helpers.PodPriority(pod)
	var out map[string]*placement.NodeView
	for _, n := range nodes {
		if p.st.isDRA(n) {
			continue
		}
		var v *placement.NodeView
		for _, pi := range p.handle.NominatedPodsForNode(n) {
			np := pi.GetPod()
			if np.UID == pod.UID || corev1helpers.PodPriority(np) < prio {
				continue
			}
			if v == nil {
				if v = p.st.cluster.View(n); v == nil {
					break
				}
			}
			if !v.Holds(kubeobj.Key(np)) {
				p.putNominated(v, np)
			}
		}
		if v != nil {
			if out == nil {
				out = map[string]*placement.NodeView{}
			}
			out[n] = v
		}
	}
	return out
}

// nominations index the nodes pods are nominated to: those the informer
// shows (status.nominatedNodeName of unbound pods) and those this
// scheduler's preemption has just nominated (before the API has the
// pod's status). PreFilter asks kube-scheduler for the nominated pods of
// these nodes only, not of every node.
type nominations struct {
	byNode map[string]map[types.UID]struct{}
	byPod  map[types.UID]string
}

// nominate records that pod uid is nominated to node ("" = to none).
func (p *Plugin) nominate(uid types.UID, node string) {
	p.nomMu.Lock()
	defer p.nomMu.Unlock()
	n := &p.nom
	if old, ok := n.byPod[uid]; ok {
		if old == node {
			return
		}
		delete(n.byNode[old], uid)
		if len(n.byNode[old]) == 0 {
			delete(n.byNode, old)
		}
		delete(n.byPod, uid)
	}
	if node == "" {
		return
	}
	if n.byNode == nil {
		n.byNode, n.byPod = map[string]map[types.UID]struct{}{}, map[types.UID]string{}
	}
	if n.byNode[node] == nil {
		n.byNode[node] = map[types.UID]struct{}{}
	}
	n.byNode[node][uid] = struct{}{}
	n.byPod[uid] = node
}

// nominatedNodes are the nodes pods are nominated to, in name order.
func (p *Plugin) nominatedNodes() []string {
	p.nomMu.Lock()
	defer p.nomMu.Unlock()
	if len(p.nom.byNode) == 0 {
		return nil
	}
	out := make([]string, 0, len(p.nom.byNode))
	for n := range p.nom.byNode {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// observeNomination follows a pod's nomination from the informer: an
// unbound pod's status.nominatedNodeName. (A nomination this scheduler
// made is kept until the pod's status says otherwise or it is bound or
// deleted.)
func (p *Plugin) observeNomination(pod *corev1.Pod) {
	switch {
	case pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil:
		p.nominate(pod.UID, "")
	case pod.Status.NominatedNodeName != "":
		p.nominate(pod.UID, pod.Status.NominatedNodeName)
	}
}
