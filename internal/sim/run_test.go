package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// smallTrace is two 2-GPU nodes (capacity 4000m) and n pods cycling
// through a whole GPU, a 500m share and a CPU-only task.
func smallTrace(t *testing.T, n int) *Trace {
	t.Helper()
	nodes, err := ParseNodes(strings.NewReader(nodeHeader+"a,32000,65536,2,T4\nb,32000,65536,2,T4\n"), "nodes.csv")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString(podHeader)
	kinds := []string{"1,1000", "1,500", "0,0"}
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "p%03d,1000,1024,%s,,LS,Running,0,0,0\n", i, kinds[i%3])
	}
	pods, err := ParsePods(strings.NewReader(b.String()), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	return &Trace{Nodes: nodes, Pods: pods}
}

func TestInflationStopsAt130(t *testing.T) {
	tr := smallTrace(t, 3)
	for i := range tr.Pods { // every task a whole GPU
		tr.Pods[i].NumGPU, tr.Pods[i].GPUMilli = 1, 1000
	}
	// 3 GPUs requested; clones of 1 GPU are added while the total stays
	// within 130% of 4 GPUs = 5.2 GPUs: 5 arrivals.
	for seed := int64(1); seed <= 5; seed++ {
		if got := len(tr.Arrivals(seed, Inflation)); got != 5 {
			t.Errorf("seed %d: %d arrivals, want 5", seed, got)
		}
	}
}

func TestInflationNeverExceedsLimit(t *testing.T) {
	tr := smallTrace(t, 6) // 3000m of 4000m requested
	for seed := int64(1); seed <= 20; seed++ {
		var total int64
		for _, i := range tr.Arrivals(seed, Inflation) {
			total += tr.Pods[i].GPURequestMilli()
		}
		if total > 5200 || total < 5200-1000 {
			t.Errorf("seed %d: %dm requested, want within (4200, 5200]", seed, total)
		}
	}
}

func TestCPUOnlyTraceDoesNotInflateForever(t *testing.T) {
	tr := smallTrace(t, 3)
	tr.Pods = tr.Pods[2:] // the CPU-only task
	if got := len(tr.Arrivals(1, Inflation)); got != 1 {
		t.Errorf("%d arrivals, want the 1 task", got)
	}
}

func TestArrivalOrderIsSeeded(t *testing.T) {
	tr := smallTrace(t, 30)
	a, b, c := tr.Arrivals(7, Inflation), tr.Arrivals(7, Inflation), tr.Arrivals(8, Inflation)
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different orders")
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 7 and 8 give the same order")
	}
	// The order starts from the name-sorted list, so the input order of
	// the rows does not matter.
	rev := &Trace{Nodes: tr.Nodes, Pods: slices.Clone(tr.Pods)}
	slices.Reverse(rev.Pods)
	names := func(tr *Trace, idx []int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, tr.Pods[i].Name)
		}
		return out
	}
	if !slices.Equal(names(tr, a)[:30], names(rev, rev.Arrivals(7, Inflation))[:30]) {
		t.Errorf("row order changed the arrival order")
	}
}

func TestArrivedCountsDroppedPods(t *testing.T) {
	tr := smallTrace(t, 2)
	// An 8-GPU task fits no node; it still counts as arrived.
	tr.Pods[0].NumGPU, tr.Pods[0].GPUMilli = 8, 1000
	cv, err := Run(tr, "bestfit", 1)
	if err != nil {
		t.Fatal(err)
	}
	if cv.Dropped == 0 {
		t.Fatal("the 8-GPU task was placed")
	}
	last := len(cv.Arrived) - 1
	var arrived, alloc int64
	for _, i := range tr.Arrivals(1, Inflation) {
		arrived += tr.Pods[i].GPURequestMilli()
		if tr.Pods[i].NumGPU == 1 {
			alloc += tr.Pods[i].GPURequestMilli()
		}
	}
	if cv.Arrived[last] != arrived || cv.Allocated[last] != alloc {
		t.Errorf("arrived %d allocated %d, want %d and %d", cv.Arrived[last], cv.Allocated[last], arrived, alloc)
	}
	if got, want := cv.Unallocated(130), 100-float64(alloc)*100/4000; got != want {
		t.Errorf("Unallocated(130) = %v, want %v", got, want)
	}
	if got := cv.Unallocated(0); got != 100 {
		t.Errorf("Unallocated(0) = %v, want 100", got)
	}
}

