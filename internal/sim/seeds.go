package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// maxSeeds bounds a seed list (each seed is a full run per policy).
const maxSeeds = 1000

// ParseSeeds reads a seed list: "N" is seeds 1..N; otherwise a comma list
// of seeds and ranges A-B ("1-5,9").
func ParseSeeds(s string) ([]int64, error) {
	if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
		if n < 1 || n > maxSeeds {
			return nil, fmt.Errorf("seed count %d outside 1..%d", n, maxSeeds)
		}
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(i + 1)
		}
		return out, nil
	}
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.ParseInt(lo, 10, 64)
		b, err2 := strconv.ParseInt(hi, 10, 64)
		if err1 != nil || err2 != nil || b < a {
			return nil, fmt.Errorf("%q: want a seed or a range A-B with integers A <= B", part)
		}
		if b-a >= maxSeeds || len(out)+int(b-a+1) > maxSeeds {
			return nil, fmt.Errorf("more than %d seeds", maxSeeds)
		}
		for x := a; x <= b; x++ {
			out = append(out, x)
		}
	}
	return out, nil
}
