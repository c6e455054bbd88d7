// Package sim replays GPU-sharing cluster traces (the openb CSV format of
// Alibaba's cluster-trace-gpu-v2023) through the placement core and
// measures how much GPU capacity each placement policy leaves unallocated.
package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/examples/traces/openb"
)

// NodeRow is one line of a node list.
type NodeRow struct {
	Name     string
	CPUMilli int64
	MemMiB   int64
	GPUs     int
	Model    string
}

// PodRow is one line of a pod list. Only the columns the simulator uses
// are kept; times are ignored (no departures).
type PodRow struct {
	Name     string
	CPUMilli int64
	MemMiB   int64
	NumGPU   int
	GPUMilli int64 // per GPU, 0..1000
	Spec     string
}

// GPURequestMilli is the pod's total GPU request in thousandths of a GPU.
func (p PodRow) GPURequestMilli() int64 { return int64(p.NumGPU) * p.GPUMilli }

// maxGPUsPerNode bounds the gpu column; the core allows 64.
const maxGPUsPerNode = 64

// LoadTrace reads a node list and a pod list (openb CSV); an empty path
// stands for that list of the openb default trace bundled in the binary.
func LoadTrace(nodesPath, podsPath string) (*Trace, error) {
	nodes, err := loadRows(nodesPath, openb.NodeList, ParseNodes)
	if err != nil {
		return nil, err
	}
	pods, err := loadRows(podsPath, openb.PodList, ParsePods)
	if err != nil {
		return nil, err
	}
	t := &Trace{Nodes: nodes, Pods: pods}
	if err := t.checkModels(); err != nil {
		return nil, err
	}
	return t, nil
}

// checkModels refuses a pod list that constrains GPU models when the node
// list names none (a node list without the model column): every such task
// would be dropped for a reason that is not in the trace.
func (t *Trace) checkModels() error {
	for _, n := range t.Nodes {
		if n.Model != "" {
			return nil
		}
	}
	for _, p := range t.Pods {
		if p.Spec != "" {
			return fmt.Errorf("pod %s has gpu_spec %q but no node has a model (the node list has no model column)", p.Name, p.Spec)
		}
	}
	return nil
}

func loadRows[T any](path, bundled string, parse func(io.Reader, string) ([]T, error)) ([]T, error) {
	var f io.ReadCloser
	var err error
	name := path
	if path == "" {
		name = "(bundled) " + bundled
		f, err = openb.Files.Open(bundled)
	} else {
		f, err = os.Open(path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f, name)
}

// table reads a CSV with a header and resolves the wanted columns; errors
// name the file and line.
type table struct {
	r    *csv.Reader
	name string
	col  map[string]int
	line int
	rec  []string
}

// newTable reads the header. Every required column must be there;
// optional columns may be absent (then has reports false and the caller
// reads no constraint from them).
func newTable(r io.Reader, name string, required []string) (*table, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	hdr, err := cr.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%s: empty file, want a header with columns %s", name, strings.Join(required, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	t := &table{r: cr, name: name, col: map[string]int{}, line: 1}
	for i, h := range hdr {
		t.col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, c := range required {
		if _, ok := t.col[c]; !ok {
			return nil, fmt.Errorf("%s:1: missing column %q (want %s)", name, c, strings.Join(required, ","))
		}
	}
	return t, nil
}

// has reports whether the file has column c.
func (t *table) has(c string) bool { _, ok := t.col[c]; return ok }

// next advances to the next record; it returns false at the end.
func (t *table) next() (bool, error) {
	rec, err := t.r.Read()
	if err == io.EOF {
		return false, nil
	}
	line, _ := t.r.FieldPos(0)
	t.line = line
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return false, fmt.Errorf("%s:%d: %v", t.name, pe.Line, pe.Err)
		}
		return false, fmt.Errorf("%s:%d: %w", t.name, t.line, err)
	}
	t.rec = rec
	return true, nil
}

func (t *table) str(c string) (string, error) {
	i := t.col[c]
	if i >= len(t.rec) {
		return "", t.errf("row has %d fields, column %q is field %d", len(t.rec), c, i+1)
	}
	return strings.TrimSpace(t.rec[i]), nil
}

// int reads a non-negative integer no larger than limit.
func (t *table) int(c string, limit int64) (int64, error) {
	s, err := t.str(c)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, t.errf("%s %q is not an integer", c, s)
	}
	if v < 0 {
		return 0, t.errf("%s %d is negative", c, v)
	}
	if v > limit {
		return 0, t.errf("%s %d exceeds the limit %d", c, v, limit)
	}
	return v, nil
}

