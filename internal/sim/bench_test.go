package sim

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
)

// BenchmarkDecision measures one placement decision (compile, observe,
// search over all 1,213 nodes) on the bundled trace's cluster filled to
// 70% of its GPUs, with churn: each placed pod is assigned and the oldest
// benchmark pod released, so per-node caches see realistic change. It
// reports the median as median-ns/pod.
func BenchmarkDecision(b *testing.B) {
	for _, pol := range []string{"bestfit", "fgd", "tessera"} {
		b.Run(pol, func(b *testing.B) { benchDecision(b, pol) })
	}
}

func benchDecision(b *testing.B, policy string) {
	tr := bundledTrace(b)
	c, err := BuildCluster(tr.Nodes)
	if err != nil {
		b.Fatal(err)
	}
	pol, err := Policies().New(policy, c, 1)
	if err != nil {
		b.Fatal(err)
	}
	if ts, ok := pol.(policies.TargetSetter); ok {
		ts.SetTarget(tr.Shapes())
	}
	obs, _ := pol.(placement.Observer)
	s := placement.NewSearch(c)
	order := tr.Arrivals(1, Inflation)
	var arrived int64
	k := 0
	place := func(i int, key string) (bool, time.Duration) {
		cr, err := c.Compile(Request(tr.Pods[i], key))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if obs != nil {
			obs.Observe(cr)
		}
		p := s.Best(cr, pol)
		d := time.Since(start)
		if p != nil {
			if _, err := c.Assign(cr, p); err != nil {
				b.Fatal(err)
			}
		}
		return p != nil, d
	}
	for ; arrived < tr.CapacityMilli()*7/10; k++ {
		place(order[k], "warm-"+strconv.Itoa(k))
		arrived += tr.Pods[order[k]].GPURequestMilli()
	}
	var fifo []string
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		key := "bench-" + strconv.Itoa(n)
		ok, d := place(order[k+n%(len(order)-k)], key)
		durs = append(durs, d)
		if ok {
			fifo = append(fifo, key)
		}
		if len(fifo) > 200 {
			c.Release(fifo[0])
			fifo = fifo[1:]
		}
	}
	b.StopTimer()
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Nanoseconds()), "median-ns/pod")
}
