package policies

import (
	"cmp"
	"math"
	"slices"

	"github.com/tessera-gpu/tessera/internal/lp"
)

// pricing values GPU room in the currency of the target workload's GPU
// shares. The arc-flow LP of packing the workload's shares (in whole
// percent of a GPU) prices each share size: price[s] is the dual price of
// its demand row, the fraction of a GPU a share of s% is worth when the
// shares are packed as tightly as they can be (a share that only fills
// room no one else can use is worth 0; one that leaves room only tiny
// shares fit is worth nearly a whole GPU). fill[g] is the most a GPU with
// g% free can still earn at those prices (an unbounded knapsack), so a
// GPU that no pattern of the best packing completes earns less than its
// room.
//
// Placing a share of s% on a GPU with g% free gives up
// fill[g] − fill[g−s] − price[s] ≥ 0 of that GPU's value: zero when the
// share is one step of a best packing (a 320m share beside a 650m one),
// positive when it leaves room the workload cannot fill as well (a 230m
// share there). Packing towards zero loss is what the LP solution does.
type pricing struct {
	price [101]float64
	fill  [101]float64
}

// priceScale turns weights (which sum to at most 1) into demands of a
// size the simplex handles well; the prices do not depend on it.
const priceScale = 1000

// The LP prices at most maxPricedSizes share sizes (the most frequent) and
// none below minPricedSize percent: sizes the LP leaves out are worth
// what their room earns (fill), so a 2% share fills room at 2% of a GPU
// and prices nothing. This bounds the LP (about 100 arcs per size; the
// trace has 20 sizes and prices in about 10 ms) whatever the workload.
const (
	maxPricedSizes = 24
	minPricedSize  = 5
)

// newPricing prices the share shapes of a target workload; nil without
// shares or if the LP fails (then placements are not priced).
func newPricing(target []WeightedShape) *pricing {
	demand := make([]float64, 101)
	for _, w := range target {
		if w.Share() && w.Weight > 0 {
			demand[sharePercent(w.GPUMilli)] += w.Weight * priceScale
		}
	}
	var sizes []int
	for s := minPricedSize; s <= 100; s++ {
		if demand[s] > 0 {
			sizes = append(sizes, s)
		}
	}
	if len(sizes) == 0 {
		return nil
	}
	if len(sizes) > maxPricedSizes {
		slices.SortStableFunc(sizes, func(a, b int) int { return cmp.Compare(demand[b], demand[a]) })
		sizes = sizes[:maxPricedSizes]
		slices.Sort(sizes)
	}
	present := make([]float64, 101)
	for _, s := range sizes {
		present[s] = 1
	}
	m, err := lp.NewArcFlowAll(100, present, 1)
	if err != nil {
		return nil
	}
	first := m.Rows()
	for _, s := range sizes {
		if m.AddRow(m.Demand(s), lp.GE, demand[s]) != nil {
			return nil
		}
	}
	sol, err := m.SolveDual()
	if err != nil {
		return nil
	}
	p := &pricing{}
	for k, s := range sizes {
		p.price[s] = math.Max(0, sol.Dual[first+k])
	}
	for g := 1; g <= 100; g++ {
		p.fill[g] = p.fill[g-1]
		for _, s := range sizes {
			if s <= g {
				p.fill[g] = math.Max(p.fill[g], p.fill[g-s]+p.price[s])
			}
		}
	}
	// A size the LP did not price is worth what its room earns.
	priced := make([]bool, 101)
	for _, s := range sizes {
		priced[s] = true
	}
	for s := 1; s <= 100; s++ {
		if !priced[s] {
			p.price[s] = p.fill[s]
		}
	}
	return p
}

// loss is the value a share of s% gives up on a GPU with g% free (see
// pricing); 0 ≤ s ≤ g ≤ 100.
func (p *pricing) loss(g, s int) float64 {
	return math.Max(0, p.fill[g]-p.fill[g-s]-p.price[s])
}

// sharePercent is a share in whole percent of a GPU, rounded up.
func sharePercent(milli int64) int { return int(min(100, (milli+9)/10)) }

// freePercent is a GPU's free room in whole percent, rounded down.
func freePercent(milli int64) int { return int(max(0, min(100, milli/10))) }
