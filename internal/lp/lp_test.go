package lp

import (
	"errors"
	"math"
	"testing"
)

func terms(pairs ...float64) []Term {
	var ts []Term
	for i := 0; i+1 < len(pairs); i += 2 {
		ts = append(ts, Term{Var: int(pairs[i]), Coeff: pairs[i+1]})
	}
	return ts
}

func solve(t *testing.T, p *Problem) (float64, []float64) {
	t.Helper()
	v, x, err := p.Solve()
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	return v, x
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-7 }

func TestTwoVariables(t *testing.T) {
	// min −x − y, x + 2y ≤ 4, 3x + y ≤ 6: optimum at (8/5, 6/5).
	var p Problem
	x, y := p.NewVar(-1), p.NewVar(-1)
	mustRow(t, &p, terms(float64(x), 1, float64(y), 2), LE, 4)
	mustRow(t, &p, terms(float64(x), 3, float64(y), 1), LE, 6)
	v, sol := solve(t, &p)
	if !near(v, -14.0/5) || !near(sol[x], 8.0/5) || !near(sol[y], 6.0/5) {
		t.Fatalf("got %v at %v, want −2.8 at (1.6, 1.2)", v, sol)
	}
}

func TestEqualityAndNegativeRHS(t *testing.T) {
	// min x + y, x − y = −1, x + y ≥ 3: y = x + 1, so x = 1, y = 2.
	var p Problem
	x, y := p.NewVar(1), p.NewVar(1)
	mustRow(t, &p, terms(float64(x), 1, float64(y), -1), EQ, -1)
	mustRow(t, &p, terms(float64(x), 1, float64(y), 1), GE, 3)
	v, sol := solve(t, &p)
	if !near(v, 3) || !near(sol[y]-sol[x], 1) {
		t.Fatalf("got %v at %v, want 3 with y = x + 1", v, sol)
	}
}

func TestRedundantRows(t *testing.T) {
	var p Problem
	x, y := p.NewVar(1), p.NewVar(0)
	mustRow(t, &p, terms(float64(x), 1, float64(y), 1), EQ, 2)
	mustRow(t, &p, terms(float64(x), 2, float64(y), 2), EQ, 4)
	v, sol := solve(t, &p)
	if !near(v, 0) || !near(sol[y], 2) {
		t.Fatalf("got %v at %v, want 0 at (0, 2)", v, sol)
	}
}

// Beale's example cycles under Dantzig's rule with naive tie-breaking.
func TestBealeDoesNotCycle(t *testing.T) {
	var p Problem
	x4, x5, x6, x7 := p.NewVar(-0.75), p.NewVar(20), p.NewVar(-0.5), p.NewVar(6)
	mustRow(t, &p, terms(float64(x4), 0.25, float64(x5), -8, float64(x6), -1, float64(x7), 9), LE, 0)
	mustRow(t, &p, terms(float64(x4), 0.5, float64(x5), -12, float64(x6), -0.5, float64(x7), 3), LE, 0)
	mustRow(t, &p, terms(float64(x6), 1), LE, 1)
	v, _ := solve(t, &p)
	if !near(v, -1.25) {
		t.Fatalf("got %v, want −1.25", v)
	}
}

func TestInfeasibleAndUnbounded(t *testing.T) {
	var p Problem
	x := p.NewVar(1)
	mustRow(t, &p, terms(float64(x), 1), GE, 2)
	mustRow(t, &p, terms(float64(x), 1), LE, 1)
	if _, _, err := p.Solve(); !errors.Is(err, ErrInfeasible) {
		t.Fatalf("x ≥ 2, x ≤ 1: got %v, want ErrInfeasible", err)
	}
	var q Problem
	a, b := q.NewVar(-1), q.NewVar(0)
	mustRow(t, &q, terms(float64(a), 1, float64(b), -1), LE, 1)
	if _, _, err := q.Solve(); !errors.Is(err, ErrUnbounded) {
		t.Fatalf("min −a, a − b ≤ 1: got %v, want ErrUnbounded", err)
	}
}

func TestBadRows(t *testing.T) {
	var p Problem
	p.NewVar(1)
	if err := p.AddRow(terms(3, 1), LE, 1); err == nil {
		t.Fatal("a row naming variable 3 of 1 was accepted")
	}
	if err := p.AddRow(terms(0, 1), Sense(7), 1); err == nil {
		t.Fatal("a row with sense 7 was accepted")
	}
}

func mustRow(t *testing.T, p *Problem, ts []Term, s Sense, rhs float64) {
	t.Helper()
	if err := p.AddRow(ts, s, rhs); err != nil {
		t.Fatal(err)
	}
}

// Dual prices: the rate at which the minimum moves with each right-hand
// side, checked against a perturbed re-solve and known values.
func TestDualPrices(t *testing.T) {
	build := func(b1, b2, b3 float64) *Problem {
		// min 2x + 3y + 4z, x + y ≥ b1, y + z ≥ b2, x + z ≤ b3 (slack),
		// with a negative right-hand side written as −x − y ≤ −b1 style.
		var p Problem
		x, y, z := p.NewVar(2), p.NewVar(3), p.NewVar(4)
		mustRow(t, &p, terms(float64(x), -1, float64(y), -1), LE, -b1)
		mustRow(t, &p, terms(float64(y), 1, float64(z), 1), GE, b2)
		mustRow(t, &p, terms(float64(x), 1, float64(z), 1), LE, b3)
		return &p
	}
	sol, err := build(2, 3, 100).SolveDual()
	if err != nil {
		t.Fatal(err)
	}
	// Optimum y = 3, x = 0 (cost 9): raising b2 costs 3 (more y); the
	// first row −x − y ≤ −2 does not bind; the third row is slack.
	if !near(sol.Value, 9) || !near(sol.Dual[0], 0) || !near(sol.Dual[1], 3) || !near(sol.Dual[2], 0) {
		t.Fatalf("value %v duals %v, want 9 and [0 3 0]", sol.Value, sol.Dual)
	}
	for i, d := range []struct{ b1, b2, b3 float64 }{{2.1, 3, 100}, {2, 3.1, 100}, {2, 3, 100.1}} {
		v, _, err := build(d.b1, d.b2, d.b3).Solve()
		if err != nil {
			t.Fatal(err)
		}
		// The first row is written negated: its price is per unit of −b1.
		step := 0.1
		if i == 0 {
			step = -0.1
		}
		if got := (v - sol.Value) / step; !near(got, sol.Dual[i]) {
			t.Errorf("row %d: re-solve moves the minimum by %v per unit, dual says %v", i, got, sol.Dual[i])
		}
	}
	// An equality row with a negative right-hand side: min x, x − y = −1,
	// y ≤ 5 → x = 0, y = 1; raising the rhs to −0.9 lowers y, not x: 0.
	// min y instead: y = x + 1 ≥ 1, dual of the equality is −1.
	var p Problem
	x, y := p.NewVar(0), p.NewVar(1)
	mustRow(t, &p, terms(float64(x), 1, float64(y), -1), EQ, -1)
	mustRow(t, &p, terms(float64(y), 1), LE, 5)
	sol, err = p.SolveDual()
	if err != nil {
		t.Fatal(err)
	}
	if !near(sol.Value, 1) || !near(sol.Dual[0], -1) || !near(sol.Dual[1], 0) {
		t.Fatalf("value %v duals %v, want 1 and [-1 0]", sol.Value, sol.Dual)
	}
	_ = x
}
