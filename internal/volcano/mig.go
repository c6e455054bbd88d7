package volcano

// Volcano's MIG mode (docs/volcano.md, "MIG mode"). A node registers its
// GPUs with mode "mig"; Volcano's scheduler then gives each GPU one of the
// MIG geometries its device configuration lists for the GPU's model (the
// ConfigMap volcano-vgpu-device-config, nvidia.knownMigGeometries: per
// model, groups of instance profiles with a memory and a count), fills
// the group's instances smallest-first by the memory a container asks,
// and writes the instance as a position in the group after the GPU's
// UUID: "GPU-…[<group>-<position>]", the position counting the group's
// instances in the order the group lists them. A node finds the instance
// from the same configuration: the group's instances arranged together on
// the GPU (so that all of them fit at once), the position's profile, and
// which of that profile's instances.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// MIGPosition is an instance of a geometry group, as Volcano writes it
// after a GPU's UUID.
type MIGPosition struct {
	Group    string
	Position int
}

// String is Volcano's "[<group>-<position>]".
func (p MIGPosition) String() string { return fmt.Sprintf("[%s-%d]", p.Group, p.Position) }

// parseMIGID splits Volcano's "GPU-…[<group>-<position>]" (Volcano splits
// the brackets' content at its one "-").
func parseMIGID(s string) (uuid string, p *MIGPosition, err error) {
	open := strings.IndexByte(s, '[')
	if open < 0 {
		if strings.ContainsRune(s, ']') {
			return "", nil, fmt.Errorf("%q has a ']' without '['", s)
		}
		return s, nil, nil
	}
	if !strings.HasSuffix(s, "]") || strings.Count(s, "[") != 1 || strings.Count(s, "]") != 1 {
		return "", nil, fmt.Errorf("%q is not a MIG position <uuid>[<group>-<position>]", s)
	}
	inner := s[open+1 : len(s)-1]
	group, pos, ok := strings.Cut(inner, "-")
	n, err := strconv.Atoi(pos)
	if !ok || group == "" || strings.Contains(pos, "-") || err != nil || n < 0 || n > maxMIGPosition {
		return "", nil, fmt.Errorf("%q is not a MIG position <uuid>[<group>-<position>]", s)
	}
	return s[:open], &MIGPosition{Group: group, Position: n}, nil
}

// maxMIGPosition bounds a position: no GPU holds more instances.
const maxMIGPosition = 64

// MIGTemplate is one profile of a geometry group: its name ("1g.5gb"),
// the memory Volcano's scheduler counts for it (MiB) and how many
// instances of it the group has.
type MIGTemplate struct {
	Name      string `json:"name"`
	MemoryMiB int64  `json:"memory"`
	Count     int    `json:"count"`
}

// MIGGeometry is a group: a way of dividing a GPU.
type MIGGeometry struct {
	Group     string        `json:"group"`
	Templates []MIGTemplate `json:"geometries"`
}

// MIGModels are the geometries of the GPU models Models names (each a
// substring of the GPU's registered type).
type MIGModels struct {
	Models     []string      `json:"models"`
	Geometries []MIGGeometry `json:"allowedGeometries"`
}

// DeviceConfig is what the node reads of Volcano's device configuration
// (the ConfigMap's api.VolcanoDeviceConfigKey): the MIG geometries. The
// rest of it is Volcano's scheduler's.
type DeviceConfig struct {
	Nvidia struct {
		KnownMIGGeometries []MIGModels `json:"knownMigGeometries"`
	} `json:"nvidia"`
}

