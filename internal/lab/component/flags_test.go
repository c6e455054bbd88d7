package component

import (
	"reflect"
	"testing"

	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestNodeFlags: a node of every mode reaches its components as the lab
// started it (labels, taints, ConfigMap, GPUs), and its kubelet is the
// one its mode asks for: only the dra mode's runs the DRA manager.
func TestNodeFlags(t *testing.T) {
	for _, m := range modes.All() {
		n := m.Spec(m.Node, m.Model, m.GPUs)
		lab := labdir.Dir(t.TempDir())
		in := NodeFlags{
			Kubeconfig: "k", Node: n.Name, Mode: n.Mode, Dir: lab.Node(n.Name), Lab: lab, Tools: "/tools", Model: n.Model, GPUs: n.GPUs,
			Port: 10250, Shim: true, Labels: n.Labels, Taints: n.Taints, ConfigMap: "tessera-system/tessera-node-agent",
		}
		args := in.Args(Kubelet)
		if args[0] != Command || args[1] != Kubelet {
			t.Fatalf("mode %s: %v", m.Name, args)
		}
		f, err := parseNodeFlags(Kubelet, args[2:])
		if err != nil {
			t.Fatal(err)
		}
		want := in
		want.Labels = map[string]string{LabelEmulated: "true"}
		for k, v := range n.Labels {
			want.Labels[k] = v
		}
		if !reflect.DeepEqual(*f, want) {
			t.Errorf("mode %s: flags read back as\n%+v\nwant\n%+v", m.Name, *f, want)
		}
		if f.Labels[api.LabelNodeConfig] != m.Profile || f.Labels[modes.Label] != m.Name {
			t.Errorf("mode %s: labels %v", m.Name, f.Labels)
		}
		o, err := kubeletOptions(f)
		if err != nil {
			t.Fatal(err)
		}
		if o.DRA != (m.Name == "dra") || o.NodeName != n.Name || !reflect.DeepEqual(o.Taints, f.Taints) || o.Labels[modes.Label] != m.Name {
			t.Errorf("mode %s: kubelet %+v", m.Name, o)
		}
	}
	f, err := parseNodeFlags(Kubelet, []string{"--kubeconfig=k", "--node=n", "--dir=d", "--mode=warp"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubeletOptions(f); err == nil {
		t.Error("a kubelet of an unknown mode started")
	}
	for _, bad := range [][]string{{"--node=n", "--dir=d"}, {"--kubeconfig=k", "--node=n", "--dir=d", "--labels=x"}, {"--kubeconfig=k", "--node=n", "--dir=d", "--taints=x"}} {
		if _, err := parseNodeFlags(Kubelet, bad); err == nil {
			t.Errorf("flags %v accepted", bad)
		}
	}
}
