package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
)

// Inflation is the published workload inflation: arrivals continue past the
// trace until the GPU requested reaches 130% of capacity.
const Inflation = 1.30

// Trace is a node list and a pod list.
type Trace struct {
	Nodes []NodeRow
	Pods  []PodRow
}

// CapacityMilli is the cluster's GPU capacity in thousandths.
func (t *Trace) CapacityMilli() int64 {
	var c int64
	for _, n := range t.Nodes {
		c += int64(n.GPUs) * 1000
	}
	return c
}

// Arrivals is the published arrival order for one seed: the pods sorted by
// name and shuffled, then clones sampled with replacement appended until
// the next clone would push the GPU requested above ratio × capacity. It
// returns indexes into t.Pods (a clone repeats its original's index).
func (t *Trace) Arrivals(seed int64, ratio float64) []int {
	idx := make([]int, len(t.Pods))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return t.Pods[idx[a]].Name < t.Pods[idx[b]].Name })
	rng := rand.New(rand.NewPCG(uint64(seed), 0x7e55e7a))
	rng.Shuffle(len(idx), func(a, b int) { idx[a], idx[b] = idx[b], idx[a] })
	var total int64
	for _, i := range idx {
		total += t.Pods[i].GPURequestMilli()
	}
	limit := int64(ratio * float64(t.CapacityMilli()))
	if total == 0 {
		// Only CPU-only tasks: clones never add GPU request, so never stop.
		return idx
	}
	for total < limit {
		i := rng.IntN(len(t.Pods))
		g := t.Pods[i].GPURequestMilli()
		if total+g > limit {
			break
		}
		total += g
		idx = append(idx, i)
	}
	return idx
}

// Shapes are the shapes of the trace's tasks (before inflation), from which
// fragmentation-aware policies derive their target workload.
func (t *Trace) Shapes() []policies.Shape {
	shapes := make([]policies.Shape, len(t.Pods))
	for i, p := range t.Pods {
		shapes[i] = policies.RequestShape(Request(p, p.Name))
	}
	return shapes
}

// Curve is one run: after each arrival, the GPU requested so far by all
// arrived pods and the GPU allocated, in thousandths.
type Curve struct {
	Policy    string
	Seed      int64
	Capacity  int64
	Arrived   []int64
	Allocated []int64
	// FragAt100 is FGD's cluster fragmentation (milli) when arrivals
	// reach 100% of capacity.
	FragAt100 float64
	Dropped   int
	// MultiDropped100 counts the multi-GPU tasks (2 GPUs or more)
	// dropped by arrived = 100%.
	MultiDropped100 int
	// Node is the node each arrival was placed on ("" when dropped): the
	// replay through the real scheduler compares its bindings with it.
	Node []string
}

// Unallocated is the unallocated GPU % at the last arrival that keeps the
// arrived workload within pct % of capacity.
func (c *Curve) Unallocated(pct float64) float64 {
	limit := pct / 100 * float64(c.Capacity)
	k := sort.Search(len(c.Arrived), func(i int) bool { return float64(c.Arrived[i]) > limit })
	var alloc int64
	if k > 0 {
		alloc = c.Allocated[k-1]
	}
	return 100 - float64(alloc)*100/float64(c.Capacity)
}

// Run places the arrivals of one seed with one policy of Policies.
func Run(t *Trace, policy string, seed int64) (*Curve, error) {
	return RunContext(context.Background(), t, policy, seed)
}

// RunContext is Run, stopping early with ctx's error when ctx is done.
func RunContext(ctx context.Context, t *Trace, policy string, seed int64) (*Curve, error) {
	return RunWith(ctx, t, policy, func(c *placement.Cluster, seed int64) (placement.Policy, error) {
		return Policies().New(policy, c, seed)
	}, seed)
}

// RunOnline is RunContext with the policy learning the workload from the
// pods it places, as the scheduler's policy does, where Run gives a policy
// that takes a target (policies.TargetSetter: FGD) the trace's task shapes
// up front, as FGD was published. Policies without a target run as in Run.
func RunOnline(ctx context.Context, t *Trace, policy string, seed int64) (*Curve, error) {
	return runWith(ctx, t, policy, func(c *placement.Cluster, seed int64) (placement.Policy, error) {
		return Policies().New(policy, c, seed)
	}, seed, true)
}

// RunWith is RunContext with a policy made by mk (for experiments with
// settings that Policies does not list).
func RunWith(ctx context.Context, t *Trace, policy string, mk func(*placement.Cluster, int64) (placement.Policy, error), seed int64) (*Curve, error) {
	return runWith(ctx, t, policy, mk, seed, false)
}

func runWith(ctx context.Context, t *Trace, policy string, mk func(*placement.Cluster, int64) (placement.Policy, error), seed int64, online bool) (*Curve, error) {
	if t.CapacityMilli() == 0 {
		return nil, fmt.Errorf("the node list has no GPUs; unallocated GPU %% is undefined")
	}
	c, err := BuildCluster(t.Nodes)
	if err != nil {
		return nil, err
	}
	pol, err := mk(c, seed)
	if err != nil {
		return nil, err
	}
	shapes := t.Shapes()
	target := policies.PopularShapes(shapes, 0.95) // FGD's "typical pods"
	if ts, ok := pol.(policies.TargetSetter); ok && !online {
		ts.SetTarget(shapes)
	}
	obs, _ := pol.(placement.Observer)
	order := t.Arrivals(seed, Inflation)
	cv := &Curve{Policy: policy, Seed: seed, Capacity: t.CapacityMilli(),
		Arrived: make([]int64, len(order)), Allocated: make([]int64, len(order)), Node: make([]string, len(order))}
	search := placement.NewSearch(c)
	var arrived, alloc int64
	fragDone := false
	for k, i := range order {
		if k%256 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		row := t.Pods[i]
		g := row.GPURequestMilli()
		if !fragDone && arrived+g > cv.Capacity {
			cv.FragAt100 = policies.Fragmentation(c, target)
			fragDone = true
		}
		cr, err := c.Compile(Request(row, row.Name+"#"+strconv.Itoa(k)))
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", row.Name, err)
		}
		if obs != nil {
			obs.Observe(cr)
		}
		arrived += g
		if p := search.Best(cr, pol); p != nil {
			if _, err := c.Assign(cr, p); err != nil {
				return nil, fmt.Errorf("pod %s: %w", row.Name, err)
			}
			alloc += PlacedMilli(row)
			cv.Node[k] = p.Node.Name
		} else {
			cv.Dropped++
			if row.NumGPU > 1 && arrived <= cv.Capacity {
				cv.MultiDropped100++
			}
		}
		cv.Arrived[k], cv.Allocated[k] = arrived, alloc
	}
	if !fragDone {
		cv.FragAt100 = policies.Fragmentation(c, target)
	}
	return cv, nil
}
