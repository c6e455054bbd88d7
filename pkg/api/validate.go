package api

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"unicode/utf8"
)

// Limits that validation enforces beyond those declared with the types.
const (
	// MaxGPUMemoryMiB is 16 TiB: far above any GPU, low enough to catch
	// unit mistakes (bytes written as MiB).
	MaxGPUMemoryMiB = 16 * 1024 * 1024
	// MaxUUIDLength bounds GPU UUIDs (NVML's are 40 characters).
	MaxUUIDLength = 128
	// MaxModelLength bounds GPU model names.
	MaxModelLength = 256
	// MaxCores is a whole GPU's compute, in percent.
	MaxCores = 100
)

// Valid reports whether h is a known health state.
func (h Health) Valid() bool { return h == Healthy || h == Unhealthy }

// SharingModes returns the known sharing modes.
func SharingModes() []SharingMode {
	return []SharingMode{SharingShared, SharingExclusive, SharingTimeSlicing, SharingMPS, SharingMIG, SharingMIGDynamic}
}

// NodeModes returns the known node modes.
func NodeModes() []NodeMode { return []NodeMode{ModeDevicePlugin, ModeDRA} }

// Valid reports whether m is a known node mode ("" means device-plugin).
func (m NodeMode) Valid() bool { return m == "" || slices.Contains(NodeModes(), m) }

// MIGStrategies returns NVIDIA's MIG strategies.
func MIGStrategies() []MIGStrategy {
	return []MIGStrategy{MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed}
}

// Valid reports whether s is a known strategy ("" means none).
func (s MIGStrategy) Valid() bool { return s == "" || slices.Contains(MIGStrategies(), s) }

// Valid reports whether m is a known sharing mode.
func (m SharingMode) Valid() bool { return slices.Contains(SharingModes(), m) }

// LinkTypes returns the known link types, strongest first.
func LinkTypes() []LinkType {
	return []LinkType{LinkNVLink, LinkPCIeSingle, LinkPCIeMultiple, LinkPCIeHostBridge, LinkPCIeNUMA, LinkSystem}
}

// Valid reports whether t is a known link type.
func (t LinkType) Valid() bool { return slices.Contains(LinkTypes(), t) }

// ValidateInventory checks every rule the scheduler relies on, so that code
// reading a decoded inventory need not re-check. An inventory without GPUs
// is valid: it describes a node whose GPUs are all excluded. The error
// names the GPU, the field, the value and the limit.
func ValidateInventory(inv *NodeInventory) error {
	if inv == nil {
		return fmt.Errorf("inventory is nil")
	}
	if err := checkOvercommit(inv.MemoryOvercommit); err != nil {
		return err
	}
	if !inv.Mode.Valid() {
		return fmt.Errorf("mode %q is not one of %s", inv.Mode, joinQuoted(NodeModes()))
	}
	if !inv.MIGStrategy.Valid() {
		return fmt.Errorf("migStrategy %q is not one of %s", inv.MIGStrategy, joinQuoted(MIGStrategies()))
	}
	if len(inv.GPUs) > MaxGPUsPerNode {
		return fmt.Errorf("%d GPUs exceed the limit of %d per node", len(inv.GPUs), MaxGPUsPerNode)
	}
	uuids := make(map[string]int, len(inv.GPUs))
	indices := make(map[int]int, len(inv.GPUs))
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if err := checkUUID(g.UUID); err != nil {
			return fmt.Errorf("%s: %w", gpuRef(i, g.UUID), err)
		}
		if j, dup := uuids[g.UUID]; dup {
			return fmt.Errorf("%s: uuid duplicates gpus[%d]", gpuRef(i, g.UUID), j)
		}
		uuids[g.UUID] = i
		if err := validateGPU(g); err != nil {
			return fmt.Errorf("%s: %w", gpuRef(i, g.UUID), err)
		}
		if j, dup := indices[g.Index]; dup {
			return fmt.Errorf("%s: index %d duplicates gpus[%d]", gpuRef(i, g.UUID), g.Index, j)
		}
		indices[g.Index] = i
	}
	// MIG device UUIDs are unique across the node, GPUs included.
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		for k, d := range g.MIG.Devices {
			if j, dup := uuids[d.UUID]; dup {
				return fmt.Errorf("%s: mig.devices[%d] (%s): uuid duplicates gpus[%d] or one of its MIG devices", gpuRef(i, g.UUID), k, d.UUID, j)
			}
			uuids[d.UUID] = i
		}
	}
	// Links are checked once every UUID is known.
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		peers := make(map[string]bool, len(g.Links))
		for k, l := range g.Links {
			ref := fmt.Sprintf("%s: links[%d]", gpuRef(i, g.UUID), k)
			if l.PeerUUID == g.UUID {
				return fmt.Errorf("%s: peerUUID is the GPU itself", ref)
			}
			if _, ok := uuids[l.PeerUUID]; !ok {
				return fmt.Errorf("%s: peerUUID %q is not a GPU of this node", ref, l.PeerUUID)
			}
			if peers[l.PeerUUID] {
				return fmt.Errorf("%s: second link to peer %s", ref, l.PeerUUID)
			}
			peers[l.PeerUUID] = true
			if !l.Type.Valid() {
				return fmt.Errorf("%s: type %q is not one of %s", ref, l.Type, joinQuoted(LinkTypes()))
			}
			if l.Type == LinkNVLink {
				if l.NVLinks < 1 || l.NVLinks > MaxNVLinks {
					return fmt.Errorf("%s: nvlinks %d outside [1, %d]", ref, l.NVLinks, MaxNVLinks)
				}
			} else if l.NVLinks != 0 {
				return fmt.Errorf("%s: nvlinks %d set on a %s link (only nvlink links count links)", ref, l.NVLinks, l.Type)
			}
		}
	}
	return nil
}

