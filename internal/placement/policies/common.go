// Package policies holds the fragmentation-aware placement policies and the
// baselines they are compared with (Random-fit, Dot-product, GPU
// Clustering, GPU Packing, Best-fit and FGD as in the simulator of Weng et
// al., ATC '23), all as placement.Policy implementations; All lists them with the
// placement core's binpack and spread.
//
// The baselines keep the original simulator's semantics where they matter
// for results: integer scores, ties broken uniformly at random (as
// kube-scheduler's selectHost does) and the original GPU choice within a
// node. Scores are in thousandths of a GPU ("milli") like the original.
package policies

import (
	"math"
	"strings"

	"github.com/tessera-gpu/tessera/internal/placement"
)

// Policy names (Entry.Name in All).
const (
	NameRandom        = "random"
	NameDotProduct    = "dotproduct"
	NameGPUClustering = "gpuclustering"
	NameGPUPacking    = "gpupacking"
	NameBestFit       = "bestfit"
	NameFGD           = "fgd"
	NameTessera       = "tessera"
)

// Scales of the original simulator (open-gpu-share MaxSpec*): they
// normalise CPU and GPU amounts in the Best-fit and Dot-product scores.
const (
	milli      = 1000
	maxSpecCPU = 128000
	maxSpecGPU = 8000
)

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
func (s Shape) Share() bool { return s.NumGPU == 1 && s.GPUMilli < milli }

// TotalMilli is the shape's GPU request in thousandths.
func (s Shape) TotalMilli() int64 { return int64(s.NumGPU) * s.GPUMilli }

// FreeMilli is what is left of a GPU in thousandths: the smaller of its
// free compute and free memory, 0 when held whole or out of share slots.
func FreeMilli(g *placement.GPU) int64 {
	if g.Used.Exclusive > 0 || g.FreeShares() <= 0 || !g.Healthy || g.MemoryCap <= 0 {
		return 0
	}
	c := int64(g.FreeCores()) * 10
	if g.FreeMemory()*milli >= c*g.MemoryCap {
		return max(0, c) // memory is not the shorter: no division
	}
	m := g.FreeMemory() * milli / g.MemoryCap
	return max(0, min(c, m))
}

// nodeModel is the node's GPU model ("" without GPUs).
func nodeModel(n *placement.Node) string {
	if len(n.GPUs) > 0 {
		return n.GPUs[0].Model
	}
	return n.Labels["model"]
}

// gpuFreeTotal is the node's idle GPU in thousandths.
func gpuFreeTotal(n *placement.Node) int64 {
	var t int64
	for i := range n.GPUs {
		t += FreeMilli(&n.GPUs[i])
	}
	return t
}

// tieBreak is a pseudo-random number in [0, 0.5) that is a pure function of
// the policy seed, the pod's arrival number and the node (and GPU): random
// choices without shared mutable state, so concurrent scoring is safe.
func tieBreak(seed int64, seq uint64, name string, gpu int) float64 {
	h := uint64(seed)*0x9e3779b97f4a7c15 ^ seq*0xbf58476d1ce4e5b9 ^ uint64(gpu+1)*0x94d049bb133111eb
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 0x100000001b3
	}
	h ^= h >> 31
	h *= 0x9e3779b97f4a7c15
	h ^= h >> 29
	return float64(h>>11) / float64(1<<53) * 0.5
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