// ParseDeviceConfig reads Volcano's device configuration and checks its
// MIG geometries: named groups (no "-", which Volcano's position format
// splits at), GPU-instance profile names, positive counts.
func ParseDeviceConfig(data string) (*DeviceConfig, error) {
	var c DeviceConfig
	if err := yaml.Unmarshal([]byte(data), &c); err != nil {
		return nil, fmt.Errorf("%s: %v", api.VolcanoDeviceConfigKey, err)
	}
	for i, m := range c.Nvidia.KnownMIGGeometries {
		at := fmt.Sprintf("%s: nvidia.knownMigGeometries[%d]", api.VolcanoDeviceConfigKey, i)
		if len(m.Models) == 0 || slices.Contains(m.Models, "") {
			return nil, fmt.Errorf("%s: models must name GPU models", at)
		}
		for j, g := range m.Geometries {
			gat := fmt.Sprintf("%s.allowedGeometries[%d]", at, j)
			if g.Group == "" || strings.ContainsAny(g.Group, "-[],:;") {
				return nil, fmt.Errorf("%s: group %q must be a name without '-', brackets or separators (Volcano writes <uuid>[<group>-<position>])", gat, g.Group)
			}
			if len(g.Templates) == 0 {
				return nil, fmt.Errorf("%s: group %s has no geometries", gat, g.Group)
			}
			for k, t := range g.Templates {
				if _, _, _, err := api.ParseMIGProfile(t.Name); err != nil {
					return nil, fmt.Errorf("%s.geometries[%d]: %v", gat, k, err)
				}
				if t.Count < 1 || t.Count > maxMIGPosition || t.MemoryMiB < 0 {
					return nil, fmt.Errorf("%s.geometries[%d]: %s count %d and memory %d MiB: the count must be in [1, %d], the memory not negative", gat, k, t.Name, t.Count, t.MemoryMiB, maxMIGPosition)
				}
			}
		}
	}
	return &c, nil
}

// Geometries returns the groups Volcano's scheduler gives a GPU of the
// registered type ("NVIDIA-<model>"): those of the first entry one of
// whose models the type contains, as Volcano matches them. false: none,
// and Volcano's scheduler treats the GPU as hami-core (it logs "mig type
// not found" and falls back).
func (c *DeviceConfig) Geometries(deviceType string) ([]MIGGeometry, bool) {
	for _, m := range c.Nvidia.KnownMIGGeometries {
		for _, model := range m.Models {
			if strings.Contains(deviceType, model) {
				return m.Geometries, true
			}
		}
	}
	return nil, false
}

// RegisteredType is the type a GPU of NVML's model is registered with
// (and matched against the configuration's models by).
func RegisteredType(model string) string {
	return api.VolcanoDeviceType + "-" + registerClean.Replace(model)
}

var registerClean = strings.NewReplacer(",", " ", ":", " ", ";", " ")

// ResolveMIG is the instance Volcano's position names on a GPU of model m
// with the groups gs: the position's profile, and which of the group's
// instances of that profile, on the arrangement of the whole group on the
// GPU (mig.Model.Arrange: each profile's instances in the order of their
// starts). It also returns the profile, whose memory is the instance's.
func ResolveMIG(m *mig.Model, gs []MIGGeometry, p MIGPosition) (mig.Instance, *mig.Profile, error) {
	i := slices.IndexFunc(gs, func(g MIGGeometry) bool { return g.Group == p.Group })
	if i < 0 {
		names := make([]string, len(gs))
		for k, g := range gs {
			names[k] = g.Group
		}
		return mig.Instance{}, nil, fmt.Errorf("group %q is not one of the groups Volcano's device configuration gives %s (%s)", p.Group, m.Name, strings.Join(names, ", "))
	}
	g := gs[i]
	counts := map[string]int{}
	name, nth, before := "", -1, 0
	for _, t := range g.Templates {
		if name == "" && p.Position < before+t.Count {
			name, nth = t.Name, counts[t.Name]+p.Position-before
		}
		counts[t.Name] += t.Count
		before += t.Count
	}
	if name == "" {
		return mig.Instance{}, nil, fmt.Errorf("position %d is past group %s's %d instances", p.Position, g.Group, before)
	}
	insts, err := m.Arrange(counts)
	if err != nil {
		return mig.Instance{}, nil, fmt.Errorf("group %s of Volcano's device configuration: %v", g.Group, err)
	}
	var same []mig.Instance
	for _, in := range insts {
		if in.Profile == name {
			same = append(same, in)
		}
	}
	slices.SortFunc(same, func(a, b mig.Instance) int { return a.Start - b.Start })
	prof, _ := m.Profile(name) // Arrange found it
	return same[nth], prof, nil
}
