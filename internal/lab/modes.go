package lab

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Mode is one way the lab's nodes share their GPUs. `tessera-lab up` starts
// the nodes of --nodes/--node-groups (in the first mode, fractional, unless
// a group names another) and, unless --sharing-nodes=false, one node of
// every other mode: adding a mode to the lab is adding an entry to Modes.
type Mode struct {
	// Name names the mode: the nodes' label LabelMode, and the @MODE of
	// --node-groups.
	Name string
	// Summary says what the mode shows, in one line.
	Summary string
	// Profile is the node agent profile of the mode's nodes (their
	// tessera.io/node-config label): a key of Profiles, or of the
	// --node-config file.
	Profile string
	// Node, Model and GPUs are the node `up` adds for the mode.
	Node  string
	Model string
	GPUs  int
	// Labels and Taints go on the mode's nodes besides LabelMode and the
	// profile's label (e.g. nvidia.com/mig.config, or a taint that keeps
	// ordinary GPU pods away; the mode's pods tolerate it).
	Labels map[string]string
	Taints []corev1.Taint
	// Demo are the pods `tessera-lab demo` runs on a node of the mode to
	// show it (Pending pods of its namespace are placed by Tessera, with
	// a node selector for the mode and its tolerations added).
	Demo []DemoPod

	// What a mode needs beyond a profile (a DRA node: its DeviceClasses,
	// the kubelet plugin instead of the device plugin), all optional:

	// Setup runs once when the lab starts, before its nodes do, when a
	// node of the mode is in the lab: cluster objects the mode's nodes
	// need. It must accept objects that exist already (a lab started
	// again in its directory).
	Setup func(ctx context.Context, client kubernetes.Interface) error
	// Serving says whether a node of the mode serves its GPUs; `up` waits
	// for it on every node of the mode (nil: the node agent's inventory
	// published and a device-plugin GPU resource allocatable).
	Serving func(ctx context.Context, client kubernetes.Interface, node *corev1.Node) bool
	// Args are extra flags of the mode's nodes' components, by component:
	// "runtime", "kubelet", "node-agent" (parseNodeFlags must know them).
	Args map[string][]string
}

// setupModes runs the Setup of every mode that has a node in the lab.
func setupModes(ctx context.Context, client kubernetes.Interface, nodes []NodeSpec) error {
	done := map[string]bool{}
	for _, n := range nodes {
		if done[n.Mode] {
			continue
		}
		done[n.Mode] = true
		m, err := ModeNamed(n.Mode)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if m.Setup != nil {
			if err := m.Setup(ctx, client); err != nil {
				return fmt.Errorf("setting up mode %s: %w", m.Name, err)
			}
		}
	}
	return nil
}

