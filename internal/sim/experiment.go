package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
)

// Checkpoints are the arrived-workload levels (% of GPU capacity) reported.
var Checkpoints = []float64{90, 95, 100, 130}

// Stat is a mean and a sample standard deviation over seeds.
type Stat struct {
	Mean float64 `json:"mean"`
	SD   float64 `json:"sd"`
}

func statOf(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	m := sum / float64(len(xs))
	if len(xs) == 1 {
		return Stat{Mean: m}
	}
	var ss float64
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	return Stat{Mean: m, SD: math.Sqrt(ss / float64(len(xs)-1))}
}

// PolicyResult summarises one policy over all seeds.
type PolicyResult struct {
	Policy string `json:"policy"`
	// Unallocated GPU % at each checkpoint, in Checkpoints order.
	Unallocated []Stat `json:"unallocated"`
	// Fragmentation is FGD's cluster fragmentation at arrived = 100%, as
	// % of GPU capacity.
	Fragmentation Stat `json:"fragmentation"`
	// MultiDropped is the number of multi-GPU tasks dropped by arrived =
	// 100%.
	MultiDropped Stat `json:"multiGPUDropped"`
	// Curve is the mean unallocated GPU % at arrived = 0, 1, …, 130%.
	Curve  []float64 `json:"curve"`
	Curves []*Curve  `json:"-"`
}

// Experiment is a set of policies run over a set of seeds.
type Experiment struct {
	Trace    *Trace
	Policies []string
	Seeds    []int64
	Parallel int
}

// Run runs every policy for every seed, Parallel runs at a time.
func (e *Experiment) Run(ctx context.Context) ([]PolicyResult, error) {
	type job struct{ p, s int }
	curves := make([][]*Curve, len(e.Policies))
	for i := range curves {
		curves[i] = make([]*Curve, len(e.Seeds))
	}
	jobs := make(chan job)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for w := 0; w < max(1, e.Parallel); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				cv, err := RunContext(ctx, e.Trace, e.Policies[j.p], e.Seeds[j.s])
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s, seed %d: %w", e.Policies[j.p], e.Seeds[j.s], err)
				}
				curves[j.p][j.s] = cv
				mu.Unlock()
			}
		}()
	}
feed:
	for p := range e.Policies {
		for s := range e.Seeds {
			select {
			case jobs <- job{p, s}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if firstErr != nil {
		return nil, firstErr
	}
	out := make([]PolicyResult, len(e.Policies))
	for p, name := range e.Policies {
		out[p] = summarise(name, curves[p])
	}
	return out, nil
}

func summarise(name string, cs []*Curve) PolicyResult {
	r := PolicyResult{Policy: name, Curves: cs}
	for _, x := range Checkpoints {
		var xs []float64
		for _, c := range cs {
			xs = append(xs, c.Unallocated(x))
		}
		r.Unallocated = append(r.Unallocated, statOf(xs))
	}
	var fr, md []float64
	for _, c := range cs {
		fr = append(fr, c.FragAt100*100/float64(c.Capacity))
		md = append(md, float64(c.MultiDropped100))
	}
	r.Fragmentation, r.MultiDropped = statOf(fr), statOf(md)
	for x := 0; x <= 130; x++ {
		var sum float64
		for _, c := range cs {
			sum += c.Unallocated(float64(x))
		}
		r.Curve = append(r.Curve, sum/float64(len(cs)))
	}
	return r
}

// FloorResult is the floors of every seed (see Floor) and their summary.
type FloorResult struct {
	Seeds       []Floor `json:"seeds"`
	AnyPolicy   Stat    `json:"anyPolicy"`
	AllShares   Stat    `json:"allShares"`
	NeverRefuse Stat    `json:"neverRefuse"`
	LargeTasks  Stat    `json:"largeTasks"`
}

// Floors computes the floors of the experiment's seeds, Parallel at a
// time. They depend on the arrivals only, not on any policy.
func (e *Experiment) Floors() (*FloorResult, error) {
	fr := &FloorResult{Seeds: make([]Floor, len(e.Seeds))}
	errs := make([]error, len(e.Seeds))
	sem := make(chan struct{}, max(1, e.Parallel))
	var wg sync.WaitGroup
	for i, s := range e.Seeds {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			fr.Seeds[i], errs[i] = e.Trace.Floor(s)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var anyP, all, never, large []float64
	for _, f := range fr.Seeds {
		anyP, all, never = append(anyP, f.AnyPolicy), append(all, f.AllShares), append(never, f.NeverRefuse)
		large = append(large, f.LargeTasks)
	}
	fr.AnyPolicy, fr.AllShares, fr.NeverRefuse, fr.LargeTasks = statOf(anyP), statOf(all), statOf(never), statOf(large)
	return fr, nil
}
