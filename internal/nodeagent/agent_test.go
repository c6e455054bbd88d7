package nodeagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/migmgr"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/nodeagent/parts"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/testenv/poll"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// runAgent runs a until stop is called; stop waits for Run to return and
// reports its error. ctx is Run's context.
func runAgent(t *testing.T, a *Agent) (ctx context.Context, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	return ctx, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// eventually waits up to 10 s for cond (poll.Until, the loop behind
// testenv.WaitFor, which these unit tests cannot link: testenv brings in
// the kube-apiserver).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, 10*time.Second, cond)
}

// probe is a part that records what each reconcile tells the parts. It
// runs after the agent's own parts, so when it sees reconcile k, every
// other part has handled reconcile k and reconcile k-1 has published.
type probe struct {
	mu    sync.Mutex
	nodes []parts.Node
}

func (p *probe) Start(context.Context, parts.Cluster) error { return nil }
func (p *probe) Stop()                                      {}
func (p *probe) Reconcile(_ context.Context, n *parts.Node) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodes = append(p.nodes, *n)
}

// seen returns the nodes told so far.
func (p *probe) seen() []parts.Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.nodes)
}

// addProbe registers a probe after the agent's parts (before Run).
func addProbe(a *Agent) *probe {
	p := &probe{}
	a.parts = append(a.parts, p)
	return p
}

// reconciles waits until the agent has completed n more reconciles,
// publishing included, than the probe had seen when it was called.
func (p *probe) reconciles(t *testing.T, n int) {
	t.Helper()
	from := len(p.seen())
	eventually(t, fmt.Sprintf("%d more reconciles", n), func() bool { return len(p.seen()) > from+n })
}

// TestPublishHealthAndConfig runs the agent (without the device plugin)
// against a fake API server: the inventory follows GPU health and the
// node's configuration profile, and is written only when it changes.
func TestPublishHealthAndConfig(t *testing.T) {
	n := nvmltest.DGXA100()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	cm := &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tessera-system", Name: "node-agent"},
		Data: map[string]string{
			"default": "sharesPerGPU: 4\nmemoryOvercommit: 1.5",
			"excl":    "sharing: exclusive\nexcludeGPUs: [\"7\"]",
		},
	}
	client := fake.NewClientset(node, cm)
	a, err := New(n, client, Options{
		NodeName: "n1", Resource: "nvidia.com/gpu",
		ConfigMapNamespace: "tessera-system", ConfigMapName: "node-agent",
		Health:   health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: 300 * time.Millisecond, WaitTimeout: 5 * time.Millisecond},
		Paths:    deviceplugin.Paths{StateRoot: t.TempDir()},
		Resync:   20 * time.Millisecond,
		NoPlugin: true,
	}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	pr := addProbe(a)
	ctx, stop := runAgent(t, a)
	defer stop()

	inv := func() *api.NodeInventory {
		nd, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		raw, ok := nd.Annotations[api.AnnotationInventory]
		if !ok {
			return nil
		}
		inv, err := api.DecodeInventory([]byte(raw))
		if err != nil {
			t.Fatalf("published inventory does not decode: %v", err)
		}
		return inv
	}
	// The counter moves after the write returns, so wait for both: the test
	// can read the annotation before the agent has counted its patch.
	eventually(t, "first inventory", func() bool { i := inv(); return i != nil && len(i.GPUs) == 8 && a.Patches() >= 1 })
	i := inv()
	if i.MemoryOvercommit != 1.5 || i.GPUs[0].MaxShares != 4 || i.GPUs[0].Sharing != api.SharingShared || len(i.GPUs[0].Links) != 7 {
		t.Errorf("inventory %+v", i.GPUs[0])
	}

	// Steady state: no further writes, through reconciles that each read
	// the Node and would have written a changed inventory (the resync
	// period is 20 ms).
	p := a.Patches()
	pr.reconciles(t, 3)
	if a.Patches() != p {
		t.Errorf("inventory rewritten without a change: %d -> %d patches", p, a.Patches())
	}

	// Someone removes the annotation: the agent writes it again.
	nd, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(nd.Annotations, api.AnnotationInventory)
	if _, err := client.CoreV1().Nodes().Update(ctx, nd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "inventory restored", func() bool { return inv() != nil })

	// XID 79 on GPU 2: unhealthy at once, healthy again after the period.
	n.Events.Inject(n.Devices[2], nvml.EventTypeXidCriticalError, 79)
	eventually(t, "GPU 2 unhealthy", func() bool {
		g := inv().GPUs[2]
		return g.Health == api.Unhealthy && g.HealthReason == "XID 79"
	})
	eventually(t, "GPU 2 recovered", func() bool { return inv().GPUs[2].Health == api.Healthy })

	// A bad profile is reported and the last good one stays.
	cm.Data["default"] = "sharesPerGPU: 1000"
	if _, err := client.CoreV1().ConfigMaps("tessera-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "config error", func() bool { return a.ConfigError() != "" })
	if got := a.ConfigError(); got != `profile "default": sharesPerGPU 1000 outside [1, 128]` {
		t.Errorf("config error %q", got)
	}
	if inv().GPUs[0].MaxShares != 4 {
		t.Error("bad config applied")
	}

	// The node label picks another profile. (The update also drops the
	// annotation, which the agent writes again.)
	node.Labels = map[string]string{api.LabelNodeConfig: "excl"}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "exclusive profile", func() bool {
		i := inv()
		return i != nil && len(i.GPUs) == 7 && i.GPUs[0].Sharing == api.SharingExclusive && i.GPUs[0].MaxShares == 1 && i.MemoryOvercommit == 1
	})
	if a.ConfigError() != "" {
		t.Errorf("config error %q", a.ConfigError())
	}
}

