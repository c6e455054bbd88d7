package clusterview

import (
	"fmt"
	"io"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// WhyReport says why a GPU pod is pending, computed afresh from the
// placement core over the report's cluster (not read back from the
// scheduler's last message, which may be old).
type WhyReport struct {
	Pod string `json:"pod"`
	// State is "running on <node>", "pending", or "not a GPU pod".
	State string `json:"state"`
	// Scheduler is the scheduler's last PodScheduled message, if any.
	Scheduler string `json:"scheduler,omitempty"`
	// Summary is the placement core's summary ("0/4 nodes fit: …"), or
	// what fits now.
	Summary string `json:"summary"`
	// Groups are the nodes by reason, largest group first.
	Groups []WhyGroup `json:"groups,omitempty"`
	// Fits are the nodes where the pod fits now (the scheduler will
	// place it at its next attempt unless something else stops it).
	Fits []string `json:"fits,omitempty"`
	// Claims and GPUs are, for a pod that asks Tessera's GPUs through
	// ResourceClaims (DRA), its claims and what the DRA nodes' GPUs have
	// free (whydra.go).
	Claims []WhyClaim `json:"claims,omitempty"`
	GPUs   []WhyGPU   `json:"gpus,omitempty"`
	// Nominated and Victims are, for a pod a preemption nominated a node
	// for, that node and the pods evicted for it (whypreempt.go).
	Nominated string      `json:"nominated,omitempty"`
	Victims   []WhyVictim `json:"victims,omitempty"`
}

// WhyGroup is the nodes that refuse the pod for the same reason.
type WhyGroup struct {
	Reason string   `json:"reason"`
	Hint   string   `json:"hint,omitempty"`
	Nodes  []string `json:"nodes"`
}

// Why explains pod namespace/name.
func (r *Report) Why(namespace, name string) (*WhyReport, error) {
	key := namespace + "/" + name
	p := r.objs[key]
	if p == nil {
		return nil, fmt.Errorf("pod %s not found", key)
	}
	w := &WhyReport{Pod: key}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			w.Scheduler = c.Message
		}
	}
	if p.Spec.NodeName != "" {
		w.State = "scheduled on " + p.Spec.NodeName
		w.Summary = "the pod is not pending"
		return w, nil
	}
	if r.dra.usesTesseraDRA(p) && !kubeobj.RequestsGPU(p, api.DefaultResourceNames) {
		return r.whyDRA(p, w), nil
	}
	if !kubeobj.RequestsGPU(p, api.DefaultResourceNames) {
		w.State = "not a GPU pod"
		w.Summary = "the pod asks for no GPU; Tessera does not hold it back (see kubectl describe pod)"
		return w, nil
	}
	w.State = "pending"
	req, err := podrequest.FromPod(p, api.DefaultResourceNames)
	if err != nil {
		w.Summary = "the pod's GPU request is invalid: " + err.Error()
		return w, nil
	}
	cr, err := r.cluster.Compile(req)
	if err != nil {
		w.Summary = "the pod's GPU request cannot be placed anywhere: " + err.Error()
		return w, nil
	}
	var s placement.Scratch
	var pl placement.Placement
	var reasons []placement.Reason
	type group struct {
		reasons []placement.Reason
		nodes   []string
	}
	groups := map[string]*group{}
	var order []string
	var draNodes []string
	for _, n := range r.cluster.Nodes() {
		if r.dra.nodes[n.Name] {
			// The placement core does not place on DRA nodes: the
			// scheduler's DynamicResources plugin allocates claims there.
			draNodes = append(draNodes, n.Name)
			continue
		}
		reason := cr.Fit(n, nil, &s, &pl)
		if reason.OK() {
			w.Fits = append(w.Fits, n.Name)
			continue
		}
		reasons = append(reasons, reason)
		// Nodes group by the reason without what differs from node to
		// node (what each offers); the group shows the best offer.
		k := reason
		k.Have = 0
		key := placement.Summarize(1, []placement.Reason{k})
		g := groups[key]
		if g == nil {
			g = &group{}
			groups[key] = g
			order = append(order, key)
		}
		g.reasons = append(g.reasons, reason)
		g.nodes = append(g.nodes, n.Name)
	}
	for _, k := range order {
		g := groups[k]
		n := len(g.nodes)
		text := placement.Summarize(n, g.reasons)
		text = strings.TrimPrefix(text, fmt.Sprintf("0/%d nodes fit: %d ", n, n))
		w.Groups = append(w.Groups, WhyGroup{Reason: text, Hint: g.reasons[0].Kind.Text().Hint, Nodes: g.nodes})
	}
	if len(draNodes) > 0 {
		w.Groups = append(w.Groups, WhyGroup{Reason: "node serves its GPUs through DRA (ResourceClaims of driver gpu.tessera.io)", Nodes: draNodes,
			Hint: "ask there with a ResourceClaim for capacity memory and cores (docs/dra.md); a pod asking whole GPUs alone (nvidia.com/gpu) may be served there through DeviceClass extended-resource.gpu.tessera.io"})
	}
	if len(r.bare) > 0 {
		g := &WhyGroup{Reason: "no Tessera GPU inventory", Nodes: r.bare,
			Hint: "a GPU node without the tessera.io/gpu-inventory annotation runs no node agent: check `kubectl -n tessera-system get pods -o wide -l app=tessera-node-agent`"}
		w.Groups = append(w.Groups, *g)
	}
	sort.SliceStable(w.Groups, func(i, j int) bool { return len(w.Groups[i].Nodes) > len(w.Groups[j].Nodes) })
	if len(w.Fits) > 0 {
		w.Summary = fmt.Sprintf("%d/%d nodes with GPUs fit the pod now; it waits for the scheduler's next attempt, or for a constraint Tessera does not check (node selector, taints, CPU, memory: see kubectl describe pod)", len(w.Fits), len(r.cluster.Nodes())-len(draNodes))
	} else {
		w.Summary = placement.Summarize(len(r.cluster.Nodes())-len(draNodes), reasons)
	}
	return w, nil
}

// Print writes the explanation.
func (w *WhyReport) Print(out io.Writer) error {
	fmt.Fprintf(out, "Pod %s: %s\n", w.Pod, w.State)
	if w.Scheduler != "" {
		fmt.Fprintf(out, "Scheduler's last word: %s\n", w.Scheduler)
	}
	fmt.Fprintf(out, "Now: %s\n", w.Summary)
	for _, g := range w.Groups {
		fmt.Fprintf(out, "\n  %d node(s): %s\n    %s\n", len(g.Nodes), g.Reason, nodeList(g.Nodes))
		if g.Hint != "" {
			fmt.Fprintf(out, "    what to do: %s\n", g.Hint)
		}
	}
	if err := w.printDRA(out); err != nil {
		return err
	}
	w.printPreemption(out)
	if len(w.Fits) > 0 {
		fmt.Fprintf(out, "\n  fits now on: %s\n", nodeList(w.Fits))
	}
	return nil
}

func nodeList(nodes []string) string {
	if len(nodes) > 6 {
		return fmt.Sprintf("%s +%d more", strings.Join(nodes[:6], ", "), len(nodes)-6)
	}
	return strings.Join(nodes, ", ")
}
