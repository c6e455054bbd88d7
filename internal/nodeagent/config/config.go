// Package config turns the node agent's ConfigMap into the node's
// configuration (Node). The ConfigMap holds one profile per data key; the
// node label api.LabelNodeConfig picks one (DefaultProfile when unset). A
// profile is either Tessera's format (the fields of api.NodeConfig) or
// NVIDIA's device-plugin config file (version v1), accepted as written. A
// key may also hold NVIDIA's mig-parted file (mig-configs): its layouts are
// selected by the node label nvidia.com/mig.config, as NVIDIA's mig-manager
// does, or by a profile's migLayout.
package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// DefaultProfile is the profile of nodes without api.LabelNodeConfig.
const DefaultProfile = "default"

// MaxProfileBytes bounds one profile; ConfigMaps are capped at 1 MiB.
const MaxProfileBytes = 64 << 10

// Node is the node's configuration as the agent applies it: the
// api.NodeConfig that becomes the inventory, the MIG layout selected for
// the node, and what the profile said that only tunes NVIDIA's plugin.
type Node struct {
	api.NodeConfig
	// Layout is the MIG layout the node's GPUs are partitioned by (from
	// the label nvidia.com/mig.config or the profile's migLayout); nil:
	// the agent leaves MIG as it finds it.
	Layout *Layout
	// MPSRoot is the host directory of the MPS daemons' pipe and log
	// directories (NVIDIA's flags.mpsRoot); empty: the agent's default.
	MPSRoot string
	// Notes are fields accepted that only tune NVIDIA's own plugin, one
	// line each, for the agent's log.
	Notes []string
}

// Parse reads one profile. names are the resource names the agent serves:
// an NVIDIA profile must share the GPU resource.
func Parse(data []byte, names api.ResourceNames) (Node, error) {
	if len(data) > MaxProfileBytes {
		return Node{}, fmt.Errorf("profile is %d bytes, more than the limit of %d", len(data), MaxProfileBytes)
	}
	var probe map[string]any
	if err := yaml.Unmarshal(data, &probe); err != nil {
		return Node{}, fmt.Errorf("not YAML or JSON: %w", err)
	}
	var c Node
	switch {
	case isMIGParted(probe):
		return Node{}, fmt.Errorf("a mig-parted document (mig-configs) is a MIG layout, not a node profile; select one of its layouts with the node label %s or a profile's migLayout", api.LabelMIGConfig)
	case probe["version"] != nil || probe["flags"] != nil || isMap(probe["sharing"]):
		var err error
		if c, err = parseNVIDIA(data, names); err != nil {
			return Node{}, err
		}
	default:
		if err := yaml.UnmarshalStrict(data, &c.NodeConfig); err != nil {
			return Node{}, fmt.Errorf("tessera profile: %w", err)
		}
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return Node{}, err
	}
	sort.Strings(c.Notes)
	return c, nil
}

func isMap(v any) bool { _, ok := v.(map[string]any); return ok }

// Resolve reads the node's profile (data[profile]) and selects its MIG
// layout among the layouts of the ConfigMap's mig-parted documents: the
// node's label nvidia.com/mig.config wins over the profile's migLayout. A
// layout that turns MIG on needs a profile with sharing "mig" (a node
// with only the label and no profile at all gets one: mixed strategy).
func Resolve(data map[string]string, labels map[string]string, names api.ResourceNames) (string, Node, error) {
	layouts := map[string]Layout{}
	profiles := map[string]string{}
	var layoutKeys []string
	for k, v := range data {
		var probe map[string]any
		if yaml.Unmarshal([]byte(v), &probe) == nil && isMIGParted(probe) {
			ls, err := ParseMIGParted([]byte(v))
			if err != nil {
				return k, Node{}, fmt.Errorf("key %q: %w", k, err)
			}
			for name, l := range ls {
				if _, dup := layouts[name]; dup {
					return k, Node{}, fmt.Errorf("key %q: MIG layout %q is defined in two mig-parted documents", k, name)
				}
				layouts[name] = l
			}
			layoutKeys = append(layoutKeys, k)
			continue
		}
		profiles[k] = v
	}
	label := labels[api.LabelMIGConfig]
	var name string
	var c Node
	if len(profiles) == 0 && label != "" {
		name = "(built-in mig)"
		c.Sharing = api.SharingMIG
		c.Defaults()
	} else {
		var err error
		if name, err = Select(profiles, labels); err != nil {
			return "", Node{}, err
		}
		if c, err = Parse([]byte(profiles[name]), names); err != nil {
			return name, Node{}, fmt.Errorf("profile %q: %w", name, err)
		}
	}
	want, from := c.MIGLayout, "migLayout"
	if label != "" {
		want, from = label, "node label "+api.LabelMIGConfig
	}
	if want == "" {
		return name, c, nil
	}
	l, ok := layouts[want]
	if !ok {
		return name, Node{}, fmt.Errorf("%s=%q names no MIG layout; the mig-parted documents (keys %q) define %s", from, want, layoutKeys, layoutNames(layouts))
	}
	if l.EnablesMIG() && c.Sharing != api.SharingMIG {
		return name, Node{}, fmt.Errorf("profile %q: %s=%q turns MIG on, but the profile shares GPUs as %q (MIG devices need sharing \"mig\" or flags.migStrategy single or mixed)", name, from, want, c.Sharing)
	}
	c.Layout = &l
	c.MIGLayout = want
	return name, c, nil
}

// Select returns the profile name the node uses among the ConfigMap keys.
func Select(data map[string]string, labels map[string]string) (string, error) {
	if name, ok := labels[api.LabelNodeConfig]; ok && name != "" {
		if _, ok := data[name]; !ok {
			return "", fmt.Errorf("node label %s=%q names no profile; the ConfigMap has %s", api.LabelNodeConfig, name, keys(data))
		}
		return name, nil
	}
	if _, ok := data[DefaultProfile]; ok {
		return DefaultProfile, nil
	}
	if len(data) == 1 {
		for k := range data {
			return k, nil
		}
	}
	return "", fmt.Errorf("node has no %s label and the ConfigMap has no %q profile (it has %s)", api.LabelNodeConfig, DefaultProfile, keys(data))
}

func keys(m map[string]string) string {
	if len(m) == 0 {
		return "no keys"
	}
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, fmt.Sprintf("%q", n))
	}
	sort.Strings(k)
	return "keys " + strings.Join(k, ", ")
}

// Store holds the node's current configuration. Update replaces it only
// with a configuration that parsed and validated: on error the last good
// one stays in force.
type Store struct {
	names   api.ResourceNames
	mu      sync.Mutex
	cur     Node
	profile string
}

// NewStore starts with the defaults (api.NodeConfig.Defaults).
func NewStore(names api.ResourceNames) *Store {
	s := &Store{names: names, profile: "(built-in defaults)"}
	s.cur.Defaults()
	return s
}

// Current returns the configuration in force and its profile name.
func (s *Store) Current() (Node, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cur
	c.ExcludeGPUs = append([]string(nil), c.ExcludeGPUs...)
	return c, s.profile
}

// Update applies the ConfigMap data for a node with these labels. It
// reports whether the configuration in force changed; on error nothing
// changes and the error names the profile and the problem.
func (s *Store) Update(data map[string]string, labels map[string]string) (bool, error) {
	name, c, err := Resolve(data, labels, s.names)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := !reflect.DeepEqual(s.cur, c)
	s.cur, s.profile = c, name
	return changed, nil
}
