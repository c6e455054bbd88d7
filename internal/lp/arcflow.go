package lp

import "math"

// ArcFlow is the arc-flow model of bin packing (Valério de Carvalho): a
// bin of capacity Cap is a path from position 0 to Cap whose arcs are
// items (from d to d+s for an item of size s) or one unit of idle room
// (d to d+1). The flow out of position 0 counts bins. Its LP relaxation
// is as strong as Gilmore and Gomory's. Item arcs start only where a bin
// can get to by stacking larger items first, which removes symmetric
// packings without losing any.
//
// The model has the flow rows; callers add demand rows (Demand) and
// whatever else they need, then solve.
type ArcFlow struct {
	Problem
	Cap  int
	Bins int // the variable counting bins (the flow out of position 0)
	arcs map[int][]int
}

// NewArcFlow builds the model for items of integer sizes 1..capacity;
// counts[s] > 0 marks size s present and bounds how many items of size s
// one bin may stack (counts may be fractional: it is a demand, rounded
// up here). binCost is the objective's weight on Bins.
func NewArcFlow(capacity int, counts []float64, binCost float64) (*ArcFlow, error) {
	return newArcFlow(capacity, counts, binCost, true)
}

// NewArcFlowAll is NewArcFlow with an arc for every size at every position
// (only the count's sign matters): the same LP optimum and valid dual
// prices, with at most capacity arcs per size, where the symmetry-reduced
// model has up to capacity/s times more for a size s that stacks (many
// small sizes make it large).
func NewArcFlowAll(capacity int, counts []float64, binCost float64) (*ArcFlow, error) {
	return newArcFlow(capacity, counts, binCost, false)
}

func newArcFlow(capacity int, counts []float64, binCost float64, reduce bool) (*ArcFlow, error) {
	m := &ArcFlow{Cap: capacity, arcs: map[int][]int{}}
	in := make([][]Term, capacity+1)
	out := make([][]Term, capacity+1)
	addArc := func(from, to, v int) {
		out[from] = append(out[from], Term{Var: v, Coeff: 1})
		in[to] = append(in[to], Term{Var: v, Coeff: 1})
	}
	reach := make([]bool, capacity+1) // positions reachable with larger items
	reach[0] = true
	for s := min(capacity, len(counts)-1); s >= 1; s-- {
		if counts[s] <= 0 {
			continue
		}
		if !reduce {
			for d := 0; d+s <= capacity; d++ {
				v := m.NewVar(0)
				addArc(d, d+s, v)
				m.arcs[s] = append(m.arcs[s], v)
			}
			continue
		}
		n := int(math.Ceil(counts[s]))
		next := append([]bool(nil), reach...)
		frontier := reach
		for k := 0; k < n && k < capacity/s; k++ {
			moved := make([]bool, capacity+1)
			for d := 0; d+s <= capacity; d++ {
				if !frontier[d] {
					continue
				}
				v := m.NewVar(0)
				addArc(d, d+s, v)
				m.arcs[s] = append(m.arcs[s], v)
				moved[d+s], next[d+s] = true, true
			}
			frontier = moved
		}
		reach = next
	}
	for d := 0; d < capacity; d++ {
		addArc(d, d+1, m.NewVar(0))
	}
	m.Bins = m.NewVar(binCost)
	if err := m.AddRow(append(out[0], Term{Var: m.Bins, Coeff: -1}), EQ, 0); err != nil {
		return nil, err
	}
	for d := 1; d < capacity; d++ {
		row := append([]Term(nil), in[d]...)
		for _, t := range out[d] {
			row = append(row, Term{Var: t.Var, Coeff: -1})
		}
		if err := m.AddRow(row, EQ, 0); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Demand returns the terms of size s's arcs (the items of size s the
// bins hold), after extra.
func (m *ArcFlow) Demand(s int, extra ...Term) []Term {
	row := append([]Term(nil), extra...)
	for _, v := range m.arcs[s] {
		row = append(row, Term{Var: v, Coeff: 1})
	}
	return row
}