// componentArgs are a node's component's extra flags from its mode.
func componentArgs(n NodeSpec, component string) []string {
	m, err := ModeNamed(n.Mode)
	if err != nil {
		return nil
	}
	return m.Args[component]
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

// LabelMode is the label that names a lab node's mode.
const LabelMode = "tessera.io/lab-mode"

// SharingTaint keeps ordinary GPU pods off nodes of modes that also serve
// nvidia.com/gpu but do not isolate it (time-slicing): pods meant for
// them tolerate it.
const SharingTaint = "tessera.io/lab-sharing"

// Modes are the lab's modes, the default (FractionalMode) first.
var Modes = []Mode{
	{
		Name:    "fractional",
		Summary: "fractional shares through the device plugin: memory and compute limits enforced by the limiter",
		Profile: "default", Node: "lab-gpu-01", Model: "A100-40GB", GPUs: 8,
		Demo: []DemoPod{
			{
				Name: "demo-10gib", Command: []string{"gpu-fill"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "1", api.DefaultResourceNames.Memory: "10240"},
				Show:      "a pod given 10 GiB of a GPU sees 10 GiB in total and is refused at 10 GiB",
			},
			{
				Name: "demo-whole-gpu", Command: []string{"gpu-fill"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "1"},
				Show:      "a pod given a whole GPU sees the whole GPU (no limiter)",
			},
			{
				Name: "demo-half-a", Command: []string{"gpu-fill", "--hold", "forever"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "0.5"},
				Show:      "two half-GPU pods on one GPU (the second asks for the first's GPU) fill it together and no further",
				Holds:     true,
			},
			{
				Name: "demo-half-b", Command: []string{"gpu-fill", "--hold", "1"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "0.5"},
				SameGPUAs: "demo-half-a",
			},
		},
	},
	{
		Name:    "time-slicing",
		Summary: "NVIDIA's time-slicing guide as written: 4 replicas of each GPU, nothing isolated",
		Profile: "time-slicing", Node: "lab-time-slicing", Model: "A100-40GB", GPUs: 1,
		Taints: []corev1.Taint{{Key: SharingTaint, Value: "time-slicing", Effect: corev1.TaintEffectNoSchedule}},
		Demo: []DemoPod{
			{
				Name: "demo-time-slicing", Command: []string{"sh", "-c", "nvidia-smi -L && gpu-fill"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "1"},
				Show:      "a pod on a time-sliced GPU (NVIDIA's guide) sees the whole GPU: nothing is isolated",
			},
		},
	},
	{
		Name:    "mps",
		Summary: "NVIDIA's MPS guide as written: 10 clients per GPU as nvidia.com/gpu.shared, each client's share enforced by the control daemon and the limiter",
		Profile: "mps", Node: "lab-mps", Model: "A100-40GB", GPUs: 1,
		Demo: []DemoPod{
			{
				Name: "demo-mps", Command: []string{"gpu-fill"},
				Resources: map[string]string{"nvidia.com/gpu.shared": "1"},
				Show:      "an MPS client (NVIDIA's guide: 10 replicas) gets a tenth of the GPU's memory and is refused there",
			},
		},
	},
	{
		Name:    "mig",
		Summary: "static MIG: mig-parted's all-1g.5gb layout (the node's nvidia.com/mig.config label), mixed strategy: nvidia.com/mig-1g.5gb",
		Profile: "mig", Node: "lab-mig", Model: "A100-40GB", GPUs: 1,
		Labels: map[string]string{api.LabelMIGConfig: "all-1g.5gb"},
		Demo: []DemoPod{
			{
				Name: "demo-mig", Command: []string{"gpu-fill"},
				Resources: map[string]string{"nvidia.com/mig-1g.5gb": "1"},
				Show:      "a pod given a MIG device (nvidia.com/mig-1g.5gb) sees that device's memory, no limiter",
			},
		},
	},
	{
		Name:    "mig-dynamic",
		Summary: "dynamic MIG: an instance made for each pod, sized to its memory and cores",
		Profile: "mig-dynamic", Node: "lab-mig-dynamic", Model: "A100-40GB", GPUs: 1,
		Taints: []corev1.Taint{{Key: SharingTaint, Value: "mig-dynamic", Effect: corev1.TaintEffectNoSchedule}},
		Demo: []DemoPod{
			{
				Name: "demo-mig-dynamic", Command: []string{"gpu-fill"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "1", api.DefaultResourceNames.Memory: "9000", api.DefaultResourceNames.Cores: "25"},
				Show:      "a pod asking 9000 MiB and 25 % on a dynamic-MIG GPU gets a MIG instance made for it (2g.10gb) and sees its memory",
			},
		},
	},
}

// FractionalMode is the mode of --nodes and of node groups that name none.
var FractionalMode = Modes[0].Name

// ModeNamed returns the mode of that name.
func ModeNamed(name string) (*Mode, error) {
	for i := range Modes {
		if Modes[i].Name == name {
			return &Modes[i], nil
		}
	}
	names := make([]string, len(Modes))
	for i, m := range Modes {
		names[i] = m.Name
	}
	return nil, fmt.Errorf("no node mode %q (the lab's modes: %s)", name, strings.Join(names, ", "))
}

// SharingNodes are the nodes `up` adds beside the fractional ones: one per
// other mode.
func SharingNodes() []NodeSpec {
	var out []NodeSpec
	for _, m := range Modes[1:] {
		out = append(out, m.spec(m.Node, m.Model, m.GPUs))
	}
	return out
}

// spec is a node of the mode.
func (m Mode) spec(name, model string, gpus int) NodeSpec {
	labels := map[string]string{LabelMode: m.Name, api.LabelNodeConfig: m.Profile}
	maps.Copy(labels, m.Labels)
	return NodeSpec{Name: name, Model: model, GPUs: gpus, Mode: m.Name, Labels: labels, Taints: slices.Clone(m.Taints)}
}

// NodeConfigMap is the node agents' ConfigMap in the lab (namespace
// tessera-system): its keys are profiles, each node's
// tessera.io/node-config label picks one, and an agent logs each profile
// it applies or refuses (`kubectl label node … tessera.io/node-config=…`
// and editing the ConfigMap take effect without a restart).
const NodeConfigMap = "tessera-node-agent"

// Profiles are the lab's node agent profiles: Tessera's default and
// NVIDIA's guides' configurations as written. They come on top of the
// shipped ConfigMap's (deploy/node-agent/configmap.yaml: mig-parted's
// layouts and mig-dynamic among them), and --node-config's on top of
// them.
var Profiles = map[string]string{
	"default": "sharing: shared\nsharesPerGPU: 10\n",
	// NVIDIA's time-slicing guide.
	"time-slicing": `version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`,
	// NVIDIA's MPS guide.
	"mps": `version: v1
sharing:
  mps:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
`,
	// NVIDIA's device plugin with the mixed MIG strategy; the layout is
	// the node's nvidia.com/mig.config label, from the shipped mig-parted
	// document.
	"mig": "version: v1\nflags:\n  migStrategy: mixed\n",
}

// ReadNodeConfig reads --node-config: a ConfigMap manifest (the agents'
// format, as deploy/node-agent/configmap.yaml) whose data keys are
// profiles. Every profile must parse; the error names the first that
// does not, and why.
func ReadNodeConfig(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(b, &cm); err != nil {
		return nil, fmt.Errorf("--node-config %s: not a ConfigMap manifest: %w", path, err)
	}
	if cm.Kind != "ConfigMap" {
		return nil, fmt.Errorf("--node-config %s: kind %q, want a ConfigMap whose data keys are node agent profiles (see deploy/node-agent/configmap.yaml)", path, cm.Kind)
	}
	if len(cm.Data) == 0 {
		return nil, fmt.Errorf("--node-config %s: the ConfigMap has no data: no profile", path)
	}
	keys := slices.Sorted(maps.Keys(cm.Data))
	for _, k := range keys {
		// A profile, or a mig-parted document of MIG layouts.
		b := []byte(cm.Data[k])
		_, perr := config.Parse(b, api.DefaultResourceNames)
		if perr == nil {
			continue
		}
		_, merr := config.ParseMIGParted(b)
		if merr == nil {
			continue
		}
		if strings.Contains(perr.Error(), "mig-parted document") {
			perr = merr
		}
		return nil, fmt.Errorf("--node-config %s: key %q: %w", path, k, perr)
	}
	return cm.Data, nil
}

// nodeProfiles are the ConfigMap's profiles: the shipped ConfigMap's, the
// lab's, and the user's, each replacing the previous of the same name.
func nodeProfiles(user map[string]string) (map[string]string, error) {
	out, err := deploy.NodeAgentProfiles()
	if err != nil {
		return nil, err
	}
	maps.Copy(out, Profiles)
	maps.Copy(out, user)
	return out, nil
}

// ensureNodeConfigMap creates the agents' ConfigMap, or, when the user
// gave --node-config, updates it with those profiles; otherwise a
// ConfigMap that exists (a lab started again in its directory) is kept
// with the user's edits. It returns the profile, with its MIG layout, the
// ConfigMap gives each node (what its agent publishes once it has applied
// it); a node whose profile does not resolve is an error naming it.
func ensureNodeConfigMap(ctx context.Context, client kubernetes.Interface, user map[string]string, nodes []NodeSpec) (map[string]config.Node, error) {
	data, err := nodeProfiles(user)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if p := n.Labels[api.LabelNodeConfig]; p != "" && data[p] == "" {
			return nil, fmt.Errorf("node %s: profile %q is in neither the lab's profiles nor --node-config (%s)", n.Name, p, strings.Join(slices.Sorted(maps.Keys(data)), ", "))
		}
	}
	cms := client.CoreV1().ConfigMaps(systemNamespace)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: NodeConfigMap}, Data: data}
	if _, err = cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("node agent ConfigMap: %w", err)
	}
	cur, err := cms.Get(ctx, NodeConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node agent ConfigMap: %w", err)
	}
	if len(user) > 0 {
		if cur.Data == nil {
			cur.Data = map[string]string{}
		}
		maps.Copy(cur.Data, user)
		if cur, err = cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("node agent ConfigMap: %w", err)
		}
	}
	out := map[string]config.Node{}
	for _, n := range nodes {
		_, c, err := config.Resolve(cur.Data, n.Labels, api.DefaultResourceNames)
		if err != nil {
			return nil, fmt.Errorf("node %s, ConfigMap %s/%s: %w", n.Name, systemNamespace, NodeConfigMap, err)
		}
		out[n.Name] = c
	}
	return out, nil
}

