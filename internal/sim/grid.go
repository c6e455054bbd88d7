package sim

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// GridMixes is the generator's grid of workload mixes (see Variant):
// sharing-heavy, multi-GPU, model-constrained and CPU-heavy mixes.
var GridMixes = []string{
	"gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100",
	"multigpu20", "multigpu30", "multigpu40", "multigpu50",
	"gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
	"cpu50", "cpu100", "cpu150", "cpu200", "cpu250",
}

// Grid runs policies over generated mixes: every mix for every generator
// seed, each for every run seed.
type Grid struct {
	Trace          *Trace // the base the mixes are drawn from
	Mixes          []string
	GeneratorSeeds []int64
	Seeds          []int64
	Policies       []string
	Parallel       int
}

// GridRow is one mix: each policy summarised over all its runs (generator
// seeds × run seeds).
type GridRow struct {
	Mix     string         `json:"mix"`
	Results []PolicyResult `json:"results"`
}

// Run runs the grid, Parallel runs at a time within each mix.
func (g *Grid) Run(ctx context.Context) ([]GridRow, error) {
	rows := make([]GridRow, 0, len(g.Mixes))
	for _, mix := range g.Mixes {
		curves := make([][]*Curve, len(g.Policies))
		for _, vs := range g.GeneratorSeeds {
			pods, err := Variant(g.Trace, mix, vs)
			if err != nil {
				return nil, err
			}
			exp := &Experiment{Trace: &Trace{Nodes: g.Trace.Nodes, Pods: pods}, Policies: g.Policies, Seeds: g.Seeds, Parallel: g.Parallel}
			rs, err := exp.Run(ctx)
			if err != nil {
				return nil, fmt.Errorf("%s, generator seed %d: %w", mix, vs, err)
			}
			for p := range rs {
				curves[p] = append(curves[p], rs[p].Curves...)
			}
		}
		row := GridRow{Mix: mix}
		for p, name := range g.Policies {
			row.Results = append(row.Results, summarise(name, curves[p]))
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// WriteGridTable writes one line per mix: each policy's mean unallocated
// GPU % at arrived = 100% and 130% and its multi-GPU drops by 100%, and
// whether the last policy leaves less unallocated at 100% than the first.
func WriteGridTable(w io.Writer, rows []GridRow, runs int) error {
	if len(rows) == 0 {
		return nil
	}
	pols := rows[0].Results
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "unallocated GPU %% at arrived = 100%% / 130%% and multi-GPU tasks dropped by 100%% (means over %d runs per mix)\n", runs)
	hdr := []string{"mix"}
	for _, r := range pols {
		hdr = append(hdr, r.Policy+" 100%", "130%", "multi")
	}
	if len(pols) > 1 {
		hdr = append(hdr, pols[len(pols)-1].Policy+" − "+pols[0].Policy+" @100%")
	}
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	i100, i130 := checkpointIndex(100), checkpointIndex(130)
	wins := 0
	for _, row := range rows {
		line := []string{row.Mix}
		for _, r := range row.Results {
			line = append(line, fmt.Sprintf("%.2f", r.Unallocated[i100].Mean), fmt.Sprintf("%.2f", r.Unallocated[i130].Mean), fmt.Sprintf("%.1f", r.MultiDropped.Mean))
		}
		if n := len(row.Results); n > 1 {
			d := row.Results[n-1].Unallocated[i100].Mean - row.Results[0].Unallocated[i100].Mean
			if d < 0 {
				wins++
			}
			line = append(line, fmt.Sprintf("%+.2f", d))
		}
		fmt.Fprintln(tw, strings.Join(line, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(pols) > 1 {
		_, err := fmt.Fprintf(w, "\n%s leaves less unallocated than %s at arrived = 100%% on %d of %d mixes\n", pols[len(pols)-1].Policy, pols[0].Policy, wins, len(rows))
		return err
	}
	return nil
}

func checkpointIndex(x float64) int {
	for i, c := range Checkpoints {
		if c == x {
			return i
		}
	}
	panic(fmt.Sprintf("sim: %g is not a checkpoint", x))
}

// WriteGridCSV writes one row per mix, policy and checkpoint.
func WriteGridCSV(w io.Writer, rows []GridRow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"mix", "policy", "arrived_pct", "unallocated_mean", "unallocated_sd", "multigpu_dropped100_mean"}); err != nil {
		return err
	}
	for _, row := range rows {
		if err := writeRows(cw, []string{row.Mix}, row.Results, func(r *PolicyResult) []float64 {
			return []float64{r.MultiDropped.Mean}
		}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteGridJSON writes the grid's summaries.
func WriteGridJSON(w io.Writer, rows []GridRow, generatorSeeds, seeds []int64) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Checkpoints    []float64 `json:"checkpoints"`
		GeneratorSeeds []int64   `json:"generatorSeeds"`
		Seeds          []int64   `json:"seeds"`
		Mixes          []GridRow `json:"mixes"`
	}{Checkpoints, generatorSeeds, seeds, rows})
}