// Multi-GPU tasks dropped by arrived = 100% are counted (a 3-GPU task
// fits no 2-GPU node), its clones arriving later are not.
func TestMultiGPUDropsCounted(t *testing.T) {
	tr := smallTrace(t, 9)
	for i := range tr.Pods {
		if tr.Pods[i].NumGPU > 0 {
			tr.Pods[i].NumGPU, tr.Pods[i].GPUMilli = 1, 50
		}
	}
	tr.Pods[0].NumGPU, tr.Pods[0].GPUMilli = 3, 1000
	counted := 0
	for seed := int64(1); seed <= 5; seed++ {
		cv, err := Run(tr, "tessera", seed)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		var arrived int64
		for _, i := range tr.Arrivals(seed, Inflation) {
			arrived += tr.Pods[i].GPURequestMilli()
			if i == 0 && arrived <= tr.CapacityMilli() {
				want++
			}
		}
		if cv.MultiDropped100 != want {
			t.Errorf("seed %d: %d multi-GPU drops by 100%%, want %d", seed, cv.MultiDropped100, want)
		}
		counted += want
	}
	if counted == 0 {
		t.Fatal("no seed has a multi-GPU drop by 100%: the test checks nothing")
	}
}

// The grid summarises each mix over generator seeds × run seeds: its
// means are those of the runs themselves.
func TestGrid(t *testing.T) {
	tr := smallTrace(t, 60)
	g := &Grid{Trace: tr, Mixes: []string{"gpushare50", "cpu200"}, GeneratorSeeds: []int64{1, 2}, Seeds: []int64{1, 2}, Policies: []string{"fgd", "tessera"}, Parallel: 2}
	rows, err := g.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[1].Mix != "cpu200" || len(rows[1].Results) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	var sum float64
	for _, vs := range g.GeneratorSeeds {
		pods, err := Variant(tr, "cpu200", vs)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range g.Seeds {
			cv, err := Run(&Trace{Nodes: tr.Nodes, Pods: pods}, "tessera", s)
			if err != nil {
				t.Fatal(err)
			}
			sum += cv.Unallocated(100)
		}
	}
	if got, want := rows[1].Results[1].Unallocated[checkpointIndex(100)].Mean, sum/4; math.Abs(got-want) > 1e-9 {
		t.Errorf("cpu200, tessera: mean %v at 100%%, want %v (the four runs)", got, want)
	}
	var table, csv, js bytes.Buffer
	if err := WriteGridTable(&table, rows, 4); err != nil || !strings.Contains(table.String(), "tessera leaves less unallocated than fgd at arrived = 100% on") {
		t.Errorf("table: %v\n%s", err, table.String())
	}
	if err := WriteGridCSV(&csv, rows); err != nil || strings.Count(csv.String(), "\n") != 1+2*2*len(Checkpoints) {
		t.Errorf("CSV: %v\n%s", err, csv.String())
	}
	if err := WriteGridJSON(&js, rows, g.GeneratorSeeds, g.Seeds); err != nil || !json.Valid(js.Bytes()) {
		t.Errorf("JSON: %v", err)
	}
}

func TestSameSeedSameTable(t *testing.T) {
	tr := smallTrace(t, 60)
	exp := &Experiment{Trace: tr, Policies: []string{"random", "fgd", "tessera"}, Seeds: []int64{1, 2, 3}, Parallel: 3}
	tables := make([]string, 2)
	for i := range tables {
		rs, fl := runWithFloors(t, exp)
		var b bytes.Buffer
		if err := WriteTable(&b, rs, fl, 3); err != nil {
			t.Fatal(err)
		}
		tables[i] = b.String()
	}
	if tables[0] != tables[1] {
		t.Errorf("same seeds, different tables:\n%s\n%s", tables[0], tables[1])
	}
	if !strings.Contains(tables[0], "tessera") || !strings.Contains(tables[0], "±") || !strings.Contains(tables[0], "any policy") {
		t.Errorf("table lacks a policy or the ± column:\n%s", tables[0])
	}
}

