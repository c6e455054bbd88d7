// Package gpushare is the arithmetic of GPU shares, in one place: what a
// grant of an allocation record charges the GPU it names, how the
// containers of one pod add up on a GPU, and what a GPU can give.
//
//   - A share charges its memory (MiB), its compute (percent of the SMs)
//     and one share slot. A whole-GPU grant (exclusive) charges all of the
//     GPU: every grantable MiB, 100 % of the cores, its slot, and marks it
//     held whole.
//   - The app containers of a pod run together, so their charges on a GPU
//     add up; init containers run one at a time before them, so a GPU is
//     charged the larger of the app containers' sum and the largest init
//     container (the Kubernetes rule for effective requests, per GPU).
//   - A GPU gives its memory × the node's overcommit factor, 100 % of its
//     cores and its share slots; no single share may ask more memory than
//     the GPU physically has.
//
// The package is pure (pkg/api and the standard library: no Kubernetes, no
// NVML), so every part of Tessera that needs these rules links the same
// code: the placement core charges placements and records with it, and the
// node agent may check the records it serves against the physical GPUs
// without linking the core's search and policies. What else both sides
// must agree on about a GPU's shares (MIG geometry: the slices a GPU can
// be cut into) belongs here too.
package gpushare

import (
	"fmt"
	"math"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// FullCores is a whole GPU's compute, in percent of its SMs.
const FullCores = 100

// Usage is what is charged to one GPU: by one grant, one pod, or every pod
// holding it. Charges add and subtract exactly (integers only).
type Usage struct {
	MemoryMiB int64
	Cores     int // percent of SMs
	Shares    int // containers holding a share
	Exclusive int // 1 when a pod holds the GPU whole
}

// Add adds c to u.
func (u *Usage) Add(c Usage) {
	u.MemoryMiB += c.MemoryMiB
	u.Cores += c.Cores
	u.Shares += c.Shares
	u.Exclusive += c.Exclusive
}

// Sub subtracts c from u.
func (u *Usage) Sub(c Usage) {
	u.MemoryMiB -= c.MemoryMiB
	u.Cores -= c.Cores
	u.Shares -= c.Shares
	u.Exclusive -= c.Exclusive
}

// Max is the larger of a and b in every dimension.
func Max(a, b Usage) Usage {
	return Usage{
		MemoryMiB: max(a.MemoryMiB, b.MemoryMiB),
		Cores:     max(a.Cores, b.Cores),
		Shares:    max(a.Shares, b.Shares),
		Exclusive: max(a.Exclusive, b.Exclusive),
	}
}

// Share is the charge of one share: its memory, its cores and one slot.
func Share(memoryMiB int64, cores int) Usage {
	return Usage{MemoryMiB: memoryMiB, Cores: cores, Shares: 1}
}

// Replicated reports whether GPUs shared in this mode are shared by equal
// replicas (time-slicing, MPS), as NVIDIA's plugin shares them: a
// container that asks for a whole GPU gets one replica (ReplicaSlot).
func Replicated(mode api.SharingMode) bool {
	return mode == api.SharingMPS || mode == api.SharingTimeSlicing
}

// ReplicaSlot is one of replicas equal slots of a GPU with memoryMiB of
// memory (NVIDIA's 1/N): what a container asking for a whole replicated
// GPU is granted and charged.
func ReplicaSlot(memoryMiB int64, replicas int) Usage {
	n := max(replicas, 1)
	return Share(memoryMiB/int64(n), FullCores/n)
}

// Whole is the charge of a GPU held whole, given its memory capacity.
func Whole(memoryCap int64) Usage {
	return Usage{MemoryMiB: memoryCap, Cores: FullCores, Shares: 1, Exclusive: 1}
}

// OfGrant is what one grant of a record charges its GPU. memoryCap is the
// GPU's capacity (Capacity.MemoryCap), which a whole-GPU grant charges in
// full; known is false when the GPU is unknown (its node has no
// inventory), and the grant then charges the memory it names.
func OfGrant(d api.DeviceGrant, memoryCap int64, known bool) Usage {
	if d.MIG != nil {
		// A MIG device or instance: its own memory and SMs, the GPU's
		// memory and cores untouched; it takes one of the GPU's slots
		// (its MIG devices, or its instance limit in dynamic mode). Which
		// memory slices it holds is the MIG geometry's (internal/mig).
		return Usage{Shares: 1}
	}
	if !d.Exclusive {
		return Share(d.MemoryMiB, d.Cores)
	}
	if !known {
		memoryCap = d.MemoryMiB
	}
	return Whole(memoryCap)
}

// Pod is what one pod's containers hold on one GPU: App is the sum over
// its app containers (and sidecars), Init the most any one init container
// holds.
type Pod struct {
	App, Init Usage
}

// Take adds one container's charge d: summed with the other app
// containers, or kept if it is the largest init container so far.
func (p *Pod) Take(d Usage, init bool) {
	if init {
		p.Init = Max(p.Init, d)
		return
	}
	p.App = addApp(p.App, d)
}

// addApp is app with one more app container's charge d. A record may
// name a GPU whole for two app containers; it is still held whole once.
func addApp(app, d Usage) Usage {
	app.Add(d)
	app.Exclusive = min(app.Exclusive, 1)
	return app
}

// Charge is what the pod charges the GPU: the app containers together or
// the largest init container, whichever is more.
func (p *Pod) Charge() Usage { return Max(p.App, p.Init) }

// WithApp is what the pod would charge the GPU if one more app container
// took d (Take, then Charge, without changing p).
func (p *Pod) WithApp(d Usage) Usage { return Max(addApp(p.App, d), p.Init) }

// WithInit is what the pod would charge the GPU if one more init
// container took d (Take, then Charge, without changing p).
func (p *Pod) WithInit(d Usage) Usage { return Max(p.App, Max(p.Init, d)) }

// Charge is what a record charges one GPU.
type Charge struct {
	UUID  string
	Usage Usage
}

// Charges derives what a record charges each GPU it names, in the order
// the record first names them. memoryCap returns a GPU's capacity
// (Capacity.MemoryCap) and whether the GPU is known. Applying these
// charges when a pod is placed and subtracting them when it goes away are
// exact inverses, whether the record was just made or read back after a
// restart.
func Charges(rec *api.PodAllocation, memoryCap func(uuid string) (int64, bool)) []Charge {
	per := map[string]*Pod{}
	var order []string
	for _, ca := range rec.Containers {
		for _, d := range ca.Devices {
			p := per[d.UUID]
			if p == nil {
				p = &Pod{}
				per[d.UUID] = p
				order = append(order, d.UUID)
			}
			var cap int64
			known := false
			if d.Exclusive && memoryCap != nil {
				cap, known = memoryCap(d.UUID)
			}
			p.Take(OfGrant(d, cap, known), ca.Init)
		}
	}
	out := make([]Charge, 0, len(order))
	for _, uuid := range order {
		out = append(out, Charge{UUID: uuid, Usage: per[uuid].Charge()})
	}
	return out
}

// Capacity is what one GPU can give.
type Capacity struct {
	// MemoryMiB is the GPU's physical memory: the most one share may ask.
	MemoryMiB int64
	// MemoryCap is MemoryMiB × the node's overcommit factor: the most
	// memory that may be granted on the GPU in total.
	MemoryCap int64
	// MaxShares is the most containers that may hold a share at once.
	MaxShares int
}

// Overcommit returns the memory overcommit factor an inventory states (0,
// not set, is 1), or an error when it is outside [1, api.MaxMemoryOvercommit].
func Overcommit(factor float64) (float64, error) {
	if factor == 0 {
		factor = 1
	}
	if factor < 1 || factor > api.MaxMemoryOvercommit || math.IsNaN(factor) {
		return 0, fmt.Errorf("memory overcommit %v outside [1, %v]", factor, api.MaxMemoryOvercommit)
	}
	return factor, nil
}

// CapacityOf is what GPU g of an inventory can give under the overcommit
// factor (from Overcommit). A GPU in exclusive mode, or one that names no
// share count, takes one share.
func CapacityOf(g api.GPU, overcommit float64) Capacity {
	shares := g.MaxShares
	if g.Sharing == api.SharingExclusive || shares < 1 {
		shares = 1
	}
	return Capacity{
		MemoryMiB: g.MemoryMiB,
		MemoryCap: int64(math.Floor(float64(g.MemoryMiB) * overcommit)),
		MaxShares: shares,
	}
}

// Limit names the limits of a GPU a usage can exceed.
type Limit uint8

const (
	// LimitMemory: more memory granted than MemoryCap.
	LimitMemory Limit = 1 << iota
	// LimitCores: more than 100 % of the cores granted.
	LimitCores
	// LimitShares: more shares than MaxShares.
	LimitShares
	// LimitWhole: held whole more than once.
	LimitWhole
)

// Exceeded returns the limits u exceeds on a GPU of capacity c (0: none).
// The placement core takes a share only where the GPU's usage with it
// exceeds none, and its invariant checker reports any exceeded on what is
// allocated.
func (c Capacity) Exceeded(u Usage) Limit {
	var l Limit
	if u.MemoryMiB > c.MemoryCap {
		l |= LimitMemory
	}
	if u.Cores > FullCores {
		l |= LimitCores
	}
	if u.Shares > c.MaxShares {
		l |= LimitShares
	}
	if u.Exclusive > 1 {
		l |= LimitWhole
	}
	return l
}

// WithinAdding reports whether used with charge added exceeds none of the
// GPU's limits: Exceeded of the sum is 0. It stops at the first limit
// exceeded, for callers that need no more (the fit check of every GPU of
// every node).
func (c Capacity) WithinAdding(used, charge Usage) bool {
	return used.MemoryMiB+charge.MemoryMiB <= c.MemoryCap && used.Cores+charge.Cores <= FullCores &&
		used.Shares+charge.Shares <= c.MaxShares && used.Exclusive+charge.Exclusive <= 1
}

// Holds reports whether one share asking memoryMiB fits in the GPU's
// physical memory, whatever else the GPU holds.
func (c Capacity) Holds(memoryMiB int64) bool { return memoryMiB <= c.MemoryMiB }

// Ask is one container's request for each of its GPUs, as the pod spec
// states it after the defaults (kubeobj.Defaulted): memory in MiB or as a
// percentage of the GPU's memory, and a compute share in percent.
type Ask struct {
	MemoryMiB     int64
	MemoryPercent int
	Cores         int
	// CeilingMiB is the memory ceiling above MemoryMiB (0: none). It is
	// not charged: a GPU is charged the guarantee.
	CeilingMiB int64
}

// Exclusive reports whether the ask takes the GPU whole: all compute, all
// memory by percentage, or no memory asked at all.
func (a Ask) Exclusive() bool {
	return a.Cores == FullCores || a.MemoryPercent == 100 || (a.MemoryMiB == 0 && a.MemoryPercent == 0)
}

// MemoryOn is the memory the ask is granted on a GPU with gpuMemoryMiB of
// physical memory: the MiB asked, else the percentage of the GPU (rounded
// down, so percentage shares never add up past the GPU), else all of it.
func (a Ask) MemoryOn(gpuMemoryMiB int64) int64 {
	switch {
	case a.MemoryMiB > 0:
		return a.MemoryMiB
	case a.MemoryPercent > 0:
		return gpuMemoryMiB * int64(a.MemoryPercent) / 100
	default:
		return gpuMemoryMiB
	}
}

// CoresGranted is the compute share the ask is granted: a whole GPU gets
// all of it.
func (a Ask) CoresGranted() int {
	if a.Exclusive() {
		return FullCores
	}
	return a.Cores
}

// Grant is the record's grant of the ask on a GPU of gpuMemoryMiB: what
// the scheduler writes and what the node agent expects to find.
func (a Ask) Grant(uuid string, gpuMemoryMiB int64) api.DeviceGrant {
	g := api.DeviceGrant{UUID: uuid, MemoryMiB: a.MemoryOn(gpuMemoryMiB), Cores: a.CoresGranted(), Exclusive: a.Exclusive()}
	g.CeilingMiB = a.CeilingOn(g.MemoryMiB, g.Exclusive)
	return g
}

// CeilingOn is the ceiling the ask is granted above a guarantee of
// memoryMiB: its ceiling when above the guarantee on a share, else none.
func (a Ask) CeilingOn(memoryMiB int64, exclusive bool) int64 {
	if exclusive || a.CeilingMiB <= memoryMiB {
		return 0
	}
	return a.CeilingMiB
}
