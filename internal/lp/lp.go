// Package lp solves small linear programs: a dense two-phase simplex with
// Bland's rule against cycling. It exists for the simulator's lower bounds
// (a few hundred rows and a few thousand columns); it is not meant for
// large or badly scaled problems.
package lp

import (
	"errors"
	"fmt"
	"math"
)

// Sense is the relation of a constraint row.
type Sense int

// The relations a row may have with its right-hand side.
const (
	LE Sense = iota // Σ a·x ≤ b
	GE              // Σ a·x ≥ b
	EQ              // Σ a·x = b
)

// Term is one coefficient of a row.
type Term struct {
	Var   int
	Coeff float64
}

type row struct {
	terms []Term
	sense Sense
	rhs   float64
}

// Problem is: minimise Σ Obj[j]·x[j] subject to the rows, with x ≥ 0.
type Problem struct {
	obj  []float64
	rows []row
}

// ErrInfeasible and ErrUnbounded are Solve's verdicts on problems without
// an optimum.
var (
	ErrInfeasible = errors.New("lp: infeasible")
	ErrUnbounded  = errors.New("lp: unbounded")
)

const eps = 1e-9

// maxPivots stops a run that cannot finish (it would need a bug or a huge
// problem; Bland's rule rules out cycling).
const maxPivots = 1_000_000

// NewVar adds a variable x ≥ 0 with objective coefficient cost and
// returns its index.
func (p *Problem) NewVar(cost float64) int {
	p.obj = append(p.obj, cost)
	return len(p.obj) - 1
}

// AddRow adds the constraint Σ terms sense rhs.
func (p *Problem) AddRow(terms []Term, sense Sense, rhs float64) error {
	for _, t := range terms {
		if t.Var < 0 || t.Var >= len(p.obj) {
			return fmt.Errorf("lp: row %d names variable %d; there are %d", len(p.rows), t.Var, len(p.obj))
		}
	}
	if sense < LE || sense > EQ {
		return fmt.Errorf("lp: row %d has unknown sense %d", len(p.rows), sense)
	}
	p.rows = append(p.rows, row{terms: terms, sense: sense, rhs: rhs})
	return nil
}

// Rows is the number of rows added so far (the next row's index).
func (p *Problem) Rows() int { return len(p.rows) }

// Solve returns the minimum and a solution that attains it.
func (p *Problem) Solve() (float64, []float64, error) {
	sol, err := p.SolveDual()
	if err != nil {
		return 0, nil, err
	}
	return sol.Value, sol.X, nil
}

// Solution is an optimum of a Problem.
type Solution struct {
	// Value is the minimum; X a point that attains it.
	Value float64
	X     []float64
	// Dual[i] is the price of row i: how much the minimum grows per
	// unit its right-hand side grows (≥ 0 for a binding GE row, ≤ 0 for
	// a binding LE row, 0 for a slack one). Where the optimum is
	// degenerate several price vectors are optimal; Dual is the one of
	// the final basis.
	Dual []float64
}

