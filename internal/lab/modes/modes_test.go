package modes

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestParseNodes(t *testing.T) {
	nodes, err := ParseNodes("2xA100-40GB:8, 1xh100-80gb:4,1xA100-40GB:1@time-slicing")
	if err != nil {
		t.Fatal(err)
	}
	type want struct{ name, model, mode string }
	wants := []want{{"lab-gpu-01", "A100-40GB", "fractional"}, {"lab-gpu-02", "A100-40GB", "fractional"}, {"lab-gpu-03", "h100-80gb", "fractional"}, {"lab-time-slicing-01", "A100-40GB", "time-slicing"}}
	if len(nodes) != len(wants) {
		t.Fatalf("got %+v, want %+v", nodes, wants)
	}
	for i, w := range wants {
		n := nodes[i]
		if n.Name != w.name || n.Model != w.model || n.Mode != w.mode || n.Labels[Label] != w.mode {
			t.Errorf("node %d: %+v, want %+v", i, n, w)
		}
		m, _ := Named(w.mode)
		if n.Labels[api.LabelNodeConfig] != m.Profile || len(n.Taints) != len(m.Taints) {
			t.Errorf("node %s: labels %v, taints %v; want the %s profile and its taints", n.Name, n.Labels, n.Taints, w.mode)
		}
	}
	for in, msg := range map[string]string{
		"2xA100-40GB":           `entry "2xA100-40GB": want COUNTxMODEL:GPUS[@MODE]`,
		"1xV100:8":              `node lab-gpu-01: unknown GPU model "V100"`,
		"1xA100-40GB:0":         "0 GPUs per node: want 1 to 16",
		"65xA100-40GB:8":        "65 nodes, want 1 to 64",
		"0xA100-40GB:8":         "0 nodes, want 1 to 64",
		"1xA100-40GB:8,,":       `entry "": want COUNTxMODEL:GPUS`,
		"1xA100-40GB:8@warp":    `no node mode "warp" (the lab's modes: fractional, time-slicing`,
		"1xA100-40GB:8@MPS-ish": `want COUNTxMODEL:GPUS[@MODE]`,
	} {
		if _, err := ParseNodes(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseNodes(%q) = %v, want an error containing %q", in, err, msg)
		}
	}
	if _, err := Uniform(0, 8, "A100-40GB"); err == nil || !strings.Contains(err.Error(), "--nodes 0") {
		t.Errorf("Uniform(0): %v", err)
	}
	if nodes, err := Uniform(3, 2, "H200-141GB"); err != nil || len(nodes) != 3 || nodes[2].Name != "lab-gpu-03" || nodes[2].Mode != Default().Name {
		t.Errorf("Uniform(3) = %+v, %v", nodes, err)
	}
	if err := Validate(append(SharingNodes(), SharingNodes()...)); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("Validate of a node given twice: %v", err)
	}
}

