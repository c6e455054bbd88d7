package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

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
		if n.Name != w.name || n.Model != w.model || n.Mode != w.mode || n.Labels[LabelMode] != w.mode {
			t.Errorf("node %d: %+v, want %+v", i, n, w)
		}
		m, _ := ModeNamed(w.mode)
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
	if nodes, err := Uniform(3, 2, "H200-141GB"); err != nil || len(nodes) != 3 || nodes[2].Name != "lab-gpu-03" || nodes[2].Mode != FractionalMode {
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
	profiles, err := nodeProfiles(nil)
	if err != nil {
		t.Fatal(err)
	}
	// What each mode's node runs as, through the agent's own resolution
	// (profiles, mig-parted layouts selected by label).
	sharing := map[string]api.SharingMode{"fractional": api.SharingShared, "time-slicing": api.SharingTimeSlicing, "mps": api.SharingMPS, "mig": api.SharingMIG, "mig-dynamic": api.SharingMIGDynamic}
	seen := map[string]bool{}
	for _, m := range Modes {
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
		n := m.spec(m.Node, m.Model, m.GPUs)
		if err := validate([]NodeSpec{n}); err != nil {
			t.Errorf("mode %s: %v", m.Name, err)
		}
		if _, c, err := config.Resolve(profiles, n.Labels, api.DefaultResourceNames); err != nil || c.Sharing != sharing[m.Name] {
			t.Errorf("mode %s: profile %s resolves to %+v, %v; want sharing %q", m.Name, m.Profile, c.NodeConfig, err, sharing[m.Name])
		}
		f, err := parseNodeFlags("kubelet", append([]string{"--kubeconfig=k", "--node=" + n.Name, "--dir=d"}, nodeArgs(n)...))
		if err != nil {
			t.Fatal(err)
		}
		labels, taints, err := nodeMeta(f)
		if err != nil {
			t.Fatal(err)
		}
		if labels[api.LabelNodeConfig] != m.Profile || labels[LabelMode] != m.Name || labels["tessera.io/emulated"] != "true" || len(taints) != len(m.Taints) || len(m.Taints) > 0 && !reflect.DeepEqual(taints, m.Taints) {
			t.Errorf("mode %s: labels %v taints %v", m.Name, labels, taints)
		}
		if f.configMap != systemNamespace+"/"+NodeConfigMap {
			t.Errorf("config map %q", f.configMap)
		}
	}
	if FractionalMode != "fractional" || len(SharingNodes()) != len(Modes)-1 {
		t.Errorf("fractional mode %q, %d sharing nodes for %d modes", FractionalMode, len(SharingNodes()), len(Modes))
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
	all, err := nodeProfiles(p)
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

// bound is a one-GPU pod of the scheduler bound to node with rec as its
// record (nil: pending, no record).
func bound(ns, name, node string, rec *api.PodAllocation) *corev1.Pod {
	p := fixtures.MakePod().Namespace(ns).Name(name).SchedulerName("tessera-scheduler").Node(node).
		Container("c", map[string]string{api.DefaultResourceNames.GPU: "1"})
	if rec != nil {
		p.Record(rec).Phase(corev1.PodRunning)
	}
	return p.Obj()
}

func TestCollectAndPrint(t *testing.T) {
	inv := fixtures.Inventory("n1", 2, "A100-SXM4-40GB", 40960, 4)
	node := fixtures.Node("n1", inv, api.DefaultResourceNames)
	g0, g1 := inv.GPUs[0].UUID, inv.GPUs[1].UUID
	shared := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g0, MemoryMiB: 10000, Cores: 30}}}}}
	other := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g0, MemoryMiB: 20000, Cores: 50}}}}}
	whole := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g1, MemoryMiB: 40960, Cores: 100, Exclusive: true}}}}}
	pending := bound("default", "waiting", "", nil)
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes: 1 no GPU with 50000 MiB free"}}
	done := bound("default", "done", "n1", shared)
	done.Status.Phase = corev1.PodSucceeded // released: not counted
	client := fake.NewClientset(node, bound("default", "a", "n1", shared), bound("team", "b", "n1", other), bound("default", "w", "n1", whole), pending, done)

	r, err := Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if r.Invariant != nil {
		t.Fatalf("invariant: %v", r.Invariant)
	}
	if len(r.Nodes) != 1 || len(r.Nodes[0].GPUs) != 2 {
		t.Fatalf("report %+v", r)
	}
	got0 := r.Nodes[0].GPUs[0]
	if got0.UsedMiB != 30000 || got0.Cores != 80 || got0.Shares != 2 || strings.Join(got0.Pods, ",") != "default/a,team/b" {
		t.Errorf("GPU 0: %+v", got0)
	}
	if got1 := r.Nodes[0].GPUs[1]; !got1.Exclusive || got1.UsedMiB != 40960 {
		t.Errorf("GPU 1: %+v", got1)
	}
	if len(r.Pending) != 1 || r.Pending[0].Name != "default/waiting" || !strings.Contains(r.Pending[0].Reason, "50000 MiB") {
		t.Errorf("pending: %+v", r.Pending)
	}
	k := r.Packing()
	if k.GPUs != 2 || k.InUse != 2 || k.Exclusive != 1 || k.PartlyUsed != 1 || k.Pods != 3 {
		t.Errorf("packing %+v", k)
	}
	var out bytes.Buffer
	if err := r.Print(&out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"30000/40960", "80%", "2/4", "whole", "a,team/b", "3 pods on 2 of 2 GPUs (1 whole, 1 shared and partly free)", "default/waiting: 0/1 nodes", "invariant checker: no GPU over"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}

	// Two records over-committing GPU 0 are reported, not hidden.
	big := &api.PodAllocation{Node: "n1", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: g0, MemoryMiB: 30000, Cores: 10}}}}}
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), bound("default", "big", "n1", big), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err = Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if r.Invariant == nil {
		t.Fatal("60000 MiB granted on a 40960 MiB GPU, and the checker found nothing")
	}
	out.Reset()
	_ = r.Print(&out)
	if !strings.Contains(out.String(), "INVARIANT BROKEN") {
		t.Errorf("output hides the broken invariant:\n%s", out.String())
	}

	// A node whose inventory does not decode has no GPUs in the report, as
	// for the scheduler, and the report says why; the rest is reported.
	bad := fixtures.Node("n2", fixtures.Inventory("n2", 1, "A100-SXM4-40GB", 40960, 4), api.DefaultResourceNames)
	bad.Annotations[api.AnnotationInventory] = `{"apiVersion":"tessera.io/v9"}`
	if _, err := client.CoreV1().Nodes().Create(context.Background(), bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err = Collect(context.Background(), client)
	if err != nil {
		t.Fatalf("one unreadable inventory failed the whole report: %v", err)
	}
	if r.Inventory == nil || !strings.Contains(r.Inventory.Error(), "node n2") || len(r.Nodes) != 1 {
		t.Errorf("unreadable inventory: %v; nodes %+v", r.Inventory, r.Nodes)
	}
	out.Reset()
	_ = r.Print(&out)
	if !strings.Contains(out.String(), "UNREADABLE INVENTORY") || !strings.Contains(out.String(), "60000/40960") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestSupervisorRestartsAndStops runs a stand-in component (sh), kills
// it, and expects it back with a new PID; stopAll ends it for good.
func TestSupervisorRestartsAndStops(t *testing.T) {
	logs := t.TempDir()
	changed := make(chan struct{}, 10)
	s := newSupervisor("/bin/sh", logs, ktesting.NewLogger(t, ktesting.NewConfig()), func() { changed <- struct{}{} })
	if err := s.start("api", []string{"-c", "sleep 60"}, nil, false); err != nil {
		t.Fatal(err)
	}
	if err := s.start("worker", []string{"-c", "trap 'exit 0' TERM; sleep 60 & wait"}, []string{"X=1"}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.start("worker", nil, nil, false); err == nil {
		t.Error("a second component named worker was accepted")
	}
	first := s.components()["worker"].PID
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := s.components()["worker"]
		if c.Restarts == 1 && c.PID != first && s.alive("worker") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker not restarted: %+v", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	start := time.Now()
	s.stopAll(5 * time.Second)
	if s.alive("worker") || s.alive("api") {
		t.Error("components alive after stopAll")
	}
	if time.Since(start) > 4*time.Second {
		t.Errorf("stopAll took %v for components that exit on SIGTERM", time.Since(start))
	}
	time.Sleep(1500 * time.Millisecond) // past the restart delay
	if c := s.components()["worker"]; c.Restarts != 1 {
		t.Errorf("worker restarted after stopAll: %+v", c)
	}
	b, err := os.ReadFile(filepath.Join(logs, "worker.log"))
	if err != nil || strings.Count(string(b), "starting worker") != 2 || !strings.Contains(string(b), "signal: killed") {
		t.Errorf("worker.log: %v\n%s", err, b)
	}
}

// TestModeHooks: a mode's Setup runs once when one of its nodes is in the
// lab, its Args reach its nodes' components, and its Serving replaces the
// device-plugin readiness check (a DRA node has no device-plugin
// resource).
func TestModeHooks(t *testing.T) {
	setups := 0
	serving := false
	Modes = append(Modes, Mode{
		Name: "test-hooks", Profile: "default",
		Setup: func(context.Context, kubernetes.Interface) error { setups++; return nil },
		Serving: func(_ context.Context, _ kubernetes.Interface, n *corev1.Node) bool {
			return serving && n.Labels[LabelMode] == "test-hooks"
		},
		Args: map[string][]string{"node-agent": {"--x=1"}},
	})
	defer func() { Modes = Modes[:len(Modes)-1] }()
	nodes, err := ParseNodes("1xA100-40GB:1,2xA100-40GB:1@test-hooks")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	client := fake.NewClientset()
	if err := setupModes(ctx, client, nodes); err != nil || setups != 1 {
		t.Errorf("setupModes: %v, %d setups of the mode of two nodes, want 1", err, setups)
	}
	if a := componentArgs(nodes[1], "node-agent"); len(a) != 1 || a[0] != "--x=1" {
		t.Errorf("node-agent args %v", a)
	}
	if a := componentArgs(nodes[0], "node-agent"); len(a) != 0 {
		t.Errorf("a fractional node got %v", a)
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
	if nodeReady(ctx, client, nodes[0], config.Node{}) || nodeReady(ctx, client, nodes[1], config.Node{}) {
		t.Error("a node without GPUs served counted ready")
	}
	serving = true
	if nodeReady(ctx, client, nodes[0], config.Node{}) || !nodeReady(ctx, client, nodes[1], config.Node{}) {
		t.Errorf("with Serving true: fractional %v, test-hooks %v; want false, true", nodeReady(ctx, client, nodes[0], config.Node{}), nodeReady(ctx, client, nodes[1], config.Node{}))
	}
	n0, _ := client.CoreV1().Nodes().Get(ctx, nodes[0].Name, metav1.GetOptions{})
	n0.Annotations = map[string]string{api.AnnotationInventory: "{}"}
	n0.Status.Allocatable = corev1.ResourceList{"nvidia.com/mig-1g.5gb": resource.MustParse("7")}
	if _, err := client.CoreV1().Nodes().Update(ctx, n0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !nodeReady(ctx, client, nodes[0], config.Node{}) {
		t.Error("a node serving MIG devices through the device plugin is not ready")
	}
}

// TestSharesAs: a node counts as ready only once its agent publishes the
// sharing its profile gives, its MIG layout applied.
func TestSharesAs(t *testing.T) {
	profiles, err := nodeProfiles(nil)
	if err != nil {
		t.Fatal(err)
	}
	profileOf := func(mode string) config.Node {
		m, err := ModeNamed(mode)
		if err != nil {
			t.Fatal(err)
		}
		_, c, err := config.Resolve(profiles, m.spec(m.Node, m.Model, m.GPUs).Labels, api.DefaultResourceNames)
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
