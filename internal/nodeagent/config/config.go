// Package config turns the node agent's ConfigMap into the node's
// api.NodeConfig. The ConfigMap holds one profile per data key; the node
// label api.LabelNodeConfig picks one (DefaultProfile when unset). A profile is
// either Tessera's format (the fields of api.NodeConfig) or NVIDIA's
// device-plugin time-slicing format, accepted as written.
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

// Parse reads one profile. resource is the GPU resource name the agent
// serves: a time-slicing profile must name it.
func Parse(data []byte, resource string) (api.NodeConfig, error) {
	if len(data) > MaxProfileBytes {
		return api.NodeConfig{}, fmt.Errorf("profile is %d bytes, more than the limit of %d", len(data), MaxProfileBytes)
	}
	var probe map[string]any
	if err := yaml.Unmarshal(data, &probe); err != nil {
		return api.NodeConfig{}, fmt.Errorf("not YAML or JSON: %w", err)
	}
	var c api.NodeConfig
	if _, ok := probe["sharing"].(map[string]any); ok || probe["version"] != nil {
		var err error
		if c, err = parseNVIDIA(data, resource); err != nil {
			return api.NodeConfig{}, err
		}
	} else if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return api.NodeConfig{}, fmt.Errorf("tessera profile: %w", err)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return api.NodeConfig{}, err
	}
	return c, nil
}

// nvidiaConfig is the part of NVIDIA's k8s-device-plugin config file that
// matters here. Other sections (flags, resources, mps) are ignored, as the
// plugin's own options would be.
type nvidiaConfig struct {
	Version string `json:"version"`
	Sharing struct {
		TimeSlicing *struct {
			RenameByDefault            bool `json:"renameByDefault"`
			FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne"`
			Resources                  []struct {
				Name     string `json:"name"`
				Replicas int    `json:"replicas"`
				Rename   string `json:"rename"`
				Devices  any    `json:"devices"`
			} `json:"resources"`
		} `json:"timeSlicing"`
	} `json:"sharing"`
}

func parseNVIDIA(data []byte, resource string) (api.NodeConfig, error) {
	var n nvidiaConfig
	if err := yaml.Unmarshal(data, &n); err != nil {
		return api.NodeConfig{}, fmt.Errorf("NVIDIA device-plugin config: %w", err)
	}
	if n.Version != "v1" {
		return api.NodeConfig{}, fmt.Errorf("NVIDIA device-plugin config: version %q is not supported (want \"v1\")", n.Version)
	}
	ts := n.Sharing.TimeSlicing
	if ts == nil || len(ts.Resources) == 0 {
		// A v1 file without time-slicing shares nothing: whole GPUs.
		return api.NodeConfig{Sharing: api.SharingExclusive, SharesPerGPU: 1}, nil
	}
	var names []string
	for i, r := range ts.Resources {
		names = append(names, r.Name)
		if r.Name != resource {
			continue
		}
		if r.Devices != nil && r.Devices != "all" {
			return api.NodeConfig{}, fmt.Errorf("sharing.timeSlicing.resources[%d].devices %v: only \"all\" is supported (exclude GPUs with a Tessera profile's excludeGPUs)", i, r.Devices)
		}
		if r.Rename != "" {
			return api.NodeConfig{}, fmt.Errorf("sharing.timeSlicing.resources[%d].rename %q: renaming is not supported (set the agent's --resource-prefix)", i, r.Rename)
		}
		if r.Replicas < 1 || r.Replicas > api.MaxSharesLimit {
			return api.NodeConfig{}, fmt.Errorf("sharing.timeSlicing.resources[%d].replicas %d outside [1, %d]", i, r.Replicas, api.MaxSharesLimit)
		}
		return api.NodeConfig{Sharing: api.SharingTimeSlicing, SharesPerGPU: r.Replicas}, nil
	}
	return api.NodeConfig{}, fmt.Errorf("sharing.timeSlicing.resources names %q, none of them %q (the resource this agent serves)", names, resource)
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
	resource string
	mu       sync.Mutex
	cur      api.NodeConfig
	profile  string
}

// NewStore starts with the defaults (api.NodeConfig.Defaults).
func NewStore(resource string) *Store {
	s := &Store{resource: resource, profile: "(built-in defaults)"}
	s.cur.Defaults()
	return s
}

// Current returns the configuration in force and its profile name.
func (s *Store) Current() (api.NodeConfig, string) {
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
	name, err := Select(data, labels)
	if err != nil {
		return false, err
	}
	raw := []byte(data[name])
	c, err := Parse(raw, s.resource)
	if err != nil {
		return false, fmt.Errorf("profile %q: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := !reflect.DeepEqual(s.cur, c)
	s.cur, s.profile = c, name
	return changed, nil
}
