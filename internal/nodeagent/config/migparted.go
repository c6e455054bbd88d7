package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// Layout is one named MIG layout of NVIDIA's mig-parted format: what each
// GPU of the node should be partitioned into.
type Layout struct {
	Name    string
	Entries []LayoutEntry
}

// LayoutEntry is one entry of a mig-parted layout: the GPUs it applies
// to and what they get.
type LayoutEntry struct {
	// Devices are the NVML indices the entry applies to; nil means all.
	Devices []int
	// DeviceFilter are PCI device IDs ("0x20B010DE": device 0x20B0,
	// vendor 0x10DE); empty means any GPU.
	DeviceFilter []uint32
	// MIGEnabled is the MIG mode the GPUs get.
	MIGEnabled bool
	// Counts is the layout: GPU-instance profile → instances.
	Counts map[string]int
}

// Matches reports whether the entry applies to the GPU at NVML index idx
// with PCI device ID pciID.
func (e LayoutEntry) Matches(idx int, pciID uint32) bool {
	if e.Devices != nil && !containsInt(e.Devices, idx) {
		return false
	}
	if len(e.DeviceFilter) == 0 {
		return true
	}
	for _, f := range e.DeviceFilter {
		if f == pciID {
			return true
		}
	}
	return false
}

// For returns the entry that applies to a GPU (the first that matches, as
// mig-parted applies them), or false when none does.
func (l *Layout) For(idx int, pciID uint32) (LayoutEntry, bool) {
	for _, e := range l.Entries {
		if e.Matches(idx, pciID) {
			return e, true
		}
	}
	return LayoutEntry{}, false
}

// EnablesMIG reports whether any entry turns MIG mode on.
func (l *Layout) EnablesMIG() bool {
	for _, e := range l.Entries {
		if e.MIGEnabled {
			return true
		}
	}
	return false
}

// migParted is the mig-parted file as written (version v1).
type migParted struct {
	Version    string                     `json:"version"`
	MigConfigs map[string][]migPartedSpec `json:"mig-configs"`
}

type migPartedSpec struct {
	DeviceFilter any            `json:"device-filter,omitempty"`
	Devices      any            `json:"devices"`
	MigEnabled   bool           `json:"mig-enabled"`
	MigDevices   map[string]int `json:"mig-devices,omitempty"`
}

// isMIGParted reports whether a decoded document is a mig-parted file.
func isMIGParted(probe map[string]any) bool {
	_, ok := probe["mig-configs"]
	return ok
}

// ParseMIGParted reads NVIDIA's mig-parted format as written and returns
// its layouts by name. Profiles are checked for their form here; whether a
// layout fits a GPU is checked per GPU when it is applied (internal/mig
// knows each model's geometry).
func ParseMIGParted(data []byte) (map[string]Layout, error) {
	var m migParted
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return nil, fmt.Errorf("mig-parted config: %w", err)
	}
	if m.Version != "v1" {
		return nil, fmt.Errorf("mig-parted config: version %q is not supported (want \"v1\")", m.Version)
	}
	if len(m.MigConfigs) == 0 {
		return nil, fmt.Errorf("mig-parted config: mig-configs is empty")
	}
	out := make(map[string]Layout, len(m.MigConfigs))
	for name, specs := range m.MigConfigs {
		l := Layout{Name: name}
		if len(specs) == 0 {
			return nil, fmt.Errorf("mig-configs.%s: no entries", name)
		}
		for i, s := range specs {
			ref := fmt.Sprintf("mig-configs.%s[%d]", name, i)
			e := LayoutEntry{MIGEnabled: s.MigEnabled, Counts: map[string]int{}}
			switch d := s.Devices.(type) {
			case string:
				if d != "all" {
					return nil, fmt.Errorf("%s.devices %q: want \"all\" or a list of GPU indices", ref, d)
				}
			case []any:
				e.Devices = []int{}
				for _, x := range d {
					n, ok := x.(float64)
					if !ok || n != float64(int(n)) || n < 0 || n >= api.MaxGPUsPerNode {
						return nil, fmt.Errorf("%s.devices: %v is not a GPU index in [0, %d]", ref, x, api.MaxGPUsPerNode-1)
					}
					e.Devices = append(e.Devices, int(n))
				}
			case nil:
				return nil, fmt.Errorf("%s.devices is missing (\"all\" or a list of GPU indices)", ref)
			default:
				return nil, fmt.Errorf("%s.devices %v: want \"all\" or a list of GPU indices", ref, d)
			}
			filters := []string{}
			switch f := s.DeviceFilter.(type) {
			case nil:
			case string:
				filters = append(filters, f)
			case []any:
				for _, x := range f {
					filters = append(filters, fmt.Sprint(x))
				}
			default:
				return nil, fmt.Errorf("%s.device-filter %v: want a PCI device ID (\"0x20B010DE\") or a list of them", ref, f)
			}
			for _, f := range filters {
				v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(f), "0x"), 16, 32)
				if err != nil || !strings.HasPrefix(strings.ToLower(f), "0x") {
					return nil, fmt.Errorf("%s.device-filter %q: want a PCI device ID as NVIDIA writes it, e.g. \"0x20B010DE\"", ref, f)
				}
				e.DeviceFilter = append(e.DeviceFilter, uint32(v))
			}
			if !s.MigEnabled && len(s.MigDevices) > 0 {
				return nil, fmt.Errorf("%s: mig-devices set with mig-enabled false", ref)
			}
			for p, c := range s.MigDevices {
				if _, _, _, err := api.ParseMIGProfile(p); err != nil {
					return nil, fmt.Errorf("%s.mig-devices: %w", ref, err)
				}
				if c < 0 || c > api.MaxMIGDevicesPerGPU {
					return nil, fmt.Errorf("%s.mig-devices[%s]: %d outside [0, %d]", ref, p, c, api.MaxMIGDevicesPerGPU)
				}
				if c > 0 {
					e.Counts[p] = c
				}
			}
			l.Entries = append(l.Entries, e)
		}
		out[name] = l
	}
	return out, nil
}

// layoutNames lists layout names, sorted, for messages.
func layoutNames(ls map[string]Layout) string {
	n := make([]string, 0, len(ls))
	for k := range ls {
		n = append(n, strconv.Quote(k))
	}
	sort.Strings(n)
	if len(n) == 0 {
		return "none"
	}
	return strings.Join(n, ", ")
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
