package nodeagent

import (
	"slices"
	"strconv"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/parts"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Offer is what the node's device plugins serve: per resource name, the
// devices listed to the kubelet.
type Offer = parts.Offer

// BuildInventory combines what NVML found, the GPUs' health and the node
// configuration into the published inventory and the device plugins'
// device lists, per resource. Excluded GPUs are left out of both.
// GPUs keep NVML's index, so an excluded GPU leaves a gap.
//
// Per sharing mode:
//   - shared, exclusive: the GPU resource, sharesPerGPU slots per GPU;
//   - time-slicing, mps: the same, under <gpu>.shared when renamed;
//   - mig (static): each MIG device is one device, of the GPU resource
//     (single strategy) or of its profile's (mixed); GPUs without MIG mode
//     are whole GPUs of the GPU resource;
//   - mig-dynamic: a GPU in MIG mode offers sharesPerGPU slots (at least
//     as many as it can hold instances) for the GPU resource, and each
//     profile's instance count for the profile's resource (the scheduler
//     decides which instance a slot becomes).
//
// A GPU's health is its MIG devices' health: an XID on the parent makes
// every MIG device and replica of it unhealthy.
//
// A node in mode dra offers no device-plugin resource: its DRA driver
// publishes the inventory's GPUs as ResourceSlice devices. A node in mode
// volcano offers its slots as volcano.sh/vgpu-number.
func BuildInventory(devs []discovery.Device, hs map[string]health.State, cfg api.NodeConfig, names api.ResourceNames) (*api.NodeInventory, Offer) {
	inv := &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: cfg.MemoryOvercommit}
	if cfg.Sharing == api.SharingMIG {
		inv.MIGStrategy = cfg.MIGStrategy
	}
	offer := Offer{}
	gpuRes := names.GPU
	if cfg.RenameShared {
		gpuRes = names.Shared(names.GPU)
	}
	offer[gpuRes] = nil
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
		healthy := g.Health == api.Healthy
		g.Sharing, g.MaxShares = cfg.Sharing, shares
		g.Links = slices.DeleteFunc(slices.Clone(g.Links), func(l api.Link) bool { return !offered[l.PeerUUID] })
		if len(g.Links) == 0 {
			g.Links = nil
		}
		g.MIG.Devices = slices.Clone(g.MIG.Devices)
		for k := range g.MIG.Devices {
			g.MIG.Devices[k].Health, g.MIG.Devices[k].HealthReason = g.Health, g.HealthReason
		}
		add := func(res, uuid string, slots int) {
			dev := deviceplugin.GPU{UUID: uuid, NUMANode: g.NUMANode, Healthy: healthy, Slots: slots}
			if uuid == g.UUID {
				// NVML's figures, which the agent holds records to
				// whatever the inventory annotation says by the time it
				// is read.
				dev.MemoryMiB, dev.MemoryCapMiB = d.GPU.MemoryMiB, gpushare.CapacityOf(d.GPU, overcommit).MemoryCap
			}
			offer[res] = append(offer[res], dev)
		}
		switch {
		case cfg.Sharing == api.SharingMIG && g.MIG.Enabled:
			g.MaxShares = max(1, len(g.MIG.Devices))
			for _, m := range g.MIG.Devices {
				res := names.GPU
				if cfg.MIGStrategy == api.MIGStrategyMixed {
					res = names.MIG(m.Profile)
				}
				add(res, m.UUID, 1)
			}
			g.MIG.ProfileMemoryMiB = nil
		case cfg.Sharing == api.SharingMIGDynamic && g.MIG.Enabled && d.MIG != nil:
			g.MaxShares = d.MIG.MaxInstances()
			// The kubelet's count is not the limit (the MIG geometry is,
			// which the scheduler checks and explains): offer at least
			// sharesPerGPU, so a GPU full of instances is reported by
			// Tessera naming them, not as "Insufficient nvidia.com/gpu".
			add(names.GPU, g.UUID, max(g.MaxShares, shares))
			for _, p := range d.MIG.Profiles {
				add(names.MIG(p.Name), g.UUID, p.MaxInstances)
			}
		case cfg.Sharing == api.SharingMIG || cfg.Sharing == api.SharingMIGDynamic:
			// Not (yet) in MIG mode, or a model without MIG geometry: a
			// whole GPU.
			g.Sharing, g.MaxShares = api.SharingExclusive, 1
			g.MIG.Devices, g.MIG.ProfileMemoryMiB = nil, nil
			add(names.GPU, g.UUID, 1)
		default:
			g.MIG.Devices, g.MIG.ProfileMemoryMiB = nil, nil
			add(gpuRes, g.UUID, shares)
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	if cfg.Mode == api.ModeVolcano {
		// Volcano's scheduler places the GPUs (docs/volcano.md): one
		// device plugin, volcano.sh/vgpu-number, sharesPerGPU slots per
		// GPU; the inventory is not published (the agent's core).
		offer = Offer{api.VolcanoVGPUNumber: offer[gpuRes]}
	}
	if cfg.Mode == api.ModeDRA {
		// The DRA driver serves the GPUs; no device plugin may.
		inv.Mode, offer = api.ModeDRA, Offer{}
	}
	return inv, offer
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