// nodeArgs are a node's labels, taints and ConfigMap for its kubelet and
// node agent.
func nodeArgs(n NodeSpec) []string {
	labels := []string{"tessera.io/emulated=true"}
	for k, v := range n.Labels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	args := []string{"--labels=" + strings.Join(labels, ","), "--config-map=" + systemNamespace + "/" + NodeConfigMap}
	if len(n.Taints) > 0 {
		var t []string
		for _, x := range n.Taints {
			t = append(t, x.Key+"="+x.Value+":"+string(x.Effect))
		}
		args = append(args, "--taints="+strings.Join(t, ","))
	}
	return args
}

// nodeMeta reads --labels and --taints.
func nodeMeta(f *nodeFlags) (map[string]string, []corev1.Taint, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(f.labels, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, nil, fmt.Errorf("--labels entry %q: want key=value", kv)
		}
		labels[k] = v
	}
	if len(labels) == 0 {
		labels["tessera.io/emulated"] = "true"
	}
	var taints []corev1.Taint
	for _, t := range strings.Split(f.taints, ",") {
		if t == "" {
			continue
		}
		kv, effect, ok := strings.Cut(t, ":")
		k, v, _ := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, nil, fmt.Errorf("--taints entry %q: want key=value:Effect", t)
		}
		taints = append(taints, corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)})
	}
	return labels, taints, nil
}
