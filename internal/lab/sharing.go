package lab

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/nodeagent/mps/mpsfake"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// NodeConfigMap is the node agents' ConfigMap in the lab (namespace
// tessera-system). The lab creates it with Profiles when it is missing and
// leaves it alone otherwise, so a user's edits survive a restart.
const NodeConfigMap = "tessera-node-agent"

// MPSControlComponent is the lab's stand-in for nvidia-cuda-mps-control
// (mpsfake), run as `tessera-lab component mps-control [-d|-f]`.
const MPSControlComponent = "mps-control"

// Profiles are the node agent profiles of the lab's ConfigMap: Tessera's
// default, and NVIDIA's configurations as their guides write them.
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
	// the node's nvidia.com/mig.config label, from "mig-parted".
	"mig": "version: v1\nflags:\n  migStrategy: mixed\n",
	// mig-parted's layouts, as its guide writes them.
	"mig-parted": `version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
  all-2g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3
`,
	// Tessera's dynamic MIG: instances sized to each pod.
	"mig-dynamic": "sharing: mig-dynamic\n",
}

// SharingTaint keeps ordinary GPU pods off the lab's time-slicing and
// dynamic-MIG nodes (which also serve nvidia.com/gpu); pods meant for them
// tolerate it.
const SharingTaint = "tessera.io/lab-sharing"

// SharingNodes are the nodes `tessera-lab up` adds beside the shared ones,
// one per sharing mode: NVIDIA's time-slicing and MPS guides, a static
// MIG A100-40GB (mig-parted all-1g.5gb, mixed strategy: 1g.5gb and
// 2g.10gb exist there) and a dynamic-MIG A100-40GB.
func SharingNodes() []NodeSpec {
	node := func(name, profile string, labels map[string]string, taint bool) NodeSpec {
		l := map[string]string{api.LabelNodeConfig: profile}
		for k, v := range labels {
			l[k] = v
		}
		n := NodeSpec{Name: name, Model: "A100-40GB", GPUs: 1, Labels: l}
		if taint {
			n.Taints = []string{SharingTaint + "=" + profile + ":NoSchedule"}
		}
		return n
	}
	return []NodeSpec{
		node("lab-time-slicing", "time-slicing", nil, true),
		node("lab-mps", "mps", nil, false),
		node("lab-mig", "mig", map[string]string{api.LabelMIGConfig: "all-1g.5gb"}, false),
		node("lab-mig-dynamic", "mig-dynamic", nil, true),
	}
}

func ensureNodeConfigMap(ctx context.Context, client kubernetes.Interface) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: NodeConfigMap}, Data: Profiles}
	_, err := client.CoreV1().ConfigMaps(systemNamespace).Create(ctx, cm, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("node agent ConfigMap: %w", err)
	}
	return nil
}

// nodeArgs are a node's labels, taints and profiles for its kubelet and
// node agent.
func nodeArgs(n NodeSpec) []string {
	labels := []string{"tessera.io/emulated=true"}
	for k, v := range n.Labels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	args := []string{"--labels=" + strings.Join(labels, ","), "--config-map=" + systemNamespace + "/" + NodeConfigMap}
	if len(n.Taints) > 0 {
		args = append(args, "--taints="+strings.Join(n.Taints, ","))
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

// runMPSControl is the fake nvidia-cuda-mps-control.
func runMPSControl(args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if code := mpsfake.Main([]string{exe, ComponentCommand, MPSControlComponent}, args, os.Stdin, os.Stdout); code != 0 {
		os.Exit(code)
	}
	return nil
}