func (t *table) errf(format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", t.name, t.line, fmt.Sprintf(format, args...))
}

// Sanity limits: large enough for any real node, small enough that sums
// cannot overflow.
const (
	maxCPUMilli = 1 << 40
	maxMemMiB   = 1 << 40
)

// uniqueName reads column col, which must be non-empty and unique in the
// file; seen maps names to the line that defined them.
func (t *table) uniqueName(col, kind string, seen map[string]int) (string, error) {
	v, err := t.str(col)
	if err != nil {
		return "", err
	}
	if v == "" {
		return "", t.errf("%s is empty", col)
	}
	if prev, dup := seen[v]; dup {
		return "", t.errf("%s %s already defined on line %d", kind, v, prev)
	}
	seen[v] = t.line
	return v, nil
}

// rows parses every data row of t with parse, in file order, stopping at
// the first error.
func rows[T any](t *table, parse func() (T, error)) ([]T, error) {
	var out []T
	for {
		ok, err := t.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		v, err := parse()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
}

// ParseNodes parses a node list; name is used in error messages. The
// columns sn, cpu_milli, memory_mib and gpu are required; model is
// optional (without it no node has a model, and tasks may not name one).
func ParseNodes(r io.Reader, name string) ([]NodeRow, error) {
	t, err := newTable(r, name, []string{"sn", "cpu_milli", "memory_mib", "gpu"})
	if err != nil {
		return nil, err
	}
	seen := map[string]int{}
	out, err := rows(t, func() (NodeRow, error) {
		var n NodeRow
		var err error
		if n.Name, err = t.uniqueName("sn", "node", seen); err != nil {
			return n, err
		}
		if n.CPUMilli, err = t.int("cpu_milli", maxCPUMilli); err != nil {
			return n, err
		}
		if n.MemMiB, err = t.int("memory_mib", maxMemMiB); err != nil {
			return n, err
		}
		g, err := t.int("gpu", maxGPUsPerNode)
		if err != nil {
			return n, err
		}
		n.GPUs = int(g)
		if !t.has("model") {
			return n, nil
		}
		if n.Model, err = t.str("model"); err != nil {
			return n, err
		}
		if n.GPUs > 0 && n.Model == "" {
			return n, t.errf("node %s has %d GPUs but no model", n.Name, n.GPUs)
		}
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no nodes", name)
	}
	return out, nil
}

// ParsePods parses a pod list; name is used in error messages. The
// columns name, cpu_milli, memory_mib, num_gpu and gpu_milli are required
// (some published openb variants have only these); gpu_spec is optional
// (absent: no task is limited to a model); qos and the times are not read.
func ParsePods(r io.Reader, name string) ([]PodRow, error) {
	t, err := newTable(r, name, []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"})
	if err != nil {
		return nil, err
	}
	seen := map[string]int{}
	out, err := rows(t, func() (PodRow, error) {
		var p PodRow
		var err error
		if p.Name, err = t.uniqueName("name", "pod", seen); err != nil {
			return p, err
		}
		if p.CPUMilli, err = t.int("cpu_milli", maxCPUMilli); err != nil {
			return p, err
		}
		if p.MemMiB, err = t.int("memory_mib", maxMemMiB); err != nil {
			return p, err
		}
		g, err := t.int("num_gpu", maxGPUsPerNode)
		if err != nil {
			return p, err
		}
		p.NumGPU = int(g)
		if p.GPUMilli, err = t.int("gpu_milli", 1000); err != nil {
			return p, err
		}
		switch {
		case p.NumGPU == 0 && p.GPUMilli != 0:
			return p, t.errf("gpu_milli %d with num_gpu 0; a CPU-only task has gpu_milli 0", p.GPUMilli)
		case p.NumGPU > 0 && p.GPUMilli == 0:
			return p, t.errf("num_gpu %d with gpu_milli 0; want gpu_milli in 1..1000", p.NumGPU)
		case p.NumGPU > 1 && p.GPUMilli != 1000:
			return p, t.errf("num_gpu %d with gpu_milli %d; multi-GPU tasks take whole GPUs (1000)", p.NumGPU, p.GPUMilli)
		}
		if t.has("gpu_spec") {
			if p.Spec, err = t.str("gpu_spec"); err != nil {
				return p, err
			}
		}
		return p, nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no pods", name)
	}
	return out, nil
}
