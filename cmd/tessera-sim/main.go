// Command tessera-sim is Tessera's research simulator: it replays a GPU
// cluster trace (by default the openb trace bundled in
// examples/traces/openb) through the placement core and the placement
// policies, the scheduler's and the research baselines it is compared
// with, and reports how much GPU each leaves unallocated, with the LP
// floors on what any policy could (docs/simulation.md). It is a binary of
// its own so that the daemon (cmd/tessera) carries neither the trace, the
// floors nor the research baselines.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/tessera-gpu/tessera/internal/cli"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/sim"
	"github.com/tessera-gpu/tessera/internal/version"
)

const prog = "tessera-sim"

// errUsage marks errors whose message is a usage text (exit code 2).
var errUsage = cli.ErrUsage

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.ExitCode(os.Stderr, prog, "", runSimulate(ctx, os.Args[1:], os.Stdout, os.Stderr))
	stop()
	os.Exit(code)
}

func runSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	policyList := fs.String("policy", strings.Join(sim.Compared(), ","), "comma-separated placement policies (known: "+strings.Join(sim.Policies().Names(), ", ")+")")
	seedSpec := fs.String("seeds", "10", `seeds: a count N (seeds 1..N), a range "1-10" or a list "1,2,3"`)
	format := fs.String("format", "table", "output format: table, csv or json")
	nodesPath := fs.String("nodes", "", "node list CSV (default: the bundled openb node list)")
	podsPath := fs.String("pods", "", "pod list CSV (default: the bundled openb default pod list)")
	plot := fs.String("plot", "simulation.svg", `SVG plot output path ("" disables)`)
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "runs in parallel")
	variant := fs.String("variant", "", "replace the pods by a generated mix: gpushareN, multigpuN, gpuspecN or cpuN (e.g. gpushare40)")
	variantSeed := fs.Int64("variant-seed", 1, "seed of the variant generator")
	grid := fs.Bool("grid", false, "run the generator's grid of mixes ("+strings.Join(sim.GridMixes, ",")+") instead of one trace; default policies fgd,tessera")
	gridMixes := fs.String("grid-mixes", strings.Join(sim.GridMixes, ","), "with --grid: the mixes")
	gridSeeds := fs.String("grid-seeds", "3", "with --grid: generator seeds (same syntax as --seeds)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s [flags]\n\nReplays an openb trace through the placement core and reports unallocated GPU %%.\n\nFlags:\n", prog)
		fs.PrintDefaults()
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.String())
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch *format {
	case "table", "csv", "json":
	default:
		return fmt.Errorf("%w: --format %q: want table, csv or json", errUsage, *format)
	}
	if *parallel < 1 {
		return fmt.Errorf("%w: --parallel %d: want at least 1", errUsage, *parallel)
	}
	seeds, err := sim.ParseSeeds(*seedSpec)
	if err != nil {
		return fmt.Errorf("%w: --seeds: %v", errUsage, err)
	}
	if *grid && !set["policy"] {
		*policyList = policies.NameFGD + "," + policies.NameTessera
	}
	pols, err := parsePolicies(*policyList)
	if err != nil {
		return fmt.Errorf("%w: --policy: %v", errUsage, err)
	}
	tr, err := sim.LoadTrace(*nodesPath, *podsPath)
	if err != nil {
		return err
	}
	if *grid {
		if set["variant"] || set["variant-seed"] {
			return fmt.Errorf("%w: --grid runs its own mixes; --variant and --variant-seed do not apply", errUsage)
		}
		return runGrid(ctx, tr, pols, seeds, *gridMixes, *gridSeeds, *parallel, *format, stdout, stderr)
	}
	for _, f := range []string{"grid-mixes", "grid-seeds"} {
		if set[f] {
			return fmt.Errorf("%w: --%s applies only with --grid", errUsage, f)
		}
	}
	if *variant != "" {
		if tr.Pods, err = sim.Variant(tr, *variant, *variantSeed); err != nil {
			return fmt.Errorf("%w: --variant: %v", errUsage, err)
		}
	}
	start := time.Now()
	exp := &sim.Experiment{Trace: tr, Policies: pols, Seeds: seeds, Parallel: *parallel}
	rs, err := exp.Run(ctx)
	if err != nil {
		return err
	}
	floors, err := exp.Floors()
	if err != nil {
		return err
	}
	switch *format {
	case "table":
		err = sim.WriteTable(stdout, rs, floors, len(seeds))
		fmt.Fprintf(stderr, "%d runs in %.1fs\n", len(pols)*len(seeds), time.Since(start).Seconds())
	case "csv":
		err = sim.WriteCSV(stdout, rs)
	case "json":
		err = sim.WriteJSON(stdout, rs, floors, seeds)
	}
	if err != nil {
		return err
	}
	if *plot != "" {
		title := "openb default trace"
		if *variant != "" {
			title = "openb variant " + *variant
		}
		if err := writePlot(*plot, rs, floors, fmt.Sprintf("%s: unallocated GPU, mean of %d seeds", title, len(seeds))); err != nil {
			return err
		}
	}
	return nil
}

// runGrid runs the policies over the generator's grid of mixes and prints
// one line per mix (table), or the summaries as JSON; CSV has one row per
// mix, policy and checkpoint.
func runGrid(ctx context.Context, tr *sim.Trace, pols []string, seeds []int64, mixList, genSeeds string, parallel int, format string, stdout, stderr io.Writer) error {
	var mixes []string
	for _, m := range strings.Split(mixList, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if _, _, err := sim.ParseVariant(m); err != nil {
			return fmt.Errorf("%w: --grid-mixes: %v", errUsage, err)
		}
		mixes = append(mixes, m)
	}
	if len(mixes) == 0 {
		return fmt.Errorf("%w: --grid-mixes: no mix given", errUsage)
	}
	gs, err := sim.ParseSeeds(genSeeds)
	if err != nil {
		return fmt.Errorf("%w: --grid-seeds: %v", errUsage, err)
	}
	start := time.Now()
	g := &sim.Grid{Trace: tr, Mixes: mixes, GeneratorSeeds: gs, Seeds: seeds, Policies: pols, Parallel: parallel}
	rows, err := g.Run(ctx)
	if err != nil {
		return err
	}
	switch format {
	case "table":
		err = sim.WriteGridTable(stdout, rows, len(gs)*len(seeds))
		fmt.Fprintf(stderr, "%d runs in %.1fs\n", len(mixes)*len(gs)*len(seeds)*len(pols), time.Since(start).Seconds())
	case "csv":
		err = sim.WriteGridCSV(stdout, rows)
	case "json":
		err = sim.WriteGridJSON(stdout, rows, gs, seeds)
	}
	return err
}

func writePlot(path string, rs []sim.PolicyResult, fl *sim.FloorResult, title string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := sim.WriteSVG(f, rs, fl, title); err != nil {
		f.Close()
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return f.Close()
}

func parsePolicies(s string) ([]string, error) {
	cat := sim.Policies()
	known := map[string]bool{}
	for _, n := range cat.Names() {
		known[n] = true
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !known[p] {
			return nil, fmt.Errorf("unknown policy %q (known: %s)", p, strings.Join(cat.Names(), ", "))
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policy given")
	}
	return out, nil
}
