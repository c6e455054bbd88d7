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
