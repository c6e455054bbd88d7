package sim

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
)

// Variant kinds, after the openb repository's other traces. N is a percent.
//
//	gpushareN  N% of GPU tasks share a GPU; whole-GPU and multi-GPU tasks
//	           keep their mutual proportion.
//	multigpuN  N% of GPU tasks ask for 2, 4 or 8 whole GPUs.
//	gpuspecN   N% of GPU tasks may only run on one or two named models.
//	cpuN       N% as many CPU-only tasks as the base trace (per GPU task).
//
// Tasks are drawn with replacement from the base trace's tasks of each
// class until the GPU requested matches the base trace's, so the cluster
// sees the same load with a different mix.
var variantKinds = []string{"gpushare", "multigpu", "gpuspec", "cpu"}

// VariantNames are the variants reported in docs/simulation.md.
var VariantNames = []string{"gpushare40", "gpushare80", "multigpu20", "multigpu50", "gpuspec20", "gpuspec33", "cpu200", "cpu250"}

// task classes
const (
	clsCPU = iota
	clsShare
	clsOne
	clsMulti
)

func classOf(p PodRow) int {
	switch {
	case p.NumGPU == 0:
		return clsCPU
	case p.NumGPU == 1 && p.GPUMilli < 1000:
		return clsShare
	case p.NumGPU == 1:
		return clsOne
	}
	return clsMulti
}

// ParseVariant splits a variant name into its kind and percentage.
func ParseVariant(name string) (string, int, error) {
	for _, k := range variantKinds {
		if rest, ok := strings.CutPrefix(name, k); ok {
			n, err := strconv.Atoi(rest)
			if err != nil || n < 0 || n > 1000 || k != "cpu" && n > 100 {
				limit := 100
				if k == "cpu" {
					limit = 1000
				}
				return "", 0, fmt.Errorf("variant %q: want %s followed by a percentage 0..%d", name, k, limit)
			}
			return k, n, nil
		}
	}
	return "", 0, fmt.Errorf("unknown variant %q (want gpushareN, multigpuN, gpuspecN or cpuN, e.g. gpushare40)", name)
}

// Variant generates a workload mix from a base trace; the same name and
// seed always give the same pods.
func Variant(t *Trace, name string, seed int64) ([]PodRow, error) {
	kind, pct, err := ParseVariant(name)
	if err != nil {
		return nil, err
	}
	byClass := make([][]PodRow, 4)
	var baseGPU int64
	for _, p := range t.Pods {
		c := classOf(p)
		byClass[c] = append(byClass[c], p)
		baseGPU += p.GPURequestMilli()
	}
	gpuTasks := len(byClass[clsShare]) + len(byClass[clsOne]) + len(byClass[clsMulti])
	if gpuTasks == 0 {
		return nil, fmt.Errorf("variant %s: the base trace has no GPU tasks", name)
	}
	w := []float64{0, float64(len(byClass[clsShare])), float64(len(byClass[clsOne])), float64(len(byClass[clsMulti]))}
	f := float64(pct) / 100
	switch kind {
	case "gpushare":
		rest := w[clsOne] + w[clsMulti]
		w[clsShare], w[clsOne], w[clsMulti] = f, (1-f)*w[clsOne]/rest, (1-f)*w[clsMulti]/rest
	case "multigpu":
		rest := w[clsShare] + w[clsOne]
		w[clsShare], w[clsOne], w[clsMulti] = (1-f)*w[clsShare]/rest, (1-f)*w[clsOne]/rest, f
	}
	for c := clsShare; c <= clsMulti; c++ {
		if w[c] > 0 && len(byClass[c]) == 0 {
			return nil, fmt.Errorf("variant %s: the base trace has no tasks of a class the variant needs", name)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x7a1a7))
	var out []PodRow
	var total int64
	nGPU := 0
	for total < baseGPU {
		c := pick(rng, w)
		p := byClass[c][rng.IntN(len(byClass[c]))]
		total += p.GPURequestMilli()
		nGPU++
		out = append(out, p)
	}
	cpuScale := 1.0
	if kind == "cpu" {
		cpuScale = f
	}
	nCPU := int(float64(len(byClass[clsCPU])) * float64(nGPU) / float64(gpuTasks) * cpuScale)
	for i := 0; i < nCPU && len(byClass[clsCPU]) > 0; i++ {
		out = append(out, byClass[clsCPU][rng.IntN(len(byClass[clsCPU]))])
	}
	if kind == "gpuspec" {
		constrain(out, t.Nodes, f, rng)
	}
	rng.Shuffle(len(out), func(a, b int) { out[a], out[b] = out[b], out[a] })
	for i := range out {
		out[i].Name = fmt.Sprintf("%s-pod-%05d", name, i)
	}
	return out, nil
}

func pick(rng *rand.Rand, w []float64) int {
	var sum float64
	for _, x := range w {
		sum += x
	}
	r := rng.Float64() * sum
	for i, x := range w {
		if r < x {
			return i
		}
		r -= x
	}
	return len(w) - 1
}

// constrain gives a fraction f of the GPU tasks a gpu_spec of one model
// (or two, one time in three), drawn in proportion to the models' GPU
// counts among nodes large enough for the task.
func constrain(pods []PodRow, nodes []NodeRow, f float64, rng *rand.Rand) {
	for i := range pods {
		p := &pods[i]
		if p.NumGPU == 0 || rng.Float64() >= f {
			continue
		}
		gpus := map[string]float64{}
		for _, n := range nodes {
			if n.GPUs >= p.NumGPU {
				gpus[n.Model] += float64(n.GPUs)
			}
		}
		models := make([]string, 0, len(gpus))
		for m := range gpus {
			models = append(models, m)
		}
		sort.Strings(models)
		if len(models) == 0 {
			continue
		}
		w := make([]float64, len(models))
		for j, m := range models {
			w[j] = gpus[m]
		}
		a := models[pick(rng, w)]
		spec := a
		if len(models) > 1 && rng.IntN(3) == 0 {
			b := models[pick(rng, w)]
			if b != a {
				spec = a + "|" + b
			}
		}
		p.Spec = spec
	}
}
