package placement

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"strconv"
)

// Evictable is a pod that may be evicted from a node to make room for a
// request: a preemption victim candidate. Victims takes them in the
// caller's order of importance, most important first (kube-scheduler:
// higher priority first, then the longer running).
type Evictable struct {
	// Pod is the pod's key in the cluster.
	Pod      string
	Priority int32
	// Protected: evicting the pod would violate a PodDisruptionBudget.
	Protected bool
}

// VictimCost ranks sets of victims, lower first, on the criteria
// kube-scheduler ranks preemption candidates by: fewer PodDisruptionBudget
// violations, then a lower highest priority, then fewer pods, then a
// lower sum of priorities.
type VictimCost struct {
	Protected   int
	MaxPriority int64 // math.MinInt64 for no victim
	Count       int
	SumPriority int64
}

// Less reports whether a is a better (cheaper) set of victims than b.
func (a VictimCost) Less(b VictimCost) bool {
	switch {
	case a.Protected != b.Protected:
		return a.Protected < b.Protected
	case a.MaxPriority != b.MaxPriority:
		return a.MaxPriority < b.MaxPriority
	case a.Count != b.Count:
		return a.Count < b.Count
	}
	return a.SumPriority < b.SumPriority
}

// Eviction is the victims Victims chose.
type Eviction struct {
	// Victims are indices into the evictables, in their order.
	Victims []int
	Cost    VictimCost
}

// victimBudget bounds the fit checks the exact search of one target
// spends on subsets of its candidate victims before it settles for the
// greedy choice.
const victimBudget = 512

// Victims chooses which of the evictable pods on the view's node to evict
// so that the request fits there, at the lowest VictimCost: the pods of
// one GPU (or of the GPUs the request needs), not a little freed on
// every GPU of the node. Pods the view does not hold, or holds because
// they were put on it (Put), are never chosen.
//
// For each GPU the request may use (the target) it keeps every pod not on
// the target (those that must still go, for CPU or memory, are found
// greedily in the order given, protected pods kept first), and among the
// target's pods finds the fewest of the lowest priorities whose eviction
// makes room: the lowest priority level at which evicting every
// unprotected pod up to it is enough, then the smallest subset of those
// (exhaustively, within victimBudget fit checks; greedily beyond). One
// more target, the whole node, is kube-scheduler's own greedy order. The
// cheapest target's victims win.
//
// Evictable pods the caller took off the view already count as on it. It
// returns false, leaving the view as it was, when the request does not
// fit even with every evictable pod gone. Otherwise it leaves the victims
// taken off the view, the other evictable pods on it (no victim when the
// request fits the node as it is), and p holding the request's placement
// there.
func (cr *Compiled) Victims(v *NodeView, ev []Evictable, ranker GPURanker, s *Scratch, p *Placement) (Eviction, bool) {
	vs := &victimSearch{cr: cr, v: v, ev: ev, ranker: ranker, s: s, p: p,
		mask: make([]uint64, len(ev)), off: make([]bool, len(ev)), was: make([]bool, len(ev))}
	for i, e := range ev {
		if _, put := v.on[e.Pod]; put {
			continue
		}
		_, off := v.off[e.Pod]
		if !off && !v.c.holdsOn(e.Pod, v.Node.Name) {
			continue
		}
		vs.idx = append(vs.idx, i)
		vs.mask[i] = v.gpusOf(e.Pod)
		vs.off[i], vs.was[i] = off, off
	}
	for _, i := range vs.idx {
		vs.put(i) // the node as it is, evictable pods the caller took off included
	}
	if vs.fit() {
		return Eviction{Cost: vs.cost(nil)}, true // room without evicting
	}
	for _, i := range vs.idx {
		vs.take(i)
	}
	if len(vs.idx) == 0 || !vs.fit() {
		vs.restore()
		return Eviction{}, false
	}
	var best Eviction
	found := false
	for _, t := range vs.targets() {
		if found && !vs.bound(t).Less(best.Cost) {
			continue // not even one victim of the target could do better
		}
		victims := vs.evaluate(t)
		c := vs.cost(victims)
		if !found || c.Less(best.Cost) {
			best, found = Eviction{Victims: victims, Cost: c}, true
		}
	}
	for _, i := range vs.idx {
		vs.put(i)
	}
	for _, i := range best.Victims {
		vs.take(i)
	}
	slices.Sort(best.Victims)
	if !vs.fit() {
		// Every target's choice was checked; this cannot happen unless
		// the evictables repeat a pod. Evict them all, which fits.
		best.Victims = best.Victims[:0]
		for _, i := range vs.idx {
			vs.take(i)
			best.Victims = append(best.Victims, i)
		}
		best.Cost = vs.cost(best.Victims)
		vs.fit()
	}
	return best, true
}