// TestModes: every mode's profile is one the lab offers and parses, its
// node and demo pods are well formed, and a node's labels and taints
// reach its kubelet through the component flags.
func TestModes(t *testing.T) {
	profiles, err := NodeProfiles(nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range All() {
		if seen[m.Name] || m.Name == "" || m.Summary == "" {
			t.Errorf("mode %+v: unnamed, undescribed or twice", m)
		}
		seen[m.Name] = true
		if _, ok := profiles[m.Profile]; !ok {
			t.Errorf("mode %s: profile %q is not one of the lab's", m.Name, m.Profile)
		}
		if len(m.Demo) == 0 {
			t.Errorf("mode %s: no demo pod", m.Name)
		}
		n := m.Spec(m.Node, m.Model, m.GPUs)
		if err := Validate([]NodeSpec{n}); err != nil {
			t.Errorf("mode %s: %v", m.Name, err)
		}
		if n.Labels[Label] != m.Name || n.Labels[api.LabelNodeConfig] != m.Profile || !reflect.DeepEqual(n.Taints, m.Taints) {
			t.Errorf("mode %s: node labels %v, taints %v", m.Name, n.Labels, n.Taints)
		}
		// What the mode's node runs as, through the agent's own
		// resolution (profiles, mig-parted layouts selected by label).
		if _, c, err := config.Resolve(profiles, n.Labels, api.DefaultResourceNames); err != nil || c.Sharing != m.Sharing || (c.Mode == api.ModeDRA) != (m.Name == "dra") {
			t.Errorf("mode %s: profile %s resolves to %+v, %v; want sharing %q", m.Name, m.Profile, c.NodeConfig, err, m.Sharing)
		}
	}
	if Default().Name != "fractional" || len(SharingNodes()) != len(All())-1 {
		t.Errorf("default mode %q, %d sharing nodes for %d modes", Default().Name, len(SharingNodes()), len(All()))
	}
}

func TestReadNodeConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n  dense: |\n    sharing: shared\n    sharesPerGPU: 32\n")
	p, err := ReadNodeConfig(good)
	if err != nil || !strings.Contains(p["dense"], "sharesPerGPU: 32") {
		t.Fatalf("ReadNodeConfig = %v, %v", p, err)
	}
	all, err := NodeProfiles(p)
	if err != nil || all["dense"] != p["dense"] || all["default"] == "" || all["nvidia-time-slicing"] == "" {
		t.Errorf("profiles %v, %v: want the user's, the lab's and the shipped ones", all, err)
	}
	for body, msg := range map[string]string{
		"apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n":                                                                  `kind "Secret", want a ConfigMap`,
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n":                                                               "has no data",
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n  bad: |\n    sharing: shared\n    sharesPerGPU: 1000\n": `key "bad": sharesPerGPU 1000 outside [1, `,
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nspec: {}\n":                                                     "not a ConfigMap manifest",
	} {
		if _, err := ReadNodeConfig(write("bad.yaml", body)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ReadNodeConfig(%q) = %v, want an error containing %q", body, err, msg)
		}
	}
}

// TestModeHooks: a mode's Setup runs once when one of its nodes is in the
// lab, and its Serving replaces the device-plugin readiness check (a DRA
// node has no device-plugin resource).
func TestModeHooks(t *testing.T) {
	setups := 0
	serving := false
	register(t, &Mode{
		Name: "test-hooks", Order: 1000, Profile: "default", Node: "lab-test-hooks", Model: "A100-40GB", GPUs: 1,
		Setup: func(context.Context, kubernetes.Interface) error { setups++; return nil },
		Serving: func(_ context.Context, _ kubernetes.Interface, n *corev1.Node) bool {
			return serving && n.Labels[Label] == "test-hooks"
		},
	})
	nodes, err := ParseNodes("1xA100-40GB:1,2xA100-40GB:1@test-hooks")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	client := fake.NewClientset()
	if err := SetUp(ctx, client, nodes); err != nil || setups != 1 {
		t.Errorf("SetUp: %v, %d setups of the mode of two nodes, want 1", err, setups)
	}
	ready := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	for _, n := range nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}, Status: corev1.NodeStatus{Conditions: ready}}
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No device-plugin resource anywhere: the fractional node is not
	// ready; the test mode's is once its Serving says so.
	if NodeReady(ctx, client, nodes[0], config.Node{}) || NodeReady(ctx, client, nodes[1], config.Node{}) {
		t.Error("a node without GPUs served counted ready")
	}
	serving = true
	if NodeReady(ctx, client, nodes[0], config.Node{}) || !NodeReady(ctx, client, nodes[1], config.Node{}) {
		t.Errorf("with Serving true: fractional %v, test-hooks %v; want false, true", NodeReady(ctx, client, nodes[0], config.Node{}), NodeReady(ctx, client, nodes[1], config.Node{}))
	}
	n0, _ := client.CoreV1().Nodes().Get(ctx, nodes[0].Name, metav1.GetOptions{})
	n0.Annotations = map[string]string{api.AnnotationInventory: "{}"}
	n0.Status.Allocatable = corev1.ResourceList{"nvidia.com/mig-1g.5gb": resource.MustParse("7")}
	if _, err := client.CoreV1().Nodes().Update(ctx, n0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !NodeReady(ctx, client, nodes[0], config.Node{}) {
		t.Error("a node serving MIG devices through the device plugin is not ready")
	}
}