func checkOvercommit(v float64) error {
	if math.IsNaN(v) || v < 1 || v > MaxMemoryOvercommit {
		return fmt.Errorf("memoryOvercommit %v outside [1, %v]", v, MaxMemoryOvercommit)
	}
	return nil
}

// validateGPU checks the fields of one GPU that need no other GPU.
func validateGPU(g *GPU) error {
	// NVML's index, unique within the node; not necessarily dense, since
	// excluded or lost GPUs leave gaps.
	if g.Index < 0 || g.Index >= MaxGPUsPerNode {
		return fmt.Errorf("index %d outside [0, %d]", g.Index, MaxGPUsPerNode-1)
	}
	if g.Model == "" {
		return fmt.Errorf("model is empty")
	}
	if len(g.Model) > MaxModelLength {
		return fmt.Errorf("model is %d bytes, more than %d", len(g.Model), MaxModelLength)
	}
	if g.MemoryMiB <= 0 || g.MemoryMiB > MaxGPUMemoryMiB {
		return fmt.Errorf("memoryMiB %d outside [1, %d]", g.MemoryMiB, MaxGPUMemoryMiB)
	}
	if g.SMCount < 0 {
		return fmt.Errorf("smCount %d is negative", g.SMCount)
	}
	if g.ComputeCapability != "" && !isMajorMinor(g.ComputeCapability) {
		return fmt.Errorf("computeCapability %q is not \"major.minor\" (e.g. \"8.0\")", g.ComputeCapability)
	}
	if g.NUMANode < -1 {
		return fmt.Errorf("numaNode %d below -1 (-1 means unknown)", g.NUMANode)
	}
	if !g.Health.Valid() {
		return fmt.Errorf("health %q is not %q or %q", g.Health, Healthy, Unhealthy)
	}
	if g.Health == Healthy && g.HealthReason != "" {
		return fmt.Errorf("healthReason %q set on a Healthy GPU", g.HealthReason)
	}
	if !g.Sharing.Valid() {
		return fmt.Errorf("sharing %q is not one of %s", g.Sharing, joinQuoted(SharingModes()))
	}
	if g.MaxShares < 1 || g.MaxShares > MaxSharesLimit {
		return fmt.Errorf("maxShares %d outside [1, %d]", g.MaxShares, MaxSharesLimit)
	}
	if g.Sharing == SharingExclusive && g.MaxShares != 1 {
		return fmt.Errorf("maxShares %d on an exclusive GPU (must be 1)", g.MaxShares)
	}
	if g.Sharing == SharingMPS && g.MaxShares > MaxMPSClients {
		return fmt.Errorf("maxShares %d on an MPS GPU exceeds the %d clients MPS allows", g.MaxShares, MaxMPSClients)
	}
	if g.MIG.Enabled && !g.MIG.Capable {
		return fmt.Errorf("mig.enabled set but mig.capable is not")
	}
	if (g.Sharing == SharingMIG || g.Sharing == SharingMIGDynamic) && !g.MIG.Enabled {
		return fmt.Errorf("sharing %q on a GPU whose MIG mode is not enabled", g.Sharing)
	}
	if g.DriverMemoryLimits && g.MIG.Enabled {
		return fmt.Errorf("driverMemoryLimits set on a GPU in MIG mode (the driver does not partition a MIG GPU's memory)")
	}
	return validateMIG(g)
}