type victimSearch struct {
	cr     *Compiled
	v      *NodeView
	ev     []Evictable
	ranker GPURanker
	s      *Scratch
	p      *Placement
	// idx are the evictables the view holds (indices into ev), mask the
	// GPUs each charges, off whether each is off the view now and was
	// whether it was off when the search began.
	idx       []int
	mask      []uint64
	off, was  []bool
	fitChecks int
}

func (vs *victimSearch) fit() bool {
	vs.fitChecks++
	return vs.cr.Fit(vs.v.Node, vs.ranker, vs.s, vs.p).OK()
}

func (vs *victimSearch) take(i int) {
	if !vs.off[i] {
		vs.v.Remove(vs.ev[i].Pod)
		vs.off[i] = true
	}
}

func (vs *victimSearch) put(i int) {
	if vs.off[i] {
		vs.v.Add(vs.ev[i].Pod)
		vs.off[i] = false
	}
}

// restore leaves every evictable as it was when the search began.
func (vs *victimSearch) restore() {
	for _, i := range vs.idx {
		if vs.was[i] {
			vs.take(i)
		} else {
			vs.put(i)
		}
	}
}

func (vs *victimSearch) cost(victims []int) VictimCost {
	c := VictimCost{MaxPriority: math.MinInt64, Count: len(victims)}
	for _, i := range victims {
		e := vs.ev[i]
		if e.Protected {
			c.Protected++
		}
		c.MaxPriority = max(c.MaxPriority, int64(e.Priority))
		// As kube-scheduler sums them: every priority shifted to >= 0.
		c.SumPriority += int64(e.Priority) + math.MaxInt32 + 1
	}
	return c
}

// bound is the least a target's victims can cost: one pod of the lowest
// priority among those on it, protected only if all are.
func (vs *victimSearch) bound(t uint64) VictimCost {
	c := VictimCost{Protected: 1, MaxPriority: math.MaxInt64, Count: 1, SumPriority: math.MaxInt64}
	for _, i := range vs.idx {
		if t != 0 && vs.mask[i]&t == 0 {
			continue
		}
		e := vs.ev[i]
		if !e.Protected {
			c.Protected = 0
		}
		c.MaxPriority = min(c.MaxPriority, int64(e.Priority))
		c.SumPriority = min(c.SumPriority, int64(e.Priority)+math.MaxInt32+1)
	}
	return c
}

// targets are the GPU sets whose pods the search tries to evict: each
// GPU the request may use that holds an evictable pod; for a container
// that needs several GPUs, the ones cheapest to clear together; and 0,
// the whole node in kube-scheduler's order.
func (vs *victimSearch) targets() []uint64 {
	n := vs.v.Node
	var held uint64
	for _, i := range vs.idx {
		held |= vs.mask[i]
	}
	eligible := held
	if vs.cr.needsGPU && len(n.GPUs) > 0 && vs.cr.markEligible(n, vs.s).OK() {
		eligible = 0
		for g := range n.GPUs {
			if vs.s.eligible[g] {
				eligible |= 1 << g
			}
		}
	}
	var ts []uint64
	seen := map[string]bool{}
	for m := held & eligible; m != 0; m &= m - 1 {
		g := bits.TrailingZeros64(m)
		// GPUs alike whose pods are alike give alike victims: one of
		// them is enough (on a node full of replicas, one GPU of eight).
		if sig, ok := vs.signature(g); ok {
			if seen[sig] {
				continue
			}
			seen[sig] = true
		}
		ts = append(ts, 1<<g)
	}
	if k := vs.cr.maxCount; k > 1 && len(ts) > 1 {
		// The k GPUs cheapest to clear; free eligible GPUs cost nothing.
		type gpuCost struct {
			g int
			c VictimCost
		}
		var gs []gpuCost
		for g := range n.GPUs {
			if eligible&(1<<g) == 0 {
				continue
			}
			var on []int
			for _, i := range vs.idx {
				if vs.mask[i]&(1<<g) != 0 {
					on = append(on, i)
				}
			}
			gs = append(gs, gpuCost{g, vs.cost(on)})
		}
		slices.SortStableFunc(gs, func(a, b gpuCost) int {
			switch {
			case a.c.Less(b.c):
				return -1
			case b.c.Less(a.c):
				return 1
			}
			return 0
		})
		var t uint64
		for _, x := range gs[:min(k, len(gs))] {
			t |= 1 << x.g
		}
		if t&held != 0 && bits.OnesCount64(t&held) > 1 {
			ts = append(ts, t&held)
		}
	}
	if len(ts) > 0 && len(vs.idx) > wholeNodeTarget {
		// The whole node's exact search would exceed its budget and end
		// greedy; the GPUs' targets cover the pods.
		return ts
	}
	return append(ts, 0)
}