// SolveDual is Solve with the rows' dual prices.
func (p *Problem) SolveDual() (*Solution, error) {
	n := len(p.obj)
	m := len(p.rows)
	slacks := 0
	for _, r := range p.rows {
		if r.sense != EQ {
			slacks++
		}
	}
	// Columns: variables, slacks, one artificial per row, then the
	// right-hand side.
	art := n + slacks
	cols := art + m
	rhs := cols
	t := make([][]float64, m+1)
	for i := range t {
		t[i] = make([]float64, cols+1)
	}
	basis := make([]int, m)
	negated := make([]bool, m)
	s := n
	for i, r := range p.rows {
		a := t[i+1]
		for _, term := range r.terms {
			a[term.Var] += term.Coeff
		}
		switch r.sense {
		case LE:
			a[s] = 1
			s++
		case GE:
			a[s] = -1
			s++
		}
		a[rhs] = r.rhs
		if a[rhs] < 0 {
			for j := range a {
				a[j] = -a[j]
			}
			negated[i] = true
		}
		a[art+i] = 1
		basis[i] = art + i
	}
	tb := &tableau{t: t, basis: basis, rhs: rhs, enter: art}
	// Phase 1: minimise the sum of the artificials.
	for j := 0; j <= cols; j++ {
		if j >= art && j < cols {
			continue
		}
		for i := 1; i <= m; i++ {
			t[0][j] -= t[i][j]
		}
	}
	if err := tb.run(); err != nil {
		return nil, err
	}
	scale := 1.0
	for i := 1; i <= m; i++ {
		scale = math.Max(scale, math.Abs(t[i][rhs]))
	}
	if -t[0][rhs] > 1e-7*scale {
		return nil, ErrInfeasible
	}
	// Drive the artificials left in the basis (at zero) out; a row
	// where no real column can replace one is redundant and stays inert.
	for i := 1; i <= m; i++ {
		if basis[i-1] < art {
			continue
		}
		for j := 0; j < art; j++ {
			if math.Abs(t[i][j]) > eps {
				tb.pivot(i, j)
				break
			}
		}
	}
	// Phase 2: the real objective, priced out against the basis.
	for j := range t[0] {
		t[0][j] = 0
	}
	copy(t[0], p.obj)
	for i := 1; i <= m; i++ {
		if b := basis[i-1]; b < n && p.obj[b] != 0 {
			c := p.obj[b]
			for j := range t[0] {
				t[0][j] -= c * t[i][j]
			}
		}
	}
	if err := tb.run(); err != nil {
		return nil, err
	}
	x := make([]float64, n)
	for i, b := range basis {
		if b < n {
			x[b] = t[i+1][rhs]
		}
	}
	// Row i's artificial column started as the unit vector, so its
	// reduced cost is minus the dual price of the row as stored (negated
	// where the right-hand side was).
	dual := make([]float64, m)
	for i := range dual {
		dual[i] = -t[0][art+i]
		if negated[i] {
			dual[i] = -dual[i]
		}
	}
	return &Solution{Value: -t[0][rhs], X: x, Dual: dual}, nil
}

type tableau struct {
	t     [][]float64
	basis []int
	rhs   int
	enter int // columns below this may enter the basis
}

// run pivots until no reduced cost is negative: Dantzig's rule, and
// Bland's after a run of degenerate pivots so that it cannot cycle.
func (tb *tableau) run() error {
	degenerate := 0
	for it := 0; it < maxPivots; it++ {
		obj := tb.t[0]
		col := -1
		if degenerate < 50 {
			best := -eps
			for j := 0; j < tb.enter; j++ {
				if obj[j] < best {
					best, col = obj[j], j
				}
			}
		} else {
			for j := 0; j < tb.enter; j++ {
				if obj[j] < -eps {
					col = j
					break
				}
			}
		}
		if col < 0 {
			return nil
		}
		r := -1
		var ratio float64
		for i := 1; i < len(tb.t); i++ {
			a := tb.t[i][col]
			if a <= eps {
				continue
			}
			q := tb.t[i][tb.rhs] / a
			if r < 0 || q < ratio-eps || (q <= ratio+eps && tb.basis[i-1] < tb.basis[r-1]) {
				r, ratio = i, q
			}
		}
		if r < 0 {
			return ErrUnbounded
		}
		if ratio <= eps {
			degenerate++
		} else {
			degenerate = 0
		}
		tb.pivot(r, col)
	}
	return fmt.Errorf("lp: no optimum after %d pivots", maxPivots)
}

func (tb *tableau) pivot(r, col int) {
	pr := tb.t[r]
	inv := 1 / pr[col]
	for j := range pr {
		pr[j] *= inv
	}
	pr[col] = 1
	for i, a := range tb.t {
		if i == r {
			continue
		}
		f := a[col]
		if f == 0 {
			continue
		}
		for j, v := range pr {
			if v != 0 {
				a[j] -= f * v
			}
		}
		a[col] = 0
	}
	tb.basis[r-1] = col
}
