package component

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
)

// LabelEmulated marks every node of the lab.
const LabelEmulated = "tessera.io/emulated"

// NodeFlags are the flags of a node's components (runtime, kubelet,
// node-agent); each reads those it needs.
type NodeFlags struct {
	// Kubeconfig is the component's identity.
	Kubeconfig string
	Node       string
	Mode       string // the node's mode (modes.Named)
	Dir        labdir.NodeDir
	Lab        labdir.Dir
	Tools      tools.Dir
	Model      string
	GPUs       int
	// Port is the kubelet's.
	Port int
	// Shim: the node agent serves the kubelet shim's socket instead of
	// registering with the kubelet.
	Shim bool
	// Labels and Taints are the Node's (LabelEmulated is added).
	Labels map[string]string
	Taints []corev1.Taint
	// ConfigMap holds the node agent's profiles, namespace/name.
	ConfigMap string
	// Partitioning: the node's emulated driver partitions GPU memory per
	// cgroup (modes.NodeSpec.Partitioning).
	Partitioning bool
}

// Args is the command line that runs the component for the node.
func (f NodeFlags) Args(component string) []string {
	labels := []string{LabelEmulated + "=true"}
	for k, v := range f.Labels {
		labels = append(labels, k+"="+v)
	}
	slices.Sort(labels)
	args := []string{
		"--kubeconfig=" + f.Kubeconfig, "--node=" + f.Node, "--mode=" + f.Mode, "--dir=" + string(f.Dir), "--lab=" + string(f.Lab),
		"--labels=" + strings.Join(labels, ","),
	}
	if len(f.Taints) > 0 {
		var t []string
		for _, x := range f.Taints {
			t = append(t, x.Key+"="+x.Value+":"+string(x.Effect))
		}
		args = append(args, "--taints="+strings.Join(t, ","))
	}
	add := func(flag, value string) {
		if value != "" && value != "0" && value != "false" {
			args = append(args, flag+"="+value)
		}
	}
	add("--tools", string(f.Tools))
	add("--model", f.Model)
	add("--gpus", fmt.Sprint(f.GPUs))
	add("--port", fmt.Sprint(f.Port))
	add("--shim", fmt.Sprint(f.Shim))
	add("--config-map", f.ConfigMap)
	add("--partitioning", fmt.Sprint(f.Partitioning))
	return Args(component, args...)
}

// parseNodeFlags reads a node component's flags.
func parseNodeFlags(name string, args []string) (*NodeFlags, error) {
	f := &NodeFlags{}
	var dir, lab, tl, labels, taints string
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig")
	fs.StringVar(&f.Node, "node", "", "node name")
	fs.StringVar(&f.Mode, "mode", "", "the node's mode")
	fs.StringVar(&dir, "dir", "", "the node's directory")
	fs.StringVar(&lab, "lab", "", "the lab's state directory")
	fs.StringVar(&tl, "tools", "", "the lab's container tools")
	fs.StringVar(&f.Model, "model", "", "GPU model")
	fs.IntVar(&f.GPUs, "gpus", 0, "GPUs")
	fs.IntVar(&f.Port, "port", 0, "kubelet port")
	fs.BoolVar(&f.Shim, "shim", false, "node agent: serve the kubelet shim's socket instead of registering")
	fs.StringVar(&labels, "labels", "", "node labels k=v,…")
	fs.StringVar(&taints, "taints", "", "node taints k=v:Effect,…")
	fs.StringVar(&f.ConfigMap, "config-map", "", "the node agent's profiles, namespace/name")
	fs.BoolVar(&f.Partitioning, "partitioning", false, "the node's driver partitions GPU memory per cgroup (r615)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if f.Node == "" || dir == "" || f.Kubeconfig == "" {
		return nil, fmt.Errorf("%s: --node, --dir and --kubeconfig are required", name)
	}
	f.Dir, f.Lab, f.Tools = labdir.NodeDir(dir), labdir.Dir(lab), tools.Dir(tl)
	f.Labels = map[string]string{}
	for _, kv := range strings.Split(labels, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--labels entry %q: want key=value", kv)
		}
		f.Labels[k] = v
	}
	if len(f.Labels) == 0 {
		f.Labels[LabelEmulated] = "true"
	}
	for _, t := range strings.Split(taints, ",") {
		if t == "" {
			continue
		}
		kv, effect, ok := strings.Cut(t, ":")
		k, v, _ := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--taints entry %q: want key=value:Effect", t)
		}
		f.Taints = append(f.Taints, corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)})
	}
	return f, nil
}