func TestBuildInventoryExclude(t *testing.T) {
	n := nvmltest.DGXA100()
	a, err := New(n, fake.NewClientset(), Options{NodeName: "x", Resource: "nvidia.com/gpu"}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := api.NodeConfig{ExcludeGPUs: []string{"0", n.Device(5).UUID}}
	cfg.Defaults()
	inv, offer := BuildInventory(a.Devices(), map[string]health.State{n.Device(3).UUID: {Reason: "XID 48"}}, cfg, api.DefaultResourceNames)
	gpus := offer["nvidia.com/gpu"]
	if len(inv.GPUs) != 6 || len(gpus) != 6 {
		t.Fatalf("%d GPUs", len(inv.GPUs))
	}
	if _, err := api.EncodeInventory(inv); err != nil {
		t.Fatal(err)
	}
	// NVML's indices are kept: 0 and 5 are excluded, so the rest keep theirs.
	wantIndex := []int{1, 2, 3, 4, 6, 7}
	for k, g := range inv.GPUs {
		if g.Index != wantIndex[k] || g.UUID == n.Device(0).UUID || g.UUID == n.Device(5).UUID || len(g.Links) != 5 {
			t.Errorf("gpu %d: index %d uuid %s links %d", k, g.Index, g.UUID, len(g.Links))
		}
		if unhealthy := g.UUID == n.Device(3).UUID; unhealthy != (g.Health == api.Unhealthy) || unhealthy == gpus[k].Healthy {
			t.Errorf("gpu %s health %s / plugin %v", g.UUID, g.Health, gpus[k].Healthy)
		}
		if gpus[k].Slots != 10 {
			t.Errorf("slots %d", gpus[k].Slots)
		}
	}
}

// TestMIGInventoryHealth: an XID on a parent GPU makes its MIG devices
// unhealthy in the inventory and in every device plugin's list (NVIDIA's
// plugin long left them healthy, its issue #1929).
func TestMIGInventoryHealth(t *testing.T) {
	n, err := nvmltest.NewModel("A100-40GB", 2, "mig-health")
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(n, fake.NewClientset(), Options{NodeName: "x", Resource: "nvidia.com/gpu"}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	ls, err := config.ParseMIGParted([]byte("version: v1\nmig-configs:\n  all-1g.5gb:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.5gb: 7}\n"))
	if err != nil {
		t.Fatal(err)
	}
	l := ls["all-1g.5gb"]
	cfg := config.Node{NodeConfig: api.NodeConfig{Sharing: api.SharingMIG}, Layout: &l}
	cfg.Defaults()
	mig, _ := part[*parts.MIG](a)
	mig.PrepareDevices(cfg)
	bad := n.Device(1).UUID
	inv, offer := BuildInventory(a.Devices(), map[string]health.State{bad: {Reason: "XID 79"}}, cfg.NodeConfig, api.DefaultResourceNames)
	if _, err := api.EncodeInventory(inv); err != nil {
		t.Fatal(err)
	}
	if inv.MIGStrategy != api.MIGStrategyMixed || len(offer["nvidia.com/mig-1g.5gb"]) != 14 || len(offer["nvidia.com/gpu"]) != 0 {
		t.Fatalf("strategy %s, offer %v", inv.MIGStrategy, offer)
	}
	unhealthy := map[string]bool{}
	for _, g := range inv.GPUs {
		if g.Sharing != api.SharingMIG || g.MaxShares != 7 || len(g.MIG.Devices) != 7 {
			t.Errorf("GPU %s: sharing %s, %d shares, %d devices", g.UUID, g.Sharing, g.MaxShares, len(g.MIG.Devices))
		}
		for _, d := range g.MIG.Devices {
			if (d.Health == api.Unhealthy) != (g.UUID == bad) || g.UUID == bad && d.HealthReason != "XID 79" {
				t.Errorf("MIG device %s of %s: %s %q", d.UUID, g.UUID, d.Health, d.HealthReason)
			}
			unhealthy[d.UUID] = d.Health == api.Unhealthy
		}
	}
	for _, d := range offer["nvidia.com/mig-1g.5gb"] {
		if d.Healthy == unhealthy[d.UUID] {
			t.Errorf("plugin device %s healthy=%v", d.UUID, d.Healthy)
		}
	}
}

// TestDynamicMIGAdoption: after a restart the agent keeps the instances
// the pods' records hold and destroys the others; MIG mode is turned on.
func TestDynamicMIGAdoption(t *testing.T) {
	n, err := nvmltest.NewModel("A100-40GB", 1, "mig-adopt")
	if err != nil {
		t.Fatal(err)
	}
	gpu := n.Device(0).UUID
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"default": "sharing: mig-dynamic\n"}}
	rec := &api.PodAllocation{APIVersion: api.AllocationAPIVersion, Kind: api.AllocationKind, Node: "n1", Containers: []api.ContainerAllocation{{
		Name: "c", Devices: []api.DeviceGrant{{UUID: gpu, MemoryMiB: 19968, Cores: 38, MIG: &api.MIGGrant{Profile: "3g.20gb", Start: 4}}},
	}}}
	pod := fixtures.MakePod().Namespace("default").Name("held").Node("n1").Record(rec).Container("c", map[string]string{"nvidia.com/gpu": "1"}).Obj()
	client := fake.NewClientset(node, cm, pod)
	start := func() (*Agent, func()) {
		a, err := New(n, client, Options{NodeName: "n1", Resource: "nvidia.com/gpu", ConfigMapNamespace: "ns", ConfigMapName: "cm",
			Paths: deviceplugin.Paths{StateRoot: t.TempDir()}, Resync: 20 * time.Millisecond, NoPlugin: true,
			Health: health.Options{WaitTimeout: 5 * time.Millisecond}}, ktesting.NewLogger(t, ktesting.NewConfig()))
		if err != nil {
			t.Fatal(err)
		}
		_, stop := runAgent(t, a)
		return a, stop
	}
	a, stop := start()
	eventually(t, "MIG mode on", func() bool { return len(a.MIGReports()) == 1 && strings.Contains(a.MIGReports()[gpu], "MIG mode") })
	stop()
	// Instances made outside the agent while it was down: the record's and
	// an orphan.
	devs := a.Devices()
	for _, in := range []mig.Instance{{Profile: "3g.20gb", Start: 4}, {Profile: "1g.5gb", Start: 0}} {
		if _, err := migmgr.Create(devs[0].Handle, devs[0].MIG, in); err != nil {
			t.Fatal(err)
		}
	}
	_, stop = start()
	defer stop()
	eventually(t, "the orphan destroyed, the held instance kept", func() bool {
		got := n.MIGInstances(0)
		return len(got) == 1 && got[0] == "3g.20gb@4"
	})
}