// wholeNodeTarget is how many evictable pods a node may have for the
// whole node to be a target besides its GPUs.
const wholeNodeTarget = 12

// signature describes GPU g and the evictable pods on it, for a target
// that evicts only pods of g: GPUs with equal signatures give victims of
// equal cost. ok is false where the search does not compare GPUs (MIG
// instances sit at places; a pod on several GPUs).
func (vs *victimSearch) signature(g int) (string, bool) {
	n := vs.v.Node
	gpu := &n.GPUs[g]
	if gpu.MIG != nil {
		return "", false
	}
	type podSig struct {
		u       Usage
		prio    int32
		protect bool
	}
	var ps []podSig
	for _, i := range vs.idx {
		if vs.mask[i]&(1<<g) == 0 {
			continue
		}
		if vs.mask[i] != 1<<g {
			return "", false
		}
		e := vs.v.off[vs.ev[i].Pod]
		if e == nil {
			return "", false
		}
		var u Usage
		for _, ch := range e.charges {
			u.add(Usage(ch.Usage))
		}
		ps = append(ps, podSig{u, vs.ev[i].Priority, vs.ev[i].Protected})
	}
	slices.SortFunc(ps, func(a, b podSig) int {
		return cmp.Or(cmp.Compare(a.prio, b.prio), cmp.Compare(a.u.MemoryMiB, b.u.MemoryMiB), cmp.Compare(a.u.Cores, b.u.Cores),
			cmp.Compare(a.u.Shares, b.u.Shares), cmp.Compare(a.u.Exclusive, b.u.Exclusive), boolCmp(a.protect, b.protect))
	})
	numa := 0
	if vs.cr.Req.NUMABind {
		numa = gpu.NUMANode
	}
	b := make([]byte, 0, 64+24*len(ps))
	num := func(v int64) { b = strconv.AppendInt(b, v, 10); b = append(b, ',') }
	usage := func(u Usage) { num(u.MemoryMiB); num(int64(u.Cores)); num(int64(u.Shares)); num(int64(u.Exclusive)) }
	usage(gpu.Used)
	num(gpu.MemoryMiB)
	num(gpu.MemoryCap)
	num(int64(gpu.MaxShares))
	num(int64(gpu.modelID))
	num(int64(gpu.SMs))
	num(int64(numa))
	b = append(b, gpu.Sharing...)
	for _, p := range ps {
		b = append(b, ';')
		usage(p.u)
		num(int64(p.prio))
		if p.protect {
			b = append(b, 'p')
		}
	}
	return string(b), true
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// evaluate returns the victims for target t (0: the whole node). It
// starts and ends with every evictable off the view.
func (vs *victimSearch) evaluate(t uint64) []int {
	var inside, outside []int
	for _, i := range vs.idx {
		if t == 0 || vs.mask[i]&t != 0 {
			inside = append(inside, i)
		} else {
			outside = append(outside, i)
		}
	}
	var victims []int
	for _, i := range outside {
		vs.put(i)
	}
	if len(outside) > 0 && !vs.fit() {
		for _, i := range outside {
			vs.take(i)
		}
		victims = vs.greedy(outside)
	}
	victims = append(victims, vs.cheapest(inside)...)
	for _, i := range vs.idx {
		vs.take(i)
	}
	return victims
}

// reprieveOrder is the order pods are given back in: protected pods
// first (kube-scheduler keeps them rather than others), each group in
// the caller's order of importance.
func (vs *victimSearch) reprieveOrder(pods []int) []int {
	out := make([]int, 0, len(pods))
	for _, protected := range []bool{true, false} {
		for _, i := range pods {
			if vs.ev[i].Protected == protected {
				out = append(out, i)
			}
		}
	}
	return out
}

// greedy gives back the pods (all off) one at a time in reprieve order,
// keeping each that still lets the request fit, and returns the others.
func (vs *victimSearch) greedy(pods []int) []int {
	var victims []int
	for _, i := range vs.reprieveOrder(pods) {
		vs.put(i)
		if !vs.fit() {
			vs.take(i)
			victims = append(victims, i)
		}
	}
	return victims
}

// cheapest returns the cheapest victims among pods (all off, the rest of
// the node as the caller left it).
func (vs *victimSearch) cheapest(pods []int) []int {
	if len(pods) == 0 {
		return nil
	}
	var levels []int32
	for _, i := range pods {
		if !vs.ev[i].Protected {
			levels = append(levels, vs.ev[i].Priority)
		}
	}
	slices.Sort(levels)
	levels = slices.Compact(levels)
	for _, l := range levels {
		var pool, keep []int
		for _, i := range pods {
			if e := vs.ev[i]; !e.Protected && e.Priority <= l {
				pool = append(pool, i)
			} else {
				keep = append(keep, i)
			}
		}
		for _, i := range keep {
			vs.put(i)
		}
		if vs.fit() {
			// Evicting every unprotected pod up to priority l makes
			// room and no lower level did: each set of victims from
			// pool that makes room has a pod of priority l.
			if victims, ok := vs.smallest(pool); ok {
				return victims
			}
			return vs.greedy(pool)
		}
		for _, i := range keep {
			vs.take(i)
		}
	}
	// Not without protected pods: kube-scheduler's order.
	return vs.greedy(pods)
}

// smallest finds the fewest pods of pool (all off, everything else as
// it stays) whose eviction makes room, the lowest sum of priorities among
// those, and the least important among equals. It gives up (false) when
// that would take more than victimBudget fit checks; pool is then off
// again. On success the other pods of pool are back on.
func (vs *victimSearch) smallest(pool []int) ([]int, bool) {
	// Least important first: among equal sets the first found wins.
	order := slices.Clone(pool)
	slices.Reverse(order)
	uniform := true
	for _, i := range order {
		uniform = uniform && vs.ev[i].Priority == vs.ev[order[0]].Priority
	}
	budget := victimBudget
	in := make([]bool, len(vs.ev))
	for k := 1; k <= len(order); k++ {
		if c := binomial(len(order), k); c > budget {
			return nil, false
		} else {
			budget -= c
		}
		var best []int
		var bestSum int64
		comb := make([]int, k)
		for j := range comb {
			comb[j] = j
		}
		for {
			for _, j := range comb {
				in[order[j]] = true
			}
			for _, i := range pool {
				if !in[i] {
					vs.put(i)
				}
			}
			ok := vs.fit()
			for _, i := range pool {
				vs.take(i)
			}
			var sum int64
			for _, j := range comb {
				in[order[j]] = false
				sum += int64(vs.ev[order[j]].Priority)
			}
			if ok && (best == nil || sum < bestSum) {
				best, bestSum = best[:0], sum
				for _, j := range comb {
					best = append(best, order[j])
				}
				if uniform {
					break
				}
			}
			if !nextCombination(comb, len(order)) {
				break
			}
		}
		if best != nil {
			for _, i := range best {
				in[i] = true
			}
			for _, i := range pool {
				if !in[i] {
					vs.put(i)
				}
			}
			return best, true
		}
	}
	return nil, false
}

// nextCombination advances comb (k ascending positions below n) to the
// next combination in lexicographic order; false after the last.
func nextCombination(comb []int, n int) bool {
	k := len(comb)
	for j := k - 1; j >= 0; j-- {
		if comb[j] < n-k+j {
			comb[j]++
			for l := j + 1; l < k; l++ {
				comb[l] = comb[l-1] + 1
			}
			return true
		}
	}
	return false
}

// binomial is n choose k, saturating at MaxInt32.
func binomial(n, k int) int {
	if k < 0 || k > n {
		return 0
	}
	k = min(k, n-k)
	c := 1
	for j := 1; j <= k; j++ {
		c = c * (n - k + j) / j
		if c > math.MaxInt32 {
			return math.MaxInt32
		}
	}
	return c
}
