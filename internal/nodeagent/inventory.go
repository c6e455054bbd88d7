package nodeagent

import (
	"slices"
	"strconv"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// BuildInventory combines what NVML found, the GPUs' health and the node
// configuration into the published inventory and the device plugin's GPU
// list. Excluded GPUs are left out of both.
// GPUs keep NVML's index, so an excluded GPU leaves a gap.
func BuildInventory(devs []discovery.Device, hs map[string]health.State, cfg api.NodeConfig) (*api.NodeInventory, []deviceplugin.GPU) {
	inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: cfg.MemoryOvercommit}
	var plugin []deviceplugin.GPU
	offered := map[string]bool{}
	for _, d := range devs {
		if !excluded(d.GPU, cfg.ExcludeGPUs) {
			offered[d.GPU.UUID] = true
		}
	}
	overcommit, err := gpushare.Overcommit(cfg.MemoryOvercommit)
	if err != nil {
		overcommit = 1 // the configuration was validated; never more than asked
	}
	shares := cfg.SharesPerGPU
	if cfg.Sharing == api.SharingExclusive {
		shares = 1
	}
	for _, d := range devs {
		if !offered[d.GPU.UUID] {
			continue
		}
		g := d.GPU
		g.Health, g.HealthReason = api.Healthy, ""
		if s, ok := hs[g.UUID]; ok && !s.Healthy {
			g.Health, g.HealthReason = api.Unhealthy, s.Reason
		}
		g.Sharing, g.MaxShares = cfg.Sharing, shares
		g.Links = slices.DeleteFunc(slices.Clone(g.Links), func(l api.Link) bool { return !offered[l.PeerUUID] })
		if len(g.Links) == 0 {
			g.Links = nil
		}
		inv.GPUs = append(inv.GPUs, g)
		plugin = append(plugin, deviceplugin.GPU{
			UUID: g.UUID, NUMANode: g.NUMANode, Healthy: g.Health == api.Healthy, Slots: shares,
			// NVML's figures, which the agent holds records to whatever
			// the inventory annotation says by the time it is read.
			MemoryMiB: d.GPU.MemoryMiB, MemoryCapMiB: gpushare.CapacityOf(d.GPU, overcommit).MemoryCap,
		})
	}
	return inv, plugin
}

// excluded reports whether the GPU is listed by UUID or by NVML index.
func excluded(g api.GPU, list []string) bool {
	for _, e := range list {
		if e == g.UUID || e == strconv.Itoa(g.Index) {
			return true
		}
	}
	return false
}
