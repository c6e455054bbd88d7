package policies

import (
	"sort"
	"sync"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// WeightedShape is one task shape of a target workload and its share of
// the tasks (weights of a workload sum to 1).
type WeightedShape struct {
	Shape
	Weight float64
}

// TargetSetter is implemented by policies that measure fragmentation
// against a target workload. The simulator gives them the shapes of the
// trace's tasks (before inflation) before placing anything, as the
// published FGD runs did; without it they learn the workload from the pods
// they observe.
type TargetSetter interface {
	SetTarget(tasks []Shape)
}

// PopularShapes is FGD's target workload: tasks grouped by shape (CPU, GPU
// per task, GPU count, model constraint; memory is ignored), the most
// frequent shapes taken one at a time until they cover the fraction cover
// of all tasks, and their weights renormalised. Ties in frequency go to the
// larger shape, as in the original. At most maxTargetShapes shapes are
// taken (the original has no such bound; the published traces have fewer
// shapes), since scoring a node costs time in proportion to them: a
// scheduler fed pods of ever-new shapes would otherwise slow down with
// every one.
func PopularShapes(tasks []Shape, cover float64) []WeightedShape {
	out, _ := popularShapes(tasks, cover)
	return out
}

// popularShapes is PopularShapes that also returns how many of the tasks
// its shapes cover (the count the weights are shares of).
func popularShapes(tasks []Shape, cover float64) ([]WeightedShape, float64) {
	counts := map[Shape]float64{}
	mem := map[Shape]float64{}
	var total float64
	for _, s := range tasks {
		m := s.MemMiB
		s.MemMiB = 0
		counts[s]++
		mem[s] += float64(m)
		total++
	}
	out := make([]WeightedShape, 0, len(counts))
	for s, c := range counts {
		out = append(out, WeightedShape{Shape: s, Weight: c})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Weight != out[j].Weight {
			return out[i].Weight > out[j].Weight
		}
		return shapeLess(out[j].Shape, out[i].Shape)
	})
	var cum float64
	k := 0
	for k < len(out) && cum < cover*total && k < maxTargetShapes {
		cum += out[k].Weight
		k++
	}
	out = out[:k]
	for i := range out {
		// Memory is not part of the shape; carry the mean for policies
		// that use it.
		out[i].MemMiB = int64(mem[out[i].Shape] / out[i].Weight)
		out[i].Weight /= cum
	}
	return out, cum
}

// maxTargetShapes bounds a target workload's shapes (PopularShapes). The
// openb trace has 91 shapes, CPU-only ones included.
const maxTargetShapes = 128

func shapeLess(a, b Shape) bool {
	switch {
	case a.CPUMilli != b.CPUMilli:
		return a.CPUMilli < b.CPUMilli
	case a.GPUMilli != b.GPUMilli:
		return a.GPUMilli < b.GPUMilli
	case a.NumGPU != b.NumGPU:
		return a.NumGPU < b.NumGPU
	case a.Spec != b.Spec:
		return a.Spec < b.Spec
	}
	return a.MemMiB < b.MemMiB
}

// fragModel evaluates FGD's fragmentation of node states against a target
// workload. It is immutable once built, except for the per-model access
// table, which is filled on first use without a lock (sync.Map).
type fragModel struct {
	cpuOnly float64 // total weight of CPU-only shapes
	gpu     []WeightedShape
	access  sync.Map // node model (string) → []bool: may gpu[j] use it
	useMem  bool     // also require memory for a shape to fit
	// multi weighs the multi-copy measure (fragMulti) against FGD's
	// single-copy one: 0 is FGD's, 1 is fragMulti alone (tessera).
	multi float64
	// wholeOne keeps FGD's single-copy test for whole-GPU shapes in
	// fragMulti (copies are counted for shares only).
	wholeOne bool
	// prices values GPU room at the target's share prices (tessera); nil
	// when placements are not priced.
	prices *pricing
}

func newFragModel(target []WeightedShape, useMem bool) *fragModel {
	m := &fragModel{useMem: useMem}
	for _, w := range target {
		if w.NumGPU == 0 || w.GPUMilli == 0 {
			m.cpuOnly += w.Weight
		} else {
			m.gpu = append(m.gpu, w)
		}
	}
	return m
}

func (m *fragModel) accessFor(model string) []bool {
	if a, ok := m.access.Load(model); ok {
		return a.([]bool)
	}
	a := make([]bool, len(m.gpu))
	for j, w := range m.gpu {
		a[j] = ModelAllowed(w.Spec, model)
	}
	m.access.Store(model, a) // racing stores are equal
	return a
}