// validateMIG checks a GPU's MIG devices and profile sizes. Whether the
// devices' placements can coexist is the MIG geometry's business
// (internal/mig), which knows each model's profiles.
func validateMIG(g *GPU) error {
	m := &g.MIG
	if (len(m.Devices) > 0 || len(m.ProfileMemoryMiB) > 0) && !m.Enabled {
		return fmt.Errorf("mig.devices or mig.profileMemoryMiB set but mig.enabled is not")
	}
	if len(m.Devices) > MaxMIGDevicesPerGPU {
		return fmt.Errorf("%d MIG devices exceed the limit of %d per GPU", len(m.Devices), MaxMIGDevicesPerGPU)
	}
	for k, d := range m.Devices {
		ref := fmt.Sprintf("mig.devices[%d]", k)
		if err := checkUUID(d.UUID); err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
		ref = fmt.Sprintf("%s (%s)", ref, d.UUID)
		if _, _, _, err := ParseMIGProfile(d.Profile); err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
		if d.Start < 0 || d.Start >= MaxMIGSlices {
			return fmt.Errorf("%s: start %d outside [0, %d]", ref, d.Start, MaxMIGSlices-1)
		}
		if d.MemoryMiB <= 0 || d.MemoryMiB > g.MemoryMiB {
			return fmt.Errorf("%s: memoryMiB %d outside [1, %d] (the GPU's memory)", ref, d.MemoryMiB, g.MemoryMiB)
		}
		if d.SMCount < 0 || g.SMCount > 0 && d.SMCount > g.SMCount {
			return fmt.Errorf("%s: smCount %d outside [0, %d]", ref, d.SMCount, g.SMCount)
		}
		if !d.Health.Valid() {
			return fmt.Errorf("%s: health %q is not %q or %q", ref, d.Health, Healthy, Unhealthy)
		}
		if d.Health == Healthy && d.HealthReason != "" {
			return fmt.Errorf("%s: healthReason %q set on a Healthy MIG device", ref, d.HealthReason)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.ProfileMemoryMiB)) {
		if _, _, _, err := ParseMIGProfile(name); err != nil {
			return fmt.Errorf("mig.profileMemoryMiB: %w", err)
		}
		if v := m.ProfileMemoryMiB[name]; v <= 0 || v > g.MemoryMiB {
			return fmt.Errorf("mig.profileMemoryMiB[%s]: %d outside [1, %d] (the GPU's memory)", name, v, g.MemoryMiB)
		}
	}
	return nil
}

// gpuRef names a GPU in errors: its position and, when printable, its UUID.
func gpuRef(i int, uuid string) string {
	switch {
	case uuid == "":
		return fmt.Sprintf("gpus[%d]", i)
	case checkUUID(uuid) != nil:
		return fmt.Sprintf("gpus[%d] (%q)", i, uuid)
	}
	return fmt.Sprintf("gpus[%d] (%s)", i, uuid)
}

// checkUUID accepts printable ASCII without spaces or commas: UUIDs end up
// in comma-separated annotations and environment variables.
func checkUUID(u string) error {
	if u == "" {
		return fmt.Errorf("uuid is empty")
	}
	if len(u) > MaxUUIDLength {
		return fmt.Errorf("uuid is %d bytes, more than %d", len(u), MaxUUIDLength)
	}
	for i := 0; i < len(u); i++ {
		if c := u[i]; c <= ' ' || c > '~' || c == ',' {
			r, _ := utf8.DecodeRuneInString(u[i:])
			return fmt.Errorf("uuid %q contains %q (only printable ASCII other than space and ',' is allowed)", u, r)
		}
	}
	return nil
}

// isMajorMinor reports whether s is "major.minor" with 1-3 digits each.
func isMajorMinor(s string) bool {
	dot := -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.' && dot < 0:
			dot = i
		case c < '0' || c > '9':
			return false
		}
	}
	return dot >= 1 && dot <= 3 && len(s)-dot-1 >= 1 && len(s)-dot-1 <= 3
}

// checkCeiling checks a grant's memory ceiling (v3): above the guarantee,
// within the bound of any GPU's memory, and only on a share (a whole GPU
// or a MIG device has nothing to borrow).
func checkCeiling(d DeviceGrant) error {
	switch c := d.CeilingMiB; {
	case c == 0:
		return nil
	case c <= d.MemoryMiB || c > MaxGPUMemoryMiB:
		return fmt.Errorf("ceilingMiB %d outside [%d, %d] (above memoryMiB, the guarantee)", c, d.MemoryMiB+1, MaxGPUMemoryMiB)
	case d.Exclusive:
		return fmt.Errorf("ceilingMiB %d on an exclusive grant (a whole GPU has nothing to borrow)", c)
	case d.MIG != nil:
		return fmt.Errorf("ceilingMiB %d on a MIG grant (a MIG device's memory is its own)", c)
	}
	return nil
}

