package placement

import (
	"fmt"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// inventory builds a node inventory of count GPUs of one model; nvlinkPairs
// lists GPU index pairs joined by NVLink (others are linked through PCIe).
func inventory(count int, model string, memMiB int64, maxShares int, nvlinkPairs ...[2]int) *api.NodeInventory {
	inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: 1}
	for i := 0; i < count; i++ {
		inv.GPUs = append(inv.GPUs, api.GPU{
			UUID: fmt.Sprintf("GPU-%s-%02d", model, i), Index: i, Model: model, MemoryMiB: memMiB,
			NUMANode: i * 2 / max(count, 1), Health: api.Healthy, Sharing: api.SharingShared, MaxShares: maxShares,
		})
	}
	nv := map[[2]int]bool{}
	for _, p := range nvlinkPairs {
		nv[p], nv[[2]int{p[1], p[0]}] = true, true
	}
	for i := range inv.GPUs {
		for j := range inv.GPUs {
			if i == j {
				continue
			}
			l := api.Link{PeerUUID: inv.GPUs[j].UUID, Type: api.LinkPCIeHostBridge}
			if nv[[2]int{i, j}] {
				l = api.Link{PeerUUID: inv.GPUs[j].UUID, Type: api.LinkNVLink, NVLinks: 12}
			}
			inv.GPUs[i].Links = append(inv.GPUs[i].Links, l)
		}
	}
	return inv
}

func mustNode(t testing.TB, name string, inv *api.NodeInventory) *Node {
	t.Helper()
	n, err := NewNode(name, 64000, 256*1024, inv)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mustCompile(t testing.TB, c *Cluster, r *Request) *Compiled {
	t.Helper()
	cr, err := c.Compile(r)
	if err != nil {
		t.Fatal(err)
	}
	return cr
}

// share is a one-GPU container asking mem MiB and cores percent.
func share(name string, mem int64, cores int) Container {
	return Container{Name: name, GPUs: 1, MemoryMiB: mem, Cores: cores}
}

// whole is a container asking count whole GPUs.
func whole(name string, count int) Container { return Container{Name: name, GPUs: count} }

func pod(name string, cs ...Container) *Request { return &Request{Pod: name, Containers: cs} }

// place finds the best node for r under binpack and assigns it, failing the test if none fits.
func place(t testing.TB, c *Cluster, r *Request) *api.PodAllocation {
	t.Helper()
	cr := mustCompile(t, c, r)
	sr := NewSearch(c)
	p := sr.Best(cr, Binpack{})
	if p == nil {
		t.Fatalf("pod %s fits nowhere: %s", r.Pod, sr.Explain())
	}
	rec, err := c.Assign(cr, p)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// checkInvariants verifies no GPU of the cluster is over any limit.
func checkInvariants(t testing.TB, c *Cluster) {
	t.Helper()
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
}

// fitOn compiles r in c and checks it against node n alone.
func fitOn(t testing.TB, c *Cluster, n *Node, r *Request) Reason {
	t.Helper()
	var s Scratch
	var p Placement
	return mustCompile(t, c, r).Fit(n, nil, &s, &p)
}