// ModelAllowed reports whether a shape's model constraint (spec: models
// joined by "|", as Shape.Spec and the trace's gpu_spec write them; empty
// for none) allows a GPU of the given model, matched as the placement core
// matches selectors (api.ModelMatches).
func ModelAllowed(spec, model string) bool {
	if spec == "" {
		return true
	}
	if model == "" {
		return false
	}
	start := 0
	for i := 0; i <= len(spec); i++ {
		if i == len(spec) || spec[i] == '|' {
			if api.ModelMatches(spec[start:i], model) {
				return true
			}
			start = i + 1
		}
	}
	return false
}

// frag is the expected idle GPU (milli) that the target workload cannot
// use on a node with the given free CPU, memory and per-GPU free milli: for
// each shape, all idle GPU if the shape cannot run there at all, else the
// idle GPU on GPUs too full for one of its per-GPU shares.
func (m *fragModel) frag(access []bool, cpuLeft, memLeft int64, free []int64) float64 {
	switch {
	case m.multi == 1:
		return m.fragMulti(access, cpuLeft, memLeft, free)
	case m.multi > 0:
		return m.multi*m.fragMulti(access, cpuLeft, memLeft, free) + (1-m.multi)*m.fragOne(access, cpuLeft, memLeft, free)
	}
	return m.fragOne(access, cpuLeft, memLeft, free)
}

// fragOne is FGD's measure (see frag).
func (m *fragModel) fragOne(access []bool, cpuLeft, memLeft int64, free []int64) float64 {
	var total int64
	for _, x := range free {
		total += x
	}
	if total == 0 {
		return 0
	}
	f := m.cpuOnly * float64(total)
	for j := range m.gpu {
		w := &m.gpu[j]
		if !access[j] || cpuLeft < w.CPUMilli || m.useMem && memLeft < w.MemMiB {
			f += w.Weight * float64(total)
			continue
		}
		fit, small := 0, int64(0)
		for _, x := range free {
			if x >= w.GPUMilli {
				fit++
			} else {
				small += x
			}
		}
		if fit >= w.NumGPU {
			f += w.Weight * float64(small)
		} else {
			f += w.Weight * float64(total)
		}
	}
	return f
}

// NodeFree fills free with the node's per-GPU free milli and returns it.
func NodeFree(n *placement.Node, free *[api.MaxGPUsPerNode]int64) []int64 {
	for i := range n.GPUs {
		free[i] = FreeMilli(&n.GPUs[i])
	}
	return free[:len(n.GPUs)]
}

// Fragmentation is FGD's fragmentation of the whole cluster against a
// target workload, in thousandths of a GPU.
func Fragmentation(c *placement.Cluster, target []WeightedShape) float64 {
	m := newFragModel(target, false)
	var sum float64
	var free [api.MaxGPUsPerNode]int64
	for _, n := range c.Nodes() {
		fr := NodeFree(n, &free)
		sum += m.frag(m.accessFor(nodeModel(n)), n.FreeCPU(), n.FreeMem(), fr)
	}
	return sum
}

// fragMulti is tessera's fragmentation: for each shape, the idle GPU that
// as many copies of the shape as the node can still take (limited by GPU
// room, CPU and memory) would leave unused. Unlike FGD's measure it sees
// that two 470m shares do not fit in 700m, and that 20 free cores do not
// let four free GPUs each take a 12-core task.
func (m *fragModel) fragMulti(access []bool, cpuLeft, memLeft int64, free []int64) float64 {
	var total, whole int64
	for _, x := range free {
		total += x
		if x == Milli {
			whole++
		}
	}
	if total == 0 {
		return 0
	}
	f := m.cpuOnly * float64(total)
	for j := range m.gpu {
		w := &m.gpu[j]
		if !access[j] {
			f += w.Weight * float64(total)
			continue
		}
		var copies int64
		switch {
		case w.Share():
			for _, x := range free {
				copies += x / w.GPUMilli
			}
		case m.wholeOne:
			if whole >= int64(w.NumGPU) && cpuLeft >= w.CPUMilli && (!m.useMem || memLeft >= w.MemMiB) {
				f += w.Weight * float64(total-whole*Milli)
			} else {
				f += w.Weight * float64(total)
			}
			continue
		default:
			copies = whole / int64(w.NumGPU)
		}
		if w.CPUMilli > 0 {
			copies = min(copies, max(0, cpuLeft)/w.CPUMilli)
		}
		if m.useMem && w.MemMiB > 0 {
			copies = min(copies, max(0, memLeft)/w.MemMiB)
		}
		f += w.Weight * float64(total-copies*w.TotalMilli())
	}
	return f
}
