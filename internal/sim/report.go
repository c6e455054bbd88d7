package sim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the results as an aligned text table, then the floors
// (if fl is not nil).
func WriteTable(w io.Writer, rs []PolicyResult, fl *FloorResult, seeds int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "unallocated GPU %% at arrived workload (mean ± sd over %d seeds)\n", seeds)
	hdr := []string{"policy"}
	for _, x := range Checkpoints {
		hdr = append(hdr, fmt.Sprintf("%g%%", x))
	}
	hdr = append(hdr, "frag@100%", "multi-GPU drops@100%")
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	for _, r := range rs {
		row := []string{r.Policy}
		for _, s := range r.Unallocated {
			row = append(row, fmtStat(s))
		}
		row = append(row, fmtStat(r.Fragmentation), fmt.Sprintf("%.1f ± %.1f", r.MultiDropped.Mean, r.MultiDropped.SD))
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if fl == nil {
		return nil
	}
	if _, err := fmt.Fprintf(w, "\nfloor at arrived = 100%% (no policy can leave less unallocated; LP bounds on packing the\narrived GPU shares, ignoring CPU, memory, GPU models and node boundaries except as noted):\n"+
		"  any policy, even one that chooses which shares to drop   %s\n"+
		"  a policy that drops a task only when it fits nowhere     %s\n"+
		"    (then every later task needing as much CPU, memory and GPU is dropped too)\n"+
		"  a run that places every share that arrives               %s\n"+
		"  each includes the large tasks no node is left for        %s\n"+
		"    (tasks asking for more than half the GPUs of every node they fit: one per node)\n",
		fmtStat(fl.AnyPolicy), fmtStat(fl.NeverRefuse), fmtStat(fl.AllShares), fmtStat(fl.LargeTasks)); err != nil {
		return err
	}
	for _, pair := range [][2]string{{"fgd", "tessera"}} {
		base, ours := find(rs, pair[0]), find(rs, pair[1])
		if base == nil || ours == nil {
			continue
		}
		i := checkpointIndex(100)
		var line string
		switch gap := base.Unallocated[i].Mean - fl.NeverRefuse.Mean; {
		case gap <= -minGap:
			line = fmt.Sprintf("%s leaves %.3f points less than the never-refuse floor at arrived = 100%%: the floor is wrong (a bug; please report it)", pair[0], -gap)
		case gap < minGap:
			line = fmt.Sprintf("%s is at the never-refuse floor at arrived = 100%% (no gap to close); %s leaves %+.2f points of unallocated GPU against %s",
				pair[0], pair[1], ours.Unallocated[i].Mean-base.Unallocated[i].Mean, pair[0])
		default:
			line = fmt.Sprintf("%s closes %.0f%% of the gap between %s and the never-refuse floor at arrived = 100%%", pair[1], GapClosed(base, ours, fl), pair[0])
		}
		if _, err := fmt.Fprintf(w, "\n%s\n", line); err != nil {
			return err
		}
	}
	return nil
}

func find(rs []PolicyResult, name string) *PolicyResult {
	for i := range rs {
		if rs[i].Policy == name {
			return &rs[i]
		}
	}
	return nil
}

// GapClosed is the share (%) of the gap between base's mean unallocated
// GPU at arrived = 100% and the never-refuse floor that ours closes; NaN
// when there is no gap (base within minGap of the floor).
func GapClosed(base, ours *PolicyResult, fl *FloorResult) float64 {
	i := checkpointIndex(100)
	gap := base.Unallocated[i].Mean - fl.NeverRefuse.Mean
	if gap < minGap {
		return math.NaN()
	}
	return 100 * (base.Unallocated[i].Mean - ours.Unallocated[i].Mean) / gap
}

// minGap is the smallest gap (points of unallocated GPU %) GapClosed
// divides by: half the tables' resolution, so a policy at the floor up to
// rounding has no gap rather than a share of a rounding error.
const minGap = 0.005

func fmtStat(s Stat) string { return fmt.Sprintf("%.2f ± %.2f", s.Mean, s.SD) }

// WriteCSV writes one row per policy and checkpoint.
func WriteCSV(w io.Writer, rs []PolicyResult) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"policy", "arrived_pct", "unallocated_mean", "unallocated_sd", "frag100_mean", "frag100_sd"}); err != nil {
		return err
	}
	if err := writeRows(cw, nil, rs, func(r *PolicyResult) []float64 {
		return []float64{r.Fragmentation.Mean, r.Fragmentation.SD}
	}); err != nil {
		return err
	}
	cw.Flush()
	return cw.Error()
}

// writeRows writes one CSV row per policy result and checkpoint: lead,
// the policy, the checkpoint, the mean and sd unallocated there, then
// tail's values.
func writeRows(cw *csv.Writer, lead []string, rs []PolicyResult, tail func(*PolicyResult) []float64) error {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
	for k := range rs {
		r := &rs[k]
		for i, x := range Checkpoints {
			s := r.Unallocated[i]
			row := append(append([]string(nil), lead...), r.Policy, f(x), f(s.Mean), f(s.SD))
			for _, v := range tail(r) {
				row = append(row, f(v))
			}
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteJSON writes the results with the checkpoints and the floors.
func WriteJSON(w io.Writer, rs []PolicyResult, fl *FloorResult, seeds []int64) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Checkpoints []float64      `json:"checkpoints"`
		Seeds       []int64        `json:"seeds"`
		Results     []PolicyResult `json:"results"`
		Floor       *FloorResult   `json:"floor,omitempty"`
	}{Checkpoints, seeds, rs, fl})
}