// register adds a mode for the test's length.
func register(t *testing.T, m *Mode) {
	t.Helper()
	before := All()
	Register(m)
	t.Cleanup(func() { registry = before })
}

// TestRegister: a mode is refused without what every mode needs, or with
// a name, an order or a profile of its own another mode has.
func TestRegister(t *testing.T) {
	base := func() *Mode {
		return &Mode{Name: "x", Order: 1000, Profile: "x", Node: "lab-x", Model: "A100-40GB", GPUs: 1}
	}
	for what, change := range map[string]func(*Mode){
		"no name":         func(m *Mode) { m.Name = "" },
		"no profile":      func(m *Mode) { m.Profile = "" },
		"no node":         func(m *Mode) { m.Node = "" },
		"no GPUs":         func(m *Mode) { m.GPUs = 0 },
		"a taken name":    func(m *Mode) { m.Name = "mps" },
		"a taken order":   func(m *Mode) { m.Order = Default().Order },
		"another profile": func(m *Mode) { m.Profile, m.ProfileYAML = "default", "sharing: exclusive\n" },
	} {
		m := base()
		change(m)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("a mode with %s registered", what)
					registry = registry[:len(registry)-1]
				}
			}()
			Register(m)
		}()
	}
	register(t, base())
	if m, err := Named("x"); err != nil || All()[len(All())-1] != m {
		t.Errorf("the registered mode: %v, last of %v", err, All())
	}
}

// TestSharesAs: a node counts as ready only once its agent publishes the
// sharing its profile gives, its MIG layout applied.
func TestSharesAs(t *testing.T) {
	profiles, err := NodeProfiles(nil)
	if err != nil {
		t.Fatal(err)
	}
	profileOf := func(mode string) config.Node {
		m, err := Named(mode)
		if err != nil {
			t.Fatal(err)
		}
		_, c, err := config.Resolve(profiles, m.Spec(m.Node, m.Model, m.GPUs).Labels, api.DefaultResourceNames)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	node := func(sharing ...api.SharingMode) *corev1.Node {
		inv := fixtures.Inventory("n1", len(sharing), "A100-SXM4-40GB", 40960, 10)
		for i, s := range sharing {
			g := &inv.GPUs[i]
			g.MIG.Capable, g.Sharing = true, s
			switch s {
			case api.SharingExclusive:
				g.MaxShares = 1
			case api.SharingMIG, api.SharingMIGDynamic:
				g.MIG.Enabled = true
			}
		}
		return fixtures.Node("n1", inv, api.DefaultResourceNames)
	}
	const (
		shared    = api.SharingShared
		exclusive = api.SharingExclusive
		mig       = api.SharingMIG
		dynamic   = api.SharingMIGDynamic
	)
	for _, c := range []struct {
		mode string
		gpus []api.SharingMode
		want bool
	}{
		{"fractional", []api.SharingMode{shared, shared}, true},
		{"time-slicing", []api.SharingMode{shared}, false}, // the default profile's, before the agent applied its own
		{"time-slicing", []api.SharingMode{api.SharingTimeSlicing}, true},
		{"mps", []api.SharingMode{api.SharingMPS}, true},
		{"mig", []api.SharingMode{shared}, false},
		{"mig", []api.SharingMode{exclusive}, false}, // all-1g.5gb not applied yet
		{"mig", []api.SharingMode{mig}, true},
		{"mig-dynamic", []api.SharingMode{exclusive}, false},
		{"mig-dynamic", []api.SharingMode{dynamic}, true},
	} {
		if got := sharesAs(node(c.gpus...), profileOf(c.mode)); got != c.want {
			t.Errorf("mode %s, GPUs %v: ready %v, want %v", c.mode, c.gpus, got, c.want)
		}
	}
	n := node(shared)
	if !sharesAs(n, config.Node{}) {
		t.Error("no profile to wait for, and the node is not ready")
	}
	delete(n.Annotations, api.AnnotationInventory)
	if sharesAs(n, profileOf("fractional")) {
		t.Error("a node without inventory shares as its profile says")
	}
}