// ValidateAllocation checks a pod allocation record. A record holds at
// least one container: pods without GPU containers get no record.
func ValidateAllocation(a *PodAllocation) error {
	if a == nil {
		return fmt.Errorf("allocation is nil")
	}
	if a.Node == "" {
		return fmt.Errorf("node is empty")
	}
	if len(a.Containers) == 0 {
		return fmt.Errorf("no containers (a pod without GPU containers has no allocation)")
	}
	if len(a.Containers) > MaxContainersPerPod {
		return fmt.Errorf("%d containers exceed the limit of %d per pod", len(a.Containers), MaxContainersPerPod)
	}
	if a.PodUID != "" {
		if err := checkUUID(a.PodUID); err != nil {
			return fmt.Errorf("podUID: %w", err)
		}
	}
	if a.Signature != "" {
		if a.PodUID == "" {
			return fmt.Errorf("signature set on a record without podUID (a signed record names its pod)")
		}
		if len(a.Signature) > MaxSignatureLength {
			return fmt.Errorf("signature is %d bytes, more than %d", len(a.Signature), MaxSignatureLength)
		}
		for i := 0; i < len(a.Signature); i++ {
			if c := a.Signature[i]; c <= ' ' || c > '~' {
				return fmt.Errorf("signature contains byte 0x%02x at %d (only printable ASCII without spaces is allowed)", c, i)
			}
		}
	}
	type containerKey struct {
		name string
		init bool
	}
	seen := make(map[containerKey]int, len(a.Containers))
	for i := range a.Containers {
		c := &a.Containers[i]
		ref := fmt.Sprintf("containers[%d]", i)
		if c.Name == "" {
			return fmt.Errorf("%s: name is empty", ref)
		}
		ref = fmt.Sprintf("containers[%d] (%s)", i, c.Name)
		if j, dup := seen[containerKey{c.Name, c.Init}]; dup {
			return fmt.Errorf("%s: name duplicates containers[%d]", ref, j)
		}
		seen[containerKey{c.Name, c.Init}] = i
		if len(c.Devices) == 0 {
			return fmt.Errorf("%s: no devices", ref)
		}
		if len(c.Devices) > MaxGPUsPerNode {
			return fmt.Errorf("%s: %d devices exceed the limit of %d", ref, len(c.Devices), MaxGPUsPerNode)
		}
		uuids := make(map[string]int, len(c.Devices))
		for k, d := range c.Devices {
			if err := checkUUID(d.UUID); err != nil {
				return fmt.Errorf("%s: devices[%d]: %w", ref, k, err)
			}
			dref := fmt.Sprintf("%s: devices[%d] (%s)", ref, k, d.UUID)
			if j, dup := uuids[d.UUID]; dup {
				return fmt.Errorf("%s: uuid duplicates devices[%d]", dref, j)
			}
			uuids[d.UUID] = k
			if d.MemoryMiB <= 0 || d.MemoryMiB > MaxGPUMemoryMiB {
				return fmt.Errorf("%s: memoryMiB %d outside [1, %d]", dref, d.MemoryMiB, MaxGPUMemoryMiB)
			}
			if d.Cores < 0 || d.Cores > MaxCores {
				return fmt.Errorf("%s: cores %d outside [0, %d]", dref, d.Cores, MaxCores)
			}
			if d.Exclusive && d.Cores != MaxCores {
				return fmt.Errorf("%s: exclusive grant with cores %d (must be %d)", dref, d.Cores, MaxCores)
			}
			if err := checkCeiling(d); err != nil {
				return fmt.Errorf("%s: %w", dref, err)
			}
			if g := d.MIG; g != nil {
				if d.Exclusive {
					return fmt.Errorf("%s: a MIG grant is not exclusive of the whole GPU (its instance is the container's alone)", dref)
				}
				if _, _, _, err := ParseMIGProfile(g.Profile); err != nil {
					return fmt.Errorf("%s: mig: %w", dref, err)
				}
				if g.Start < 0 || g.Start >= MaxMIGSlices {
					return fmt.Errorf("%s: mig.start %d outside [0, %d]", dref, g.Start, MaxMIGSlices-1)
				}
				if g.Device != "" {
					if err := checkUUID(g.Device); err != nil {
						return fmt.Errorf("%s: mig.device: %w", dref, err)
					}
				}
			}
		}
	}
	return nil
}
