package parts

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/volcano"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// vMIGEnv is a volcano node in Volcano's mig mode: one emulated
// A100-40GB in MIG mode (profile mode volcano, sharing mig-dynamic), the
// vgpu-number device plugin with the agent's checks, the volcano part as
// its protocol and the MIG part making the instances, Volcano's device
// configuration as deploy/volcano ships it, and the agent's pod cache.
type vMIGEnv struct {
	*vEnv
	nvml     *nvmltest.Node
	devices  *Devices
	volcano  *Volcano
	mig      *MIG
	cfg      config.Node
	recorder *record.FakeRecorder
	cluster  Cluster
	ctx      context.Context
}

func newVMIGEnv(t *testing.T) *vMIGEnv {
	n, err := nvmltest.NewModel("A100-40GB", 1, "volcano-mig")
	if err != nil {
		t.Fatal(err)
	}
	res, err := discovery.Discover(n, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict(deploy.VolcanoDeviceConfig, &cm); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	paths := deviceplugin.DefaultPaths()
	paths.StateRoot, paths.PreloadHost = filepath.Join(root, "state"), filepath.Join(root, "preload")
	e := &vMIGEnv{
		vEnv: &vEnv{t: t, client: fake.NewClientset(&cm, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: vNode}}), kubelet: &vKubelet{},
			state: statedir.Dirs{Root: paths.StateRoot}, refused: map[string]string{}},
		nvml: n, devices: NewDevices(res.Devices), recorder: record.NewFakeRecorder(20),
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	e.volcano = NewVolcano(VolcanoOptions{NodeName: vNode, Client: e.client, State: e.state, Devices: e.devices, Handshake: time.Hour, Logger: logger})
	e.mig = e.newMIG(t)
	e.cfg = config.Node{NodeConfig: api.NodeConfig{Mode: api.ModeVolcano, Sharing: api.SharingMIGDynamic, SharesPerGPU: 7}}
	e.cfg.Defaults()
	e.mig.PrepareDevices(e.cfg) // MIG mode on

	factory := informers.NewSharedInformerFactory(e.client, 0)
	e.cluster = Cluster{Pods: factory.Core().V1().Pods().Lister(), Nodes: factory.Core().V1().Nodes().Lister(), Recorder: e.recorder, Poke: func() {}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e.ctx = ctx
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	for _, p := range []Part{e.volcano, e.mig} {
		if err := p.Start(ctx, e.cluster); err != nil {
			t.Fatal(err)
		}
	}
	guard := &deviceplugin.Guard{
		Names:    api.DefaultResourceNames,
		NodePods: func() []*v1.Pod { l, _ := e.cluster.Pods.List(labels.Everything()); return l },
		Refused:  e.noteRefused,
	}
	e.plugin = deviceplugin.New(deviceplugin.Options{
		Resource: api.VolcanoVGPUNumber, Paths: paths, PluginDir: root, Guard: guard,
		Matcher: &deviceplugin.Matcher{Node: vNode, Resource: api.VolcanoVGPUNumber, Kubelet: e.kubelet,
			Pods: PodGetter{Lister: e.cluster.Pods, Client: e.client}, State: e.state, Protocol: e.volcano},
	}, logger)
	e.plugin.SetPolicy(deviceplugin.Policy{MIG: e.mig})
	d := e.devices.List()[0]
	e.gpus = []string{d.GPU.UUID}
	gpu := deviceplugin.GPU{UUID: d.GPU.UUID, Healthy: true, Slots: 7, MemoryMiB: d.GPU.MemoryMiB, MemoryCapMiB: d.GPU.MemoryMiB}
	e.plugin.SetGPUs([]deviceplugin.GPU{gpu}, api.SharingMIGDynamic)
	// What the agent's core tells the parts for this node: the GPU in
	// dynamic MIG, offered as vgpu-number.
	inv := &api.NodeInventory{GPUs: []api.GPU{d.GPU}}
	inv.GPUs[0].Sharing = api.SharingMIGDynamic
	e.volcano.Reconcile(ctx, &Node{Config: e.cfg, Configured: true, Inventory: inv, Offer: Offer{api.VolcanoVGPUNumber: {gpu}}})
	return e
}

func (e *vMIGEnv) newMIG(t *testing.T) *MIG {
	return NewMIG(MIGOptions{NodeName: vNode, Devices: e.devices, Health: func() map[string]health.State { return nil },
		Client: e.client, Protocol: e.volcano.Record, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
}

// pod is a pod of one container asking one vGPU of mem MiB, annotated
// by Volcano with the MIG position pos of the node's GPU.
func (e *vMIGEnv) pod(name, mem, pos string) *v1.Pod {
	ids := e.gpus[0] + pos + ",NVIDIA," + mem + ",0:"
	return vgpuPod(name, vNode, ids, map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: mem})
}

// synced waits until the agent's pod cache shows the pods.
func (e *vMIGEnv) synced(names ...string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range names {
		for {
			if _, err := e.cluster.Pods.Pods("ns").Get(n); err == nil {
				break
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("pod %s not in the agent's cache", n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestVolcanoMIGMode: a GPU in MIG mode on a volcano node is registered
// in Volcano's mig mode; a pod Volcano gave position 0 of group2 (three
// 2g.10gb and one 1g.5gb) for 9000 MiB gets the 2g.10gb instance the
// group starts with, made for it, without the limiter (the instance's
// memory is the hardware's), and its bind phase turns success. Positions
// that overlap what the node serves, name an instance smaller than the
// request, a group Volcano's configuration does not have, or a share of
// the GPU in MIG mode are refused with events. The instance outlives an
// agent restart while its pod lives and is destroyed once it is gone.
func TestVolcanoMIGMode(t *testing.T) {
	e := newVMIGEnv(t)
	gpus, _, _ := Registration(&Node{Inventory: &api.NodeInventory{GPUs: []api.GPU{{UUID: e.gpus[0], Sharing: api.SharingMIGDynamic}}},
		Offer: Offer{api.VolcanoVGPUNumber: {{UUID: e.gpus[0], Healthy: true, Slots: 7}}}})
	if reg := volcano.EncodeRegister(gpus); !strings.HasSuffix(reg, ",true,mig:") {
		t.Errorf("registration %q, want mode mig", reg)
	}

	out, err := e.admit(e.pod("mig-a", "9000", "[group2-0]"))
	if err != nil {
		t.Fatal(err)
	}
	r := out["c0"]
	if got := e.nvml.MIGInstances(0); len(got) != 1 || got[0] != "2g.10gb@0" {
		t.Fatalf("instances %v, want 2g.10gb@0", got)
	}
	dev := r.Envs[api.EnvVisibleDevices]
	if !strings.HasPrefix(dev, "MIG-") {
		t.Errorf("%s=%q, want the MIG device", api.EnvVisibleDevices, dev)
	}
	for _, m := range r.Mounts {
		if m.ContainerPath == limiterconf.Path {
			t.Errorf("a limits file for a MIG instance: %+v", m)
		}
	}
	if got := e.bindPhase("mig-a"); got != api.VolcanoBindSuccess {
		t.Errorf("bind phase %q, want %q", got, api.VolcanoBindSuccess)
	}
	e.synced("mig-a")

	e.expectRefused(e.pod("same", "9000", "[group2-0]"), "overlaps 2g.10gb@0, which this node serves to pod ns/mig-a container c0", true)
	e.expectRefused(e.pod("overlap", "4000", "[group1-1]"), "overlaps 2g.10gb@0", true)
	e.expectRefused(e.pod("small", "9000", "[group1-6]"), "instance 1g.5gb@6 has 4864 MiB, the container asks for 9000 MiB", true)
	e.expectRefused(e.pod("group", "9000", "[group9-0]"), `group "group9" is not one of the groups`, true)
	e.expectRefused(e.pod("past", "9000", "[group2-4]"), "position 4 is past group group2's 4 instances", true)
	e.expectRefused(e.pod("share", "9000", ""), "registered in mode mig", true)
	if _, err := e.admit(e.pod("mig-b", "9000", "[group2-1]")); err != nil {
		t.Fatalf("the next 2g.10gb of group2: %v", err)
	}
	if got := e.nvml.MIGInstances(0); len(got) != 2 || got[1] != "2g.10gb@2" {
		t.Fatalf("instances %v, want 2g.10gb@0 and @2", got)
	}
	e.synced("mig-b")

	// The kubelet failed the refused pods' admission.
	for _, name := range []string{"same", "overlap", "small", "group", "past", "share"} {
		p, err := e.client.CoreV1().Pods("ns").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = v1.PodFailed
		if _, err := e.client.CoreV1().Pods("ns").UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// An agent restart: a MIG part that did not create the instances
	// keeps those Volcano's annotations hold for live pods.
	e.restartMIG()
	if got := e.nvml.MIGInstances(0); len(got) != 2 {
		t.Fatalf("instances after a restart %v, want both kept", got)
	}
	if err := e.client.CoreV1().Pods("ns").Delete(e.ctx, "mig-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.collectUntil("mig-a is gone", "2g.10gb@2")
}

// restartMIG is an agent restart as the MIG part sees it: a part that
// made none of the instances, which collects once.
func (e *vMIGEnv) restartMIG() {
	e.t.Helper()
	e.mig = e.newMIG(e.t)
	if err := e.mig.Start(e.ctx, e.cluster); err != nil {
		e.t.Fatal(err)
	}
	e.mig.PrepareDevices(e.cfg)
}

// collectUntil runs the MIG part's collection until the GPU's instances
// are want (the agent's pod cache may lag the API server).
func (e *vMIGEnv) collectUntil(what string, want ...string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mig.PrepareDevices(e.cfg)
		if got := e.nvml.MIGInstances(0); slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("instances %v once %s, want %v", e.nvml.MIGInstances(0), what, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestVolcanoMIGConfigMissing: a GPU in mig mode whose model Volcano's
// device configuration lists no geometry for (or no configuration) is
// reported on the Node, naming the ConfigMap, and a pod placed there is
// refused naming it too.
func TestVolcanoMIGConfigMissing(t *testing.T) {
	e := newVMIGEnv(t)
	select {
	case ev := <-e.recorder.Events:
		t.Fatalf("an event with the shipped configuration: %s", ev)
	default:
	}
	if err := e.client.CoreV1().ConfigMaps(api.VolcanoDeviceConfigNamespace).Delete(e.ctx, api.VolcanoDeviceConfigName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expireDeviceConfig()
	d := e.devices.List()[0]
	inv := &api.NodeInventory{GPUs: []api.GPU{d.GPU}}
	inv.GPUs[0].Sharing = api.SharingMIGDynamic
	e.volcano.Reconcile(e.ctx, &Node{Config: e.cfg, Configured: true, Inventory: inv,
		Offer: Offer{api.VolcanoVGPUNumber: {{UUID: d.GPU.UUID, Healthy: true, Slots: 7, MemoryMiB: d.GPU.MemoryMiB}}}})
	want := "kube-system/volcano-vgpu-device-config"
	select {
	case ev := <-e.recorder.Events:
		if !strings.Contains(ev, ReasonVolcanoMIGConfig) || !strings.Contains(ev, want) {
			t.Errorf("event %q, want %s naming %s", ev, ReasonVolcanoMIGConfig, want)
		}
	default:
		t.Error("no event on the Node")
	}
	e.expectRefused(e.pod("no-config", "9000", "[group2-0]"), want, true)
	if got := e.nvml.MIGInstances(0); len(got) != 0 {
		t.Errorf("instances %v made for a refused pod", got)
	}
}

// TestVolcanoMIGPositionUnknown: after an agent restart, while Volcano's
// device configuration cannot be read, the agent cannot tell which
// instance a live pod's position names: it keeps the GPU's instances
// rather than destroy those the pods run on. Once the configuration is
// back, the instance of a pod that is gone is destroyed and the live
// pod's kept.
func TestVolcanoMIGPositionUnknown(t *testing.T) {
	e := newVMIGEnv(t)
	for _, p := range []*v1.Pod{e.pod("mig-a", "9000", "[group2-0]"), e.pod("mig-b", "9000", "[group2-1]")} {
		if _, err := e.admit(p); err != nil {
			t.Fatal(err)
		}
	}
	e.synced("mig-a", "mig-b")
	if got := e.nvml.MIGInstances(0); len(got) != 2 {
		t.Fatalf("instances %v, want two", got)
	}
	cms := e.client.CoreV1().ConfigMaps(api.VolcanoDeviceConfigNamespace)
	cm, err := cms.Get(e.ctx, api.VolcanoDeviceConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(e.ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expireDeviceConfig()
	// The restarted agent made neither instance and cannot resolve the
	// pods' positions.
	e.restartMIG()
	if got := e.nvml.MIGInstances(0); len(got) != 2 {
		t.Fatalf("instances %v while the pods' positions cannot be resolved, want both kept", got)
	}

	if err := e.client.CoreV1().Pods("ns").Delete(e.ctx, "mig-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cm.ResourceVersion = ""
	if _, err := cms.Create(e.ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expireDeviceConfig()
	e.collectUntil("mig-b is gone and the configuration is back", "2g.10gb@0")
}

// expireDeviceConfig makes the volcano part read Volcano's device
// configuration again (as once its cache's TTL passed).
func (e *vMIGEnv) expireDeviceConfig() {
	e.volcano.mu.Lock()
	e.volcano.cfgCache = deviceConfigCache{}
	e.volcano.mu.Unlock()
}
