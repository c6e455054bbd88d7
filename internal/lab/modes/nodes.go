package modes

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/lab/nvmlemu"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// NodeSpec is one emulated GPU node.
type NodeSpec struct {
	Name  string `json:"name"`
	Model string `json:"model"`
	GPUs  int    `json:"gpus"`
	// Mode is the node's mode (Named).
	Mode string `json:"mode"`
	// Labels are the Node's labels (e.g. tessera.io/node-config, which
	// picks the node agent's profile, and nvidia.com/mig.config).
	Labels map[string]string `json:"labels,omitempty"`
	// Taints are the Node's taints.
	Taints []corev1.Taint `json:"taints,omitempty"`
	// Partitioning: the node's emulated driver partitions GPU memory per
	// cgroup, as NVIDIA's r615 does (nvmlemu.PartitioningDriverVersion);
	// otherwise it is an older driver that does not.
	Partitioning bool `json:"partitioning,omitempty"`
}

// Spec is a node of the mode.
func (m *Mode) Spec(name, model string, gpus int) NodeSpec {
	labels := map[string]string{Label: m.Name, api.LabelNodeConfig: m.Profile}
	maps.Copy(labels, m.Labels)
	return NodeSpec{Name: name, Model: model, GPUs: gpus, Mode: m.Name, Labels: labels, Taints: slices.Clone(m.Taints)}
}

// Uniform returns n nodes of the default mode of gpus GPUs of one model,
// named lab-gpu-01…
func Uniform(n, gpus int, model string) ([]NodeSpec, error) {
	if n < 1 || n > 64 {
		return nil, fmt.Errorf("--nodes %d: want 1 to 64", n)
	}
	var out []NodeSpec
	for i := range n {
		out = append(out, Default().Spec(fmt.Sprintf("lab-gpu-%02d", i+1), model, gpus))
	}
	return out, validate(out)
}

var groupRE = regexp.MustCompile(`^(\d+)x([A-Za-z0-9-]+):(\d+)(?:@([a-z0-9-]+))?(\+partitioning)?$`)

// ParseNodes reads a heterogeneous node list such as
// "2xA100-40GB:8,1xH100-80GB:4@time-slicing" (count x model : GPUs per
// node, and the nodes' mode when not the default; "+partitioning" at the
// end: the nodes' driver partitions GPU memory per cgroup). Nodes of the default
// mode are named lab-gpu-01…, the others lab-<mode>-01….
func ParseNodes(s string) ([]NodeSpec, error) {
	var out []NodeSpec
	perMode := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		m := groupRE.FindStringSubmatch(part)
		if m == nil {
			return nil, fmt.Errorf("--node-groups entry %q: want COUNTxMODEL:GPUS[@MODE][+partitioning], e.g. 2xA100-40GB:8 or 1xA100-40GB:1@time-slicing", part)
		}
		count, _ := strconv.Atoi(m[1])
		gpus, _ := strconv.Atoi(m[3])
		mode := Default()
		if m[4] != "" {
			var err error
			if mode, err = Named(m[4]); err != nil {
				return nil, fmt.Errorf("--node-groups entry %q: %w", part, err)
			}
		}
		prefix := "lab-" + mode.Name
		if mode == Default() {
			prefix = "lab-gpu"
		}
		for range count {
			perMode[mode.Name]++
			n := mode.Spec(fmt.Sprintf("%s-%02d", prefix, perMode[mode.Name]), m[2], gpus)
			n.Partitioning = m[5] != ""
			out = append(out, n)
		}
	}
	if len(out) == 0 || len(out) > 64 {
		return nil, fmt.Errorf("--node-groups %q: %d nodes, want 1 to 64", s, len(out))
	}
	return out, validate(out)
}

// SharingNodes are the nodes `up` adds beside those of the default mode:
// one per other mode.
func SharingNodes() []NodeSpec {
	var out []NodeSpec
	for _, m := range All()[1:] {
		out = append(out, m.Spec(m.Node, m.Model, m.GPUs))
	}
	return out
}

// Validate checks a list of nodes as the lab will start them.
func Validate(nodes []NodeSpec) error {
	if len(nodes) == 0 || len(nodes) > 64 {
		return fmt.Errorf("%d nodes, want 1 to 64", len(nodes))
	}
	return validate(nodes)
}

// validate builds each node's NVML once, so a bad model or GPU count is
// reported before anything starts, and checks that names are unique and
// modes known.
func validate(nodes []NodeSpec) error {
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Name] {
			return fmt.Errorf("node %s given twice", n.Name)
		}
		seen[n.Name] = true
		if _, err := Named(n.Mode); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if _, err := nvmlemu.NewModel(n.Model, n.GPUs, n.Name); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}
