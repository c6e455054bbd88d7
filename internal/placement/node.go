package placement

import (
	"fmt"
	"math"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Unlimited is a CPU or memory capacity that never limits placement; the
// scheduler uses it because kube-scheduler's own NodeResourcesFit checks
// CPU and memory.
const Unlimited int64 = math.MaxInt64 / 4

// GPU is the placement state of one GPU: its fixed properties from the
// inventory and what is allocated on it now.
type GPU struct {
	// The fields every fit check reads come first, together (within two
	// cache lines): a scan of the cluster reads them for every GPU, and
	// reading fewer lines per GPU is much of its cost.

	// Allocated now, summed over the pods that hold this GPU.
	Used      Usage
	MemoryMiB int64 // physical memory
	// MemoryCap is MemoryMiB × the node's overcommit factor: the most
	// memory that may be granted on this GPU in total.
	MemoryCap int64
	MaxShares int
	Sharing   api.SharingMode
	// MIG is the GPU's MIG state when it is in a MIG sharing mode.
	MIG     *MIGState
	Healthy bool
	modelID int32

	UUID     string
	Index    int
	Model    string
	NUMANode int
	// SMs is the GPU's SM count (0: unknown).
	SMs int
}

// Usage is what is allocated on one GPU: gpushare.Usage, whose package
// holds the charge arithmetic, as the core's own type (convert freely).
// Charges of pods add to it and subtract from it exactly.
type Usage gpushare.Usage

func (u *Usage) add(c Usage) { (*gpushare.Usage)(u).Add(gpushare.Usage(c)) }

func (u *Usage) sub(c Usage) { (*gpushare.Usage)(u).Sub(gpushare.Usage(c)) }

// capacity is what the GPU can give.
func (g *GPU) capacity() gpushare.Capacity {
	return gpushare.Capacity{MemoryMiB: g.MemoryMiB, MemoryCap: g.MemoryCap, MaxShares: g.MaxShares}
}

// FreeMemory is the memory still grantable on the GPU.
func (g *GPU) FreeMemory() int64 { return g.MemoryCap - g.Used.MemoryMiB }

// FreeCores is the compute share still grantable on the GPU, in percent.
func (g *GPU) FreeCores() int { return gpushare.FullCores - g.Used.Cores }

// FreeShares is the number of further containers the GPU may take.
func (g *GPU) FreeShares() int { return g.MaxShares - g.Used.Shares }

// Idle reports whether nothing is allocated on the GPU.
func (g *GPU) Idle() bool { return g.Used == Usage{} }

// FreeFraction is the share of the GPU still free, in [0,1]: the smaller of
// the free memory and free compute fractions (0 when no share slot is left
// or the GPU is held exclusively).
func (g *GPU) FreeFraction() float64 {
	if g.Used.Exclusive > 0 || g.FreeShares() <= 0 || g.MemoryCap <= 0 {
		return 0
	}
	mem := float64(g.FreeMemory()) / float64(g.MemoryCap)
	cores := float64(g.FreeCores()) / gpushare.FullCores
	return math.Max(0, math.Min(mem, cores))
}

// Node is the placement state of one node.
type Node struct {
	Name string
	// CPU in millicores and memory in MiB: capacity for pods and what
	// pods placed through the core use.
	CPUCapacity, CPUUsed int64
	MemCapacity, MemUsed int64
	GPUs                 []GPU
	// links[i*len(GPUs)+j] is the link strength between GPUs i and j
	// (api.Link.Strength; 0 = unknown).
	links []int16
	// Version changes whenever the node's state changes, so policies can
	// cache per-node values.
	Version uint64
	// index is the node's position in its cluster (see Index).
	index int
	// hasMIG: some GPU is in a MIG sharing mode.
	hasMIG bool
	// Labels are free-form node facts policies may use (for example the
	// simulator's GPU model for CPU-only nodes). Not used by the core.
	Labels map[string]string
}

// Index is the node's position in its cluster's Nodes(): dense (0 to the
// number of nodes − 1), so a policy can keep per-node values in a slice
// indexed by it and find a node's value with one array read. The cluster
// assigns it (UpsertNode; RemoveNode moves the last node into the removed
// one's place), so a node replaced by UpsertNode or moved keeps no claim
// to its old slot: a value kept per index must also record the *Node (and
// its Version) it was computed for. A node in no cluster has index 0.
func (n *Node) Index() int { return n.index }

// FreeCPU is the CPU (millicores) still free for pods.
func (n *Node) FreeCPU() int64 { return n.CPUCapacity - n.CPUUsed }

// FreeMem is the memory (MiB) still free for pods.
func (n *Node) FreeMem() int64 { return n.MemCapacity - n.MemUsed }

// Link returns the strength of the connection between GPUs at positions i and j.
func (n *Node) Link(i, j int) int {
	if n.links == nil {
		return 0
	}
	return int(n.links[i*len(n.GPUs)+j])
}

// GPUByUUID returns the position of the GPU with the given UUID, or -1.
func (n *Node) GPUByUUID(uuid string) int {
	for i := range n.GPUs {
		if n.GPUs[i].UUID == uuid {
			return i
		}
	}
	return -1
}

// NewNode builds a node's placement state from its GPU inventory. CPU and
// memory are the node's capacity for pods (use Unlimited to disable the
// check). The inventory must be valid (see api.ValidateInventory); NewNode
// checks only what it relies on.
func NewNode(name string, cpuMilli, memMiB int64, inv *api.NodeInventory) (*Node, error) {
	if name == "" {
		return nil, fmt.Errorf("node name is empty")
	}
	if cpuMilli < 0 || memMiB < 0 {
		return nil, fmt.Errorf("node %s: negative capacity (cpu %dm, memory %d MiB)", name, cpuMilli, memMiB)
	}
	n := &Node{Name: name, CPUCapacity: cpuMilli, MemCapacity: memMiB}
	if inv == nil {
		return n, nil
	}
	factor, err := gpushare.Overcommit(inv.MemoryOvercommit)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	if len(inv.GPUs) > api.MaxGPUsPerNode {
		return nil, fmt.Errorf("node %s: %d GPUs, at most %d supported", name, len(inv.GPUs), api.MaxGPUsPerNode)
	}
	n.GPUs = make([]GPU, len(inv.GPUs))
	pos := make(map[string]int, len(inv.GPUs))
	for i, g := range inv.GPUs {
		if _, dup := pos[g.UUID]; dup || g.UUID == "" {
			return nil, fmt.Errorf("node %s: GPU %d has an empty or duplicate UUID %q", name, g.Index, g.UUID)
		}
		if g.MemoryMiB <= 0 {
			return nil, fmt.Errorf("node %s: GPU %s has memory %d MiB, must be positive", name, g.UUID, g.MemoryMiB)
		}
		pos[g.UUID] = i
		c := gpushare.CapacityOf(g, factor)
		n.GPUs[i] = GPU{
			UUID:      g.UUID,
			Index:     g.Index,
			Model:     g.Model,
			NUMANode:  g.NUMANode,
			MemoryMiB: c.MemoryMiB,
			MemoryCap: c.MemoryCap,
			MaxShares: c.MaxShares,
			Healthy:   g.Health == api.Healthy,
			Sharing:   g.Sharing,
			SMs:       g.SMCount,
			MIG:       newMIGState(g, inv.MIGStrategy),
			modelID:   -1,
		}
		n.hasMIG = n.hasMIG || n.GPUs[i].MIG != nil
	}
	for i, g := range inv.GPUs {
		for _, l := range g.Links {
			j, ok := pos[l.PeerUUID]
			if !ok || j == i {
				continue
			}
			if n.links == nil {
				n.links = make([]int16, len(inv.GPUs)*len(inv.GPUs))
			}
			s := int16(l.Strength())
			// Links are symmetric; keep the stronger report if the two ends disagree.
			if s > n.links[i*len(inv.GPUs)+j] {
				n.links[i*len(inv.GPUs)+j] = s
				n.links[j*len(inv.GPUs)+i] = s
			}
		}
	}
	return n, nil
}

// Clone returns a deep copy of the node state.
func (n *Node) Clone() *Node {
	c := *n
	c.GPUs = append([]GPU(nil), n.GPUs...)
	for i := range c.GPUs {
		c.GPUs[i].MIG = c.GPUs[i].MIG.clone()
	}
	c.links = append([]int16(nil), n.links...)
	if n.links == nil {
		c.links = nil
	}
	return &c
}