func runWithFloors(t *testing.T, exp *Experiment) ([]PolicyResult, *FloorResult) {
	t.Helper()
	rs, err := exp.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	fl, err := exp.Floors()
	if err != nil {
		t.Fatal(err)
	}
	return rs, fl
}

func TestOutputs(t *testing.T) {
	tr := smallTrace(t, 30)
	rs, fl := runWithFloors(t, &Experiment{Trace: tr, Policies: []string{"bestfit", "fgd"}, Seeds: []int64{1, 2}, Parallel: 2})
	var js bytes.Buffer
	if err := WriteJSON(&js, rs, fl, []int64{1, 2}); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Results []PolicyResult `json:"results"`
		Floor   FloorResult    `json:"floor"`
	}
	if err := json.Unmarshal(js.Bytes(), &decoded); err != nil || len(decoded.Results) != 2 || len(decoded.Results[0].Curve) != 131 || len(decoded.Floor.Seeds) != 2 {
		t.Errorf("JSON round trip: %v, %d results, %d floors", err, len(decoded.Results), len(decoded.Floor.Seeds))
	}
	var csv, svg bytes.Buffer
	if err := WriteCSV(&csv, rs); err != nil || strings.Count(csv.String(), "\n") != 1+2*len(Checkpoints) {
		t.Errorf("CSV: %v\n%s", err, csv.String())
	}
	if err := WriteSVG(&svg, rs, fl, "t"); err != nil || !strings.HasPrefix(svg.String(), "<svg") || strings.Count(svg.String(), "<polyline") != 2 || !strings.Contains(svg.String(), "floor, any policy") {
		t.Errorf("SVG: %v", err)
	}
}

func TestVariantsAreSeededAndShaped(t *testing.T) {
	tr := smallTrace(t, 300)
	for _, name := range []string{"gpushare80", "multigpu50", "gpuspec50", "cpu200"} {
		a, err := Variant(tr, name, 3)
		if err != nil {
			if name == "multigpu50" && strings.Contains(err.Error(), "no tasks of a class") {
				continue // the small trace has no multi-GPU task to draw from
			}
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := Variant(tr, name, 3)
		if !slices.Equal(a, b) {
			t.Errorf("%s: same seed, different pods", name)
		}
	}
	pods, _ := Variant(tr, "gpushare80", 1)
	share, gpu := 0, 0
	for _, p := range pods {
		if p.NumGPU > 0 {
			gpu++
			if p.GPUMilli < 1000 {
				share++
			}
		}
	}
	if f := float64(share) / float64(gpu); f < 0.7 || f > 0.9 {
		t.Errorf("gpushare80: %.2f of GPU tasks share, want about 0.8", f)
	}
	for _, bad := range []string{"gpushare", "gpushare101", "bogus10"} {
		if _, err := Variant(tr, bad, 1); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// RunOnline: FGD learns the workload from the pods it places instead of
// being given the trace's shapes, which changes its placements; a policy
// without a target (bestfit) places exactly as in Run. Curve.Node names
// the node of every placed arrival and nothing for a dropped one.
func TestRunOnline(t *testing.T) {
	tr, err := LoadTrace("", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, tc := range []struct {
		policy string
		same   bool
	}{{"fgd", false}, {"bestfit", true}} {
		given, err := Run(tr, tc.policy, 1)
		if err != nil {
			t.Fatal(err)
		}
		online, err := RunOnline(ctx, tr, tc.policy, 1)
		if err != nil {
			t.Fatal(err)
		}
		if same := slices.Equal(given.Node, online.Node); same != tc.same {
			t.Errorf("%s: placements the same online as with the trace's shapes given: %v, want %v", tc.policy, same, tc.same)
		}
		for _, cv := range []*Curve{given, online} {
			placed := 0
			for k, n := range cv.Node {
				var before int64
				if k > 0 {
					before = cv.Allocated[k-1]
				}
				if n != "" {
					placed++
				} else if cv.Allocated[k] != before {
					t.Fatalf("%s: arrival %d allocated GPU but has no node", tc.policy, k)
				}
			}
			if placed != len(cv.Node)-cv.Dropped {
				t.Errorf("%s: %d arrivals with a node, want %d placed (%d arrivals, %d dropped)", tc.policy, placed, len(cv.Node)-cv.Dropped, len(cv.Node), cv.Dropped)
			}
		}
	}
}
