package placement

import (
	"fmt"
	"sort"
	"sync"

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
// Observe once per arriving pod, before placing it.
type Observer interface {
	Observe(cr *Compiled)
}

// Factory makes a policy for a cluster. Policies with state (a random
// source, a workload estimate) get a fresh instance per run.
type Factory func(c *Cluster, seed int64) Policy

var (
	registryMu sync.RWMutex
	registry   = map[string]Factory{}
)

// Register makes a policy available by name. Policies register themselves
// from init functions; registering a name twice panics (a programming error).
func Register(name string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("placement: policy " + name + " registered twice")
	}
	registry[name] = f
}

// NewPolicy returns a fresh instance of the named policy.
func NewPolicy(name string, c *Cluster, seed int64) (Policy, error) {
	registryMu.RLock()
	f, ok := registry[name]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("unknown placement policy %q (known: %v)", name, PolicyNames())
	}
	return f(c, seed), nil
}

// PolicyNames lists the registered policies, sorted.
func PolicyNames() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func init() {
	Register(string(api.NodeBinpack), func(*Cluster, int64) Policy { return Binpack{} })
	Register(string(api.NodeSpread), func(*Cluster, int64) Policy { return Spread{} })
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
	var sum float64
	for i := range n.GPUs {
		g := &n.GPUs[i]
		u := g.Used
		u.add(p.charge[i])
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
