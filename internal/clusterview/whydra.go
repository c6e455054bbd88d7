package clusterview

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/placement"
)

// WhyClaim is one of a pending DRA pod's claims and what it asks.
type WhyClaim struct {
	// Name is the pod's name of the claim (spec.resourceClaims[].name).
	Name string `json:"name"`
	// Claim is the ResourceClaim ("" until the controller created it
	// from Template).
	Claim     string         `json:"claim,omitempty"`
	Template  string         `json:"template,omitempty"`
	Allocated bool           `json:"allocated,omitempty"`
	Requests  []ClaimRequest `json:"requests"`
}

// WhyGPU is what one GPU of a DRA node has free, and which of the pod's
// requests it could take now.
type WhyGPU struct {
	Node       string   `json:"node"`
	GPU        int      `json:"gpu"`
	Model      string   `json:"model"`
	Healthy    bool     `json:"healthy"`
	FreeMiB    int64    `json:"freeMiB"`
	FreeCores  int      `json:"freeCores"`
	FreeShares int      `json:"freeShares"`
	Whole      bool     `json:"heldWhole,omitempty"`
	Fits       []string `json:"fits,omitempty"`
}

// whyDRA explains a pending pod that asks Tessera's GPUs through
// ResourceClaims. The scheduler's DynamicResources plugin allocates
// them; Tessera computes from the claims' allocations what each GPU of
// the DRA nodes has free and which of the pod's requests fit there by
// capacity alone (CEL selectors and device taints are the scheduler's:
// its last message is shown beside).
func (r *Report) whyDRA(p *corev1.Pod, w *WhyReport) *WhyReport {
	w.State = "pending (DRA)"
	specs, missing := r.dra.podClaimSpecs(p)
	for _, pc := range p.Spec.ResourceClaims {
		s, ok := specs[pc.Name]
		if !ok {
			continue
		}
		w.Claims = append(w.Claims, WhyClaim{Name: pc.Name, Claim: s.Claim, Template: s.Template, Allocated: s.Allocated, Requests: s.Requests})
	}
	if len(missing) > 0 {
		w.Summary = fmt.Sprintf("the pod waits for %s, not found in namespace %s: create it (the scheduler does not place a pod whose claims are missing)", strings.Join(missing, " and "), p.Namespace)
		return w
	}
	var reqs []ClaimRequest
	for _, c := range w.Claims {
		if !c.Allocated {
			reqs = append(reqs, c.Requests...)
		}
	}
	fitNodes := 0
	nodes := 0
	for _, n := range r.cluster.Nodes() {
		if !r.dra.nodes[n.Name] {
			continue
		}
		nodes++
		count := make([]int64, len(reqs))
		for gi := range n.GPUs {
			g := &n.GPUs[gi]
			wg := WhyGPU{Node: n.Name, GPU: g.Index, Model: g.Model, Healthy: g.Healthy, FreeMiB: g.FreeMemory(),
				FreeCores: g.FreeCores(), FreeShares: g.FreeShares(), Whole: g.Used.Exclusive > 0}
			for i, q := range reqs {
				if gpuFits(g, q) {
					wg.Fits = append(wg.Fits, q.Request)
					count[i]++
				}
			}
			w.GPUs = append(w.GPUs, wg)
		}
		ok := true
		for i, q := range reqs {
			if q.All {
				ok = ok && count[i] > 0
			} else {
				ok = ok && count[i] >= q.Count
			}
		}
		if ok {
			w.Fits = append(w.Fits, n.Name)
			fitNodes++
		}
	}
	const scope = "computed by Tessera from the claims' allocations, by capacity only (CEL selectors, device taints and the node's other resources are the scheduler's: see its last word)"
	switch {
	case nodes == 0:
		w.Summary = "no node publishes Tessera's DRA devices (ResourceSlices of driver gpu.tessera.io): turn a node to DRA mode (docs/dra.md) or check its node agent"
	case len(reqs) == 0:
		w.Summary = "the pod's claims are allocated; it waits for the scheduler to bind it (" + scope + ")"
	case fitNodes > 0:
		w.Summary = fmt.Sprintf("%d/%d DRA nodes have GPUs free for every request now; the pod waits for the scheduler's next attempt, or for what Tessera does not check (%s)", fitNodes, nodes, scope)
	default:
		w.Summary = fmt.Sprintf("0/%d DRA nodes have GPUs free for every request: wait for claims there to be released, or ask less memory/cores per GPU or fewer GPUs (%s)", nodes, scope)
	}
	return w
}

// gpuFits reports whether a GPU could take one device of request q now:
// healthy; a whole-GPU request an idle GPU; a share a GPU not held
// whole, in shared mode, with a share slot and the memory and cores.
func gpuFits(g *placement.GPU, q ClaimRequest) bool {
	if !g.Healthy {
		return false
	}
	if q.Whole() {
		return g.Idle()
	}
	if g.Used.Exclusive > 0 || g.FreeShares() <= 0 {
		return false
	}
	if g.MaxShares <= 1 && !g.Idle() {
		return false
	}
	return g.FreeMemory() >= q.MemoryMiB && int64(g.FreeCores()) >= q.Cores
}

// printDRA writes the claims and the DRA nodes' free GPUs.
func (w *WhyReport) printDRA(out io.Writer) error {
	for _, c := range w.Claims {
		from := "claim " + c.Claim
		if c.Template != "" && c.Claim == "" {
			from = "template " + c.Template + " (claim not created yet)"
		} else if c.Template != "" {
			from = "claim " + c.Claim + " from template " + c.Template
		}
		state := "not allocated"
		if c.Allocated {
			state = "allocated"
		}
		fmt.Fprintf(out, "\n  claim %s: %s, %s\n", c.Name, from, state)
		for _, q := range c.Requests {
			n := fmt.Sprintf("%d GPU(s)", q.Count)
			if q.All {
				n = "all matching GPUs"
			}
			ask := "each whole"
			if !q.Whole() {
				ask = fmt.Sprintf("%d MiB and %d%% cores of each", q.MemoryMiB, q.Cores)
			}
			sel := ""
			if q.Selectors > 0 {
				sel = fmt.Sprintf(", %d CEL selector(s)", q.Selectors)
			}
			name := q.Request
			if q.Sub != "" {
				name += "/" + q.Sub
			}
			fmt.Fprintf(out, "    request %s: %s of class %s, %s%s\n", name, n, q.Class, ask, sel)
		}
	}
	if len(w.GPUs) == 0 {
		return nil
	}
	fmt.Fprintln(out, "\n  DRA GPUs now:")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "    NODE\tGPU\tMODEL\tFREE (MiB)\tFREE CORES\tFREE SHARES\tFITS")
	for _, g := range w.GPUs {
		fits := strings.Join(g.Fits, ",")
		switch {
		case !g.Healthy:
			fits = "- (unhealthy)"
		case g.Whole:
			fits = "- (held whole)"
		case fits == "":
			fits = "-"
		}
		fmt.Fprintf(tw, "    %s\t%d\t%s\t%d\t%d%%\t%d\t%s\n", g.Node, g.GPU, g.Model, g.FreeMiB, g.FreeCores, g.FreeShares, fits)
	}
	return tw.Flush()
}