// TestMPSDaemonsRestarted: on an MPS node (NVIDIA's MPS guide config) the
// agent runs a control daemon per GPU with the replicas' bound, and starts
// one again when it dies.
func TestMPSDaemonsRestarted(t *testing.T) {
	t.Setenv("TESSERA_FAKE_MPS", "1")
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	n, err := nvmltest.NewModel("A100-40GB", 2, "mps")
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{
		"default": "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n",
	}}
	a, err := New(n, fake.NewClientset(node, cm), Options{NodeName: "n1", Resource: "nvidia.com/gpu", ConfigMapNamespace: "ns", ConfigMapName: "cm",
		Paths: deviceplugin.Paths{StateRoot: t.TempDir()}, Resync: time.Minute, NoPlugin: true,
		Health:     health.Options{WaitTimeout: 5 * time.Millisecond},
		MPSControl: []string{os.Args[0]}, MPSRoot: root}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := part[*parts.MPS](a)
	daemons := m.Manager()
	_, stop := runAgent(t, a)
	defer func() {
		stop()
		_ = daemons.Stop(context.Background())
	}()
	u := n.Device(1).UUID
	eventually(t, "a daemon per GPU", func() bool { return daemons.Starts(n.Device(0).UUID) == 1 && daemons.Starts(u) == 1 })
	pidFile := filepath.Join(daemons.PipeDir(u), "control.pid")
	var pid int
	eventually(t, "the daemon's pid", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(string(b))
		return err == nil && pid > 0
	})
	logf := filepath.Join(daemons.LogDir(u), "control.log")
	eventually(t, "the replicas' bound set", func() bool {
		b, _ := os.ReadFile(logf)
		return strings.Contains(string(b), "Cmd:set_default_active_thread_percentage 10") && strings.Contains(string(b), "Cmd:set_default_device_pinned_mem_limit 0 4096M")
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	poll.Until(t, "the killed daemon started again", 15*time.Second, func() bool { return daemons.Starts(u) >= 2 })
	t.Logf("killed MPS daemon started again after %v", time.Since(start).Round(10*time.Millisecond))
}
