// Package modes is the emulated cluster's catalogue of node modes: the
// ways its nodes share their GPUs (fractional shares, NVIDIA's
// time-slicing and MPS guides, static and dynamic MIG, DRA). Each mode is
// one file of this package that registers a Mode: its node, its node
// agent profile, the cluster objects and kubelet settings it needs, when
// its nodes serve their GPUs, and the demo pods that show it. `tessera-lab
// up` starts the nodes of --nodes/--node-groups (in the default mode,
// fractional, unless a group names another) and, unless
// --sharing-nodes=false, one node of every other mode; adding a mode to
// the lab is adding a file here.
package modes

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Label is the label that names a lab node's mode.
const Label = "tessera.io/lab-mode"

// SharingTaint keeps ordinary GPU pods off nodes of modes that also serve
// nvidia.com/gpu but do not isolate it (time-slicing): pods meant for
// them tolerate it.
const SharingTaint = "tessera.io/lab-sharing"

// Mode is one way the lab's nodes share their GPUs.
type Mode struct {
	// Name names the mode: the nodes' label Label, and the @MODE of
	// --node-groups.
	Name string
	// Summary says what the mode shows, in one line.
	Summary string
	// Order places the mode in listings (the usage, the nodes `up` adds,
	// the demo): lower first; the default mode, fractional, is 0.
	Order int
	// Profile is the node agent profile of the mode's nodes (their
	// tessera.io/node-config label): ProfileYAML, or a key of the shipped
	// ConfigMap (deploy/node-agent/configmap.yaml) or of --node-config.
	Profile string
	// ProfileYAML is the profile, when the lab brings its own (e.g.
	// NVIDIA's guides' files as written); empty: a profile of the shipped
	// ConfigMap.
	ProfileYAML string
	// Sharing is how the profile shares the mode's GPUs, once its agent
	// has applied it (a test resolves the profile and checks).
	Sharing api.SharingMode
	// Node, Model and GPUs are the node `up` adds for the mode.
	Node  string
	Model string
	GPUs  int
	// Labels and Taints go on the mode's nodes besides Label and the
	// profile's label (e.g. nvidia.com/mig.config, or a taint that keeps
	// ordinary GPU pods away; the mode's pods tolerate it).
	Labels map[string]string
	Taints []corev1.Taint
	// Demo are the pods `tessera-lab demo` runs on a node of the mode to
	// show it (Pending pods of its namespace are placed by Tessera, with
	// a node selector for the mode and its tolerations added).
	Demo []DemoPod

	// What a mode needs beyond a profile (a DRA node: its DeviceClasses,
	// the kubelet's DRA manager), all optional:

	// Setup runs once when the lab starts, before its nodes do, when a
	// node of the mode is in the lab: cluster objects the mode's nodes
	// need. It must accept objects that exist already (a lab started
	// again in its directory).
	Setup func(ctx context.Context, client kubernetes.Interface) error
	// Serving says whether a node of the mode serves its GPUs; `up` waits
	// for it on every node of the mode (nil: the node agent's inventory
	// published, shared as the node's profile says, and a device-plugin
	// GPU resource allocatable).
	Serving func(ctx context.Context, client kubernetes.Interface, node *corev1.Node) bool
	// Kubelet adjusts the hollow kubelet of each of the mode's nodes.
	Kubelet func(*hollowkubelet.Options)
	// OnRequest: the lab has a node of the mode only when asked (a
	// component the mode needs is optional: `up --volcano`, or
	// --node-groups …@MODE); All, SharingNodes and the demo leave it out.
	OnRequest bool
}

// DemoPod is a pod of the demo: what it runs, what it asks for and what
// its log must show.
type DemoPod struct {
	Name      string
	Command   []string
	Resources map[string]string
	// Show says what the pod demonstrates, printed above its log.
	Show string
	// SameGPUAs names an earlier demo pod whose GPU this one asks for
	// (tessera.io/use-gpuuuid), to share it.
	SameGPUAs string
	// Holds: the pod keeps its memory until stopped (gpu-fill --hold
	// forever); the demo counts it done once it holds and every other
	// pod has ended.
	Holds bool
}

// registry holds the modes, by Order.
var registry []*Mode

// Register adds a mode to the lab; each mode's file calls it from init.
// A mode without a name, profile or node, or whose name or order another
// mode has, is a mistake in the lab's code: Register panics.
func Register(m *Mode) {
	if m.Name == "" || m.Profile == "" || m.Node == "" || m.Model == "" || m.GPUs < 1 {
		panic(fmt.Sprintf("lab mode %+v: name, profile and node (name, model, GPUs) are required", m))
	}
	for _, o := range registry {
		if o.Name == m.Name || o.Order == m.Order {
			panic(fmt.Sprintf("lab modes %s and %s: the same name or order (%d)", o.Name, m.Name, m.Order))
		}
		if o.Profile == m.Profile && o.ProfileYAML != "" && m.ProfileYAML != "" && o.ProfileYAML != m.ProfileYAML {
			panic(fmt.Sprintf("lab modes %s and %s: two profiles named %s", o.Name, m.Name, m.Profile))
		}
	}
	registry = append(registry, m)
	slices.SortFunc(registry, func(a, b *Mode) int { return a.Order - b.Order })
}

// All are the modes every lab has a node of, the default first (not the
// OnRequest ones).
func All() []*Mode {
	return slices.DeleteFunc(slices.Clone(registry), func(m *Mode) bool { return m.OnRequest })
}

// Default is the mode of --nodes and of node groups that name none.
func Default() *Mode { return registry[0] }

// Named returns the mode of that name.
func Named(name string) (*Mode, error) {
	for _, m := range registry {
		if m.Name == name {
			return m, nil
		}
	}
	names := make([]string, len(registry))
	for i, m := range registry {
		names[i] = m.Name
	}
	return nil, fmt.Errorf("no node mode %q (the lab's modes: %s)", name, strings.Join(names, ", "))
}
