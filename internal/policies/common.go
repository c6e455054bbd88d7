// Package policies holds the placement policies the scheduler runs: the
// fragmentation-aware ones, FGD (Weng et al., ATC '23) and Tessera's own,
// as placement.Policy implementations; All lists them with the placement
// core's binpack and spread. The simulator's research baselines, which
// the scheduler does not run, are package internal/sim/baselines; they
// build on what this package exports (Shape, FreeMilli, BestGPU,
// NodeFree, NodeTable).
//
// FGD keeps the original simulator's semantics where they matter for
// results: integer scores, the original GPU choice within a node. Amounts
// are in thousandths of a GPU ("milli") like the original.
package policies

import (
	"math"
	"strings"

	"github.com/tessera-gpu/tessera/internal/placement"
)

// Policy names (Entry.Name in All).
const (
	NameFGD     = "fgd"
	NameTessera = "tessera"
)

// Milli is a whole GPU in thousandths, the unit of Shape.GPUMilli,
// FreeMilli and the policies' scores.
const Milli = 1000

// Shape is what a task asks for, the unit of a target workload.
type Shape struct {
	CPUMilli int64
	MemMiB   int64
	NumGPU   int
	GPUMilli int64 // per GPU; 1000 for whole GPUs, 0 for CPU-only
	Spec     string
}

// ShapeOf derives a compiled request's shape (see RequestShape).
func ShapeOf(cr *placement.Compiled) Shape { return RequestShape(cr.Req) }

// RequestShape derives a request's shape. For requests with several GPU
// containers (never in traces) it takes the largest.
func RequestShape(r *placement.Request) Shape {
	s := Shape{CPUMilli: r.CPUMilli, MemMiB: r.MemoryMiB, Spec: strings.Join(r.IncludeModels, "|")}
	for _, c := range r.Containers {
		if c.GPUs == 0 {
			continue
		}
		m := int64(1000)
		if !c.Exclusive() {
			m = int64(max(c.Cores, c.MemoryPercent)) * 10
		}
		if c.GPUs*int(m) > s.NumGPU*int(s.GPUMilli) {
			s.NumGPU, s.GPUMilli = c.GPUs, m
		}
	}
	return s
}

// Share reports whether the shape takes part of one GPU.
func (s Shape) Share() bool { return s.NumGPU == 1 && s.GPUMilli < Milli }

// TotalMilli is the shape's GPU request in thousandths.
func (s Shape) TotalMilli() int64 { return int64(s.NumGPU) * s.GPUMilli }

// FreeMilli is what is left of a GPU in thousandths: the smaller of its
// free compute and free memory, 0 when held whole or out of share slots.
func FreeMilli(g *placement.GPU) int64 {
	if g.Used.Exclusive > 0 || g.FreeShares() <= 0 || !g.Healthy || g.MemoryCap <= 0 {
		return 0
	}
	c := int64(g.FreeCores()) * 10
	if g.FreeMemory()*Milli >= c*g.MemoryCap {
		return max(0, c) // memory is not the shorter: no division
	}
	m := g.FreeMemory() * Milli / g.MemoryCap
	return max(0, min(c, m))
}

// nodeModel is the node's GPU model ("" without GPUs).
func nodeModel(n *placement.Node) string {
	if len(n.GPUs) > 0 {
		return n.GPUs[0].Model
	}
	return n.Labels["model"]
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// BestGPU is the original "best" GPU selection (a GPU ranker's rank of GPU
// i of n): a share goes to the GPU
// with the least free room that still fits (lowest index on ties); whole
// GPUs go to the lowest-indexed free GPUs.
func BestGPU(n *placement.Node, i int, demand placement.Usage) float64 {
	if demand.Exclusive > 0 {
		return -float64(i)
	}
	return -float64(FreeMilli(&n.GPUs[i]))
}
