package placement

import (
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Policy ranks the nodes a pod fits. The scheduler's Score extension point,
// the simulator and the tools all rank through a Policy.
//
// A Policy may also implement GPURanker to choose GPUs within a node; if it
// does not, the request's GPU policy (binpack, spread, topology-aware)
// chooses them.
type Policy interface {
	// Name identifies the policy in configuration, annotations and reports.
	Name() string
	// ScoreNode rates placing the pod as p (on p.Node); higher is better.
	// It must not modify anything.
	ScoreNode(cr *Compiled, p *Placement) float64
}

// Observer is implemented by policies that learn from the workload (for
// example its popular shapes). The simulator and the scheduler call
// Observe once per arriving pod, before placing it, one call at a time
// and never while the pod's nodes are being scored; what it learns is
// published to scoring atomically.
type Observer interface {
	Observe(cr *Compiled)
}

// PodPolicy is implemented by policies that prepare per-pod state once per
// scheduling cycle (the pod's shape, the snapshot of what the policy has
// learned). ForPod returns the policy that scores that pod: its ScoreNode
// (and RankGPU, if the policy ranks GPUs) serve cr only, take no lock and
// are safe to call from many goroutines at once, for the rest of the
// pod's cycle. Callers use it through Prepare, after Observe.
//
// A PodPolicy's own ScoreNode and RankGPU give the same results without
// preparation (they prepare the pod on the fly, reusing what Observe
// prepared for it), only at a higher cost per call.
type PodPolicy interface {
	ForPod(cr *Compiled) Policy
}

// Prepare returns the policy that scores cr under pol: pol.ForPod(cr) if
// pol prepares per pod, else pol. The simulator's Search calls it once
// per pod; the scheduler calls it in PreFilter (after Observe) and keeps
// the result in the pod's CycleState for Filter and Score, with
// RankerFor(cr, prepared) as the GPU ranker.
func Prepare(cr *Compiled, pol Policy) Policy {
	if pp, ok := pol.(PodPolicy); ok {
		return pp.ForPod(cr)
	}
	return pol
}

// Binpack prefers the node that is fullest after placement, so that whole
// nodes stay free for large pods.
type Binpack struct{}

func (Binpack) Name() string { return string(api.NodeBinpack) }

func (Binpack) ScoreNode(cr *Compiled, p *Placement) float64 { return utilisationAfter(cr, p) }

// Spread prefers the emptiest node after placement.
type Spread struct{}

func (Spread) Name() string { return string(api.NodeSpread) }

func (Spread) ScoreNode(cr *Compiled, p *Placement) float64 { return -utilisationAfter(cr, p) }

// utilisationAfter is how full the node is once the pod is placed: the mean
// over its GPUs of allocated memory and compute fractions, or for nodes
// without GPUs (and CPU-only pods) the CPU fraction.
func utilisationAfter(cr *Compiled, p *Placement) float64 {
	n := p.Node
	if len(n.GPUs) == 0 || !cr.needsGPU {
		if n.CPUCapacity <= 0 || n.CPUCapacity >= Unlimited {
			return 0
		}
		return float64(n.CPUUsed+cr.Req.CPUMilli) / float64(n.CPUCapacity)
	}
	return gpuUtilisation(n, &p.charge)
}

// Utilisation is how full the node's GPUs are now: the mean over its
// GPUs of allocated memory and compute fractions (0 without GPUs), what
// Binpack maximises and Spread minimises.
func (n *Node) Utilisation() float64 {
	if len(n.GPUs) == 0 {
		return 0
	}
	return gpuUtilisation(n, nil)
}

// gpuUtilisation is Utilisation with charge (nil: nothing) added to each
// GPU; n has GPUs.
func gpuUtilisation(n *Node, charge *[api.MaxGPUsPerNode]Usage) float64 {
	var sum float64
	for i := range n.GPUs {
		g := &n.GPUs[i]
		u := g.Used
		if charge != nil {
			u.add(charge[i])
		}
		sum += float64(u.MemoryMiB)/float64(g.MemoryCap) + float64(u.Cores)/100
	}
	return sum / float64(2*len(n.GPUs))
}

// PolicyFor returns the node policy that applies to a request: the pod's
// own choice if it names one, else def.
func PolicyFor(cr *Compiled, def Policy) Policy {
	switch cr.Req.NodePolicy {
	case api.NodeBinpack:
		return Binpack{}
	case api.NodeSpread:
		return Spread{}
	}
	return def
}
