//go:build integration

package nodeagent

// The node agent in mode dra against the kubelet's real DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra) and plugin watcher, as
// internal/hollowkubelet wires them, with a real kube-apiserver and mock
// 80 GB GPUs. Claims are allocated by the scheduler's own structured
// allocator (k8s.io/dynamic-resource-allocation/structured), from the
// ResourceSlice the agent published and the claims allocated before;
// the kubelet prepares them, and the CDI devices it would hand the
// runtime are resolved with the CDI library into each container's
// environment and mounts.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draNode is one subtest's DRA node: a Node and namespace on the shared
// API server, the kubelet's DRA manager with its plugin watcher, and a
// node agent in mode dra over 4 mock H100-80GB.
type draNode struct {
	t       *testing.T
	client  kubernetes.Interface
	name    string
	dir     string
	nvml    *nvmltest.Node
	cm      *hollowkubelet.ContainerManager
	sources sources
	mu      sync.Mutex
	pods    []*v1.Pod // the kubelet's active pods
	agent   *runningAgent
	gpus    []string
}

func (n *draNode) GetActivePods() []*v1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.pods)
}

func (n *draNode) registry() string  { return filepath.Join(n.dir, "plugins_registry") }
func (n *draNode) cdiDir() string    { return filepath.Join(n.dir, "cdi") }
func (n *draNode) claimRoot() string { return filepath.Join(n.dir, "claims") }

func newDRANode(t *testing.T, client kubernetes.Interface) *draNode {
	ctx := context.Background()
	name := "dra-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()[strings.LastIndex(t.Name(), "/")+1:]))
	for _, obj := range []func() error{
		func() error {
			_, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{api.LabelNodeConfig: "dra"}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			return err
		},
	} {
		if err := obj(); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	gpus, err := nvmltest.NewModel("H100-80GB", 4, name)
	if err != nil {
		t.Fatal(err)
	}
	n := &draNode{t: t, client: client, name: name, dir: dir, nvml: gpus}
	n.sources.ready.Store(true)
	n.startKubelet()
	n.startAgent()
	for _, d := range n.agent.Devices() {
		n.gpus = append(n.gpus, d.GPU.UUID)
	}
	testenv.WaitFor(t, "the DRA plugin registered with the kubelet", 30*time.Second, func() bool {
		d := n.agent.DRADriver()
		return d != nil && d.Registered()
	})
	testenv.WaitFor(t, "the node's ResourceSlice", 30*time.Second, func() bool { return len(n.slices()) == 1 })
	return n
}

// startKubelet starts the kubelet's DRA manager (a restart reads its
// checkpoint) and its plugin watcher.
func (n *draNode) startKubelet() {
	logger := ktesting.NewLogger(n.t, ktesting.NewConfig(ktesting.Verbosity(2))).WithName("kubelet")
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	n.t.Cleanup(cancel)
	cm, err := hollowkubelet.NewContainerManager()
	if err != nil {
		n.t.Fatal(err)
	}
	kroot := filepath.Join(n.dir, "kubelet")
	if err := os.MkdirAll(kroot, 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := cm.EnableDRA(logger, n.client, kroot); err != nil {
		n.t.Fatal(err)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	}
	if err := cm.StartDRA(ctx, n.GetActivePods, getNode, &n.sources); err != nil {
		n.t.Fatal(err)
	}
	if err := os.MkdirAll(n.registry(), 0o755); err != nil {
		n.t.Fatal(err)
	}
	cm.RunPluginWatcher(ctx, n.registry(), &n.sources)
	n.cm = cm
}

func (n *draNode) startAgent() {
	paths := deviceplugin.DefaultPaths()
	paths.StateRoot = filepath.Join(n.dir, "containers")
	paths.PreloadHost = filepath.Join(n.dir, "ld.so.preload")
	a, err := New(n.nvml, n.client, Options{
		NodeName: n.name, Resource: gpuRes,
		ConfigMapNamespace: draConfigNS, ConfigMapName: draConfigName,
		Health:             health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: time.Hour, WaitTimeout: 10 * time.Millisecond},
		Paths:              paths,
		PluginDir:          filepath.Join(n.dir, "device-plugins"),
		PodResourcesSocket: filepath.Join(n.dir, "pod-resources.sock"),
		DRA: dra.Options{ClaimRoot: n.claimRoot(), CDIDir: n.cdiDir(), PluginDataDir: filepath.Join(n.dir, "plugins", api.DRADriverName),
			RegistrarDir: n.registry()},
	}, ktesting.NewLogger(n.t, ktesting.NewConfig(ktesting.Verbosity(2))).WithName("agent"))
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{Agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	n.agent = r
	n.t.Cleanup(func() {
		if n.agent == r {
			r.stop(n.t)
		}
	})
}

func (n *draNode) slices() []resourceapi.ResourceSlice {
	list, err := n.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + n.name})
	if err != nil {
		n.t.Fatal(err)
	}
	return list.Items
}

// claim creates a one-request claim of the class asking this capacity.
func (n *draNode) claim(name, class string, count int64, capacity map[string]string, config string) *resourceapi.ResourceClaim {
	n.t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	if len(capacity) > 0 {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			req.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}
	if config != "" {
		c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DRADriverName, Parameters: runtime.RawExtension{Raw: []byte(config)}}}}}
	}
	created, err := n.client.ResourceV1().ResourceClaims(n.name).Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	return created
}

// allocate allocates the claim as kube-scheduler's DynamicResources
// plugin does: the structured allocator over the published slices, with
// every allocated claim's devices and consumed capacity in use.
func (n *draNode) allocate(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	n.t.Helper()
	ctx := context.Background()
	slicesList, err := n.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	var sl []*resourceapi.ResourceSlice
	for i := range slicesList.Items {
		sl = append(sl, &slicesList.Items[i])
	}
	claims, err := n.client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	a, err := structured.NewAllocator(ctx, structured.Features{ConsumableCapacity: true, DeviceTaints: true, PrioritizedList: true, AdminAccess: true},
		state, classes{n.client}, sl, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		n.t.Fatal(err)
	}
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	res, err := a.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
	if err != nil || len(res) != 1 {
		n.t.Fatalf("allocating %s: %v %v", claim.Name, res, err)
	}
	claim = claim.DeepCopy()
	claim.Status.Allocation = &res[0]
	return n.updateStatus(claim)
}

func (n *draNode) updateStatus(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	n.t.Helper()
	out, err := n.client.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

type classes struct{ client kubernetes.Interface }

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	l, err := c.client.ResourceV1().DeviceClasses().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*resourceapi.DeviceClass
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out, nil
}
func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	return c.client.ResourceV1().DeviceClasses().Get(context.Background(), name, metav1.GetOptions{})
}

// pod creates a pod bound to the node whose containers use the claims:
// containers[i] lists the pod claim names container i uses.
func (n *draNode) pod(name string, claims []string, containers ...[]string) *v1.Pod {
	n.t.Helper()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.name}, Spec: v1.PodSpec{NodeName: n.name}}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: c, ResourceClaimName: ptr.To(c)})
	}
	for i, uses := range containers {
		c := v1.Container{Name: fmt.Sprintf("c%d", i), Image: "cuda"}
		for _, u := range uses {
			c.Resources.Claims = append(c.Resources.Claims, v1.ResourceClaim{Name: u})
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	created, err := n.client.CoreV1().Pods(n.name).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	// The scheduler reserves the pod's claims for it.
	for _, c := range claims {
		cl, err := n.client.ResourceV1().ResourceClaims(n.name).Get(context.Background(), c, metav1.GetOptions{})
		if err != nil {
			n.t.Fatal(err)
		}
		cl.Status.ReservedFor = append(cl.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: created.Name, UID: created.UID})
		n.updateStatus(cl)
	}
	return created
}

// container is what the runtime would create: the environment and mounts
// of the container's CDI devices, resolved with the CDI library.
type container struct {
	cdi    []string
	env    map[string]string
	mounts map[string]string // container path -> host path (" (ro)" marks read-only)
}

// start is the kubelet starting the pod: prepare its claims, then each
// container's CDI devices.
func (n *draNode) start(p *v1.Pod) (map[string]container, error) {
	n.mu.Lock()
	n.pods = append(n.pods, p)
	n.mu.Unlock()
	if err := n.cm.PrepareDynamicResources(context.Background(), p); err != nil {
		return nil, err
	}
	out := map[string]container{}
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		opts, err := n.cm.GetResources(context.Background(), p, c)
		if err != nil {
			return nil, err
		}
		ct := container{mounts: map[string]string{}}
		for _, d := range opts.CDIDevices {
			ct.cdi = append(ct.cdi, d.Name)
		}
		edits, err := hollowkubelet.ResolveCDI([]string{n.cdiDir()}, ct.cdi)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", c.Name, err)
		}
		ct.env = edits.Env
		for _, m := range edits.Mounts {
			v := m.HostPath
			if m.ReadOnly {
				v += " (ro)"
			}
			ct.mounts[m.ContainerPath] = v
		}
		out[c.Name] = ct
	}
	return out, nil
}

// stop is the kubelet once the pod is gone: it leaves the active pods and
// its claims are unprepared.
func (n *draNode) stop(p *v1.Pod) {
	n.t.Helper()
	n.mu.Lock()
	n.pods = slices.DeleteFunc(n.pods, func(q *v1.Pod) bool { return q.UID == p.UID })
	n.mu.Unlock()
	if err := n.cm.UnprepareDynamicResources(context.Background(), p); err != nil {
		n.t.Fatalf("unpreparing %s: %v", p.Name, err)
	}
}

func limits(t *testing.T, c container) limiterconf.Config {
	t.Helper()
	path, ro := strings.CutSuffix(c.mounts[limiterconf.Path], " (ro)")
	if !ro {
		t.Fatalf("limits file not mounted read-only: %v", c.mounts)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := limiterconf.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return conf
}

// leftovers lists the CDI specs and claim directories on the node.
func (n *draNode) leftovers() []string {
	var out []string
	for _, dir := range []string{n.cdiDir(), n.claimRoot()} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Name() != "checkpoint.json" {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

const (
	draConfigNS   = "tessera-system"
	draConfigName = "tessera-node-agent"
)

func setupDRA(t *testing.T) kubernetes.Interface {
	client := testenv.StartControlPlane(t).Client
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: draConfigNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps(draConfigNS).Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: draConfigName},
		Data: map[string]string{"default": "sharing: shared\n", "dra": "mode: dra\nsharing: shared\nsharesPerGPU: 10\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := dra.ApplyManifests(ctx, client, deploy.DRADeviceClasses, deploy.DRACompatDeviceClasses, deploy.DRAAdmission); err != nil {
		t.Fatal(err)
	}
	return client
}

// TestDRAManager runs the node agent in mode dra against the kubelet's
// real DRA manager. Each subtest has its own node, kubelet and agent, so
// any of them passes alone (-run 'TestDRAManager/agent_restart').
func TestDRAManager(t *testing.T) {
	client := setupDRA(t)
	ctx := context.Background()

	// The slice: one device per GPU, consumable memory and cores; no
	// device plugin and the inventory in mode dra.
	t.Run("slice", func(t *testing.T) {
		n := newDRANode(t, client)
		s := n.slices()[0]
		if s.Spec.Driver != api.DRADriverName || len(s.Spec.Devices) != 4 || s.Spec.Pool.Name != n.name {
			t.Fatalf("slice %+v", s.Spec)
		}
		d := s.Spec.Devices[0]
		mem := d.Capacity[api.CapacityMemory]
		if !ptr.Deref(d.AllowMultipleAllocations, false) || mem.Value.String() != "80Gi" || mem.RequestPolicy == nil || *d.Attributes[api.AttrUUID].StringValue != n.gpus[0] {
			t.Errorf("device %+v", d)
		}
		if len(n.agent.Resources()) != 0 {
			t.Errorf("device plugins run for %v on a node in mode dra", n.agent.Resources())
		}
		testenv.WaitFor(t, "the inventory in mode dra", 30*time.Second, func() bool {
			node, err := client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			inv, err := api.DecodeInventory([]byte(node.Annotations[api.AnnotationInventory]))
			return err == nil && inv.Mode == api.ModeDRA && len(inv.GPUs) == 4
		})
	})

	// Four claims of 20Gi + 25 % share one GPU, a fifth goes to another;
	// each container's limiter settings equal its claim.
	t.Run("shares", func(t *testing.T) {
		n := newDRANode(t, client)
		var pods []*v1.Pod
		for i := range 5 {
			name := fmt.Sprintf("share%d", i)
			n.allocate(n.claim(name, api.DeviceClassGPU, 1, map[string]string{"memory": "20Gi", "cores": "25"}, ""))
			p := n.pod(name, []string{name}, []string{name})
			got, err := n.start(p)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			want := n.gpus[0]
			if i == 4 {
				want = n.gpus[1]
			}
			c := got["c0"]
			if c.env[api.EnvVisibleDevices] != want {
				t.Errorf("%s: %s=%q, want %s", name, api.EnvVisibleDevices, c.env[api.EnvVisibleDevices], want)
			}
			conf := limits(t, c)
			if len(conf.Devices) != 1 || conf.Devices[0].UUID != want || conf.Devices[0].MemoryMiB != 20480 || conf.Devices[0].SMPercent != 25 {
				t.Errorf("%s: limits %+v", name, conf)
			}
			pods = append(pods, p)
		}
		for _, p := range pods {
			n.stop(p)
		}
		if l := n.leftovers(); len(l) > 0 {
			t.Errorf("left behind: %v", l)
		}
	})

	// One claim used by two containers of a pod and by a second pod: one
	// GPU, one limits file, one state directory.
	t.Run("shared claim", func(t *testing.T) {
		n := newDRANode(t, client)
		n.allocate(n.claim("shared", api.DeviceClassNVIDIA, 1, map[string]string{"memory": "10Gi", "cores": "30"}, ""))
		p1 := n.pod("p1", []string{"shared"}, []string{"shared"}, []string{"shared"})
		p2 := n.pod("p2", []string{"shared"}, []string{"shared"})
		a, err := n.start(p1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := n.start(p2)
		if err != nil {
			t.Fatal(err)
		}
		all := []container{a["c0"], a["c1"], b["c0"]}
		for i, c := range all {
			if c.env[api.EnvVisibleDevices] != all[0].env[api.EnvVisibleDevices] || c.mounts[limiterconf.Path] != all[0].mounts[limiterconf.Path] ||
				c.mounts["/tessera/state"] != all[0].mounts["/tessera/state"] || c.env[api.EnvVisibleDevices] == "" {
				t.Errorf("container %d differs: %+v vs %+v", i, c, all[0])
			}
		}
		n.stop(p1)
		if l := n.leftovers(); len(l) == 0 {
			t.Error("the claim was unprepared while p2 still uses it")
		}
		n.stop(p2)
		if l := n.leftovers(); len(l) > 0 {
			t.Errorf("left behind: %v", l)
		}
	})

	// The agent killed while pods run: the kubelet sees the plugin come
	// back, the claims stay prepared, and deleting the pods unprepares
	// them through the new agent, leaving nothing.
	t.Run("agent restart", func(t *testing.T) {
		n := newDRANode(t, client)
		var pods []*v1.Pod
		first := map[string]container{}
		for i := range 3 {
			name := fmt.Sprintf("r%d", i)
			n.allocate(n.claim(name, api.DeviceClassGPU, 1, map[string]string{"memory": "8Gi", "cores": "20"}, ""))
			p := n.pod(name, []string{name}, []string{name})
			got, err := n.start(p)
			if err != nil {
				t.Fatal(err)
			}
			first[name] = got["c0"]
			pods = append(pods, p)
		}
		old := n.agent
		old.stop(t)
		start := time.Now()
		n.startAgent()
		testenv.WaitFor(t, "the restarted agent registered", 30*time.Second, func() bool {
			d := n.agent.DRADriver()
			return d != nil && d.Registered()
		})
		t.Logf("agent restart to registered: %v", time.Since(start))
		if got := len(n.agent.DRADriver().Prepared()); got != 3 {
			t.Fatalf("the restarted agent knows %d prepared claims, want 3", got)
		}
		// A pod started again (a kubelet that restarts its containers)
		// gets the same devices and files.
		again, err := n.start(pods[0])
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(again["c0"]) != fmt.Sprint(first["r0"]) {
			t.Errorf("after the restart: %+v, before %+v", again["c0"], first["r0"])
		}
		for _, p := range pods {
			n.stop(p)
		}
		if l := n.leftovers(); len(l) > 0 {
			t.Errorf("left behind: %v", l)
		}
	})

	// Prepare is the node's last word: an over-committed GPU (a scheduler
	// that does not track capacity) and a malformed opaque configuration
	// are refused with an event, and nothing is left.
	t.Run("refusals", func(t *testing.T) {
		n := newDRANode(t, client)
		big := n.allocate(n.claim("big", api.DeviceClassGPU, 1, map[string]string{"memory": "60Gi", "cores": "50"}, ""))
		p := n.pod("big", []string{"big"}, []string{"big"})
		if _, err := n.start(p); err != nil {
			t.Fatal(err)
		}
		forged := n.claim("forged", api.DeviceClassGPU, 1, map[string]string{"memory": "30Gi"}, "")
		forged.Status.Allocation = big.Status.Allocation.DeepCopy()
		forged.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("0dd7bcb5-6f00-4a0d-bd7c-6c0e5f2b5a11"))
		forged.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory] = resource.MustParse("30Gi")
		n.updateStatus(forged)
		_, err := n.start(n.pod("forged", []string{"forged"}, []string{"forged"}))
		if err == nil || !strings.Contains(err.Error(), "memory 30720 MiB allocated to this claim and 61440 MiB to claims "+n.name+"/big exceed its 81920 MiB") {
			t.Errorf("over-committed GPU: %v", err)
		}
		n.allocate(n.claim("badcfg", api.DeviceClassGPU, 1, map[string]string{"memory": "1Gi"}, `{"apiVersion":"gpu.tessera.io/v1alpha1","kind":"GPUConfig","elastic":"yes"}`))
		_, err = n.start(n.pod("badcfg", []string{"badcfg"}, []string{"badcfg"}))
		if err == nil || !strings.Contains(err.Error(), "spec.devices.config[0].opaque.parameters.elastic: string is not a bool") {
			t.Errorf("malformed config: %v", err)
		}
		for _, claim := range []string{"forged", "badcfg"} {
			testenv.WaitFor(t, "a Warning event on claim "+claim, 10*time.Second, func() bool {
				ev, err := client.CoreV1().Events(n.name).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + claim + ",reason=" + dra.ReasonPrepareFailed})
				return err == nil && len(ev.Items) > 0 && ev.Items[0].Type == v1.EventTypeWarning
			})
		}
		if got := len(n.agent.DRADriver().Prepared()); got != 1 {
			t.Errorf("%d claims prepared, want 1 (big)", got)
		}
		n.stop(p)
		if l := n.leftovers(); len(l) > 0 {
			t.Errorf("left behind: %v", l)
		}
	})

	// The shipped admission policy refuses a request that asks cores
	// without memory (it would hold the GPU's whole memory) and one that
	// asks the never-consumed mirror gpu.nvidia.com/memory, in claims and
	// templates, prioritized lists included; it admits memory + cores.
	t.Run("admission", func(t *testing.T) {
		const ns = "dra-admission"
		if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		exact := func(caps ...string) resourceapi.DeviceRequest {
			r := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: api.DeviceClassNVIDIA,
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}}}
			for _, c := range caps {
				r.Exactly.Capacity.Requests[resourceapi.QualifiedName(c)] = resource.MustParse("25")
			}
			return r
		}
		spec := func(reqs ...resourceapi.DeviceRequest) resourceapi.ResourceClaimSpec {
			return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
		}
		claim := func(name string, s resourceapi.ResourceClaimSpec) error {
			_, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: s}, metav1.CreateOptions{})
			return err
		}
		// The policy takes effect once the API server has compiled it.
		testenv.WaitFor(t, "the admission policy in effect", 30*time.Second, func() bool {
			err := claim("probe", spec(exact("cores")))
			if err == nil {
				_ = client.ResourceV1().ResourceClaims(ns).Delete(ctx, "probe", metav1.DeleteOptions{})
			}
			return err != nil
		})
		if err := claim("cores-only", spec(exact("cores"))); err == nil || !strings.Contains(err.Error(), "request gpu of a Tessera GPU class asks capacity cores without memory") {
			t.Errorf("cores only: %v", err)
		}
		if err := claim("mirror", spec(exact("memory", "gpu.nvidia.com/memory"))); err == nil || !strings.Contains(err.Error(), "request gpu asks capacity gpu.nvidia.com/memory") {
			t.Errorf("mirror: %v", err)
		}
		prio := resourceapi.DeviceRequest{Name: "any", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "big", DeviceClassName: api.DeviceClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"cores": resource.MustParse("50")}}},
		}}
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "prio"}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec(prio)}}
		if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "request any/big of a Tessera GPU class asks capacity cores without memory") {
			t.Errorf("template, prioritized list: %v", err)
		}
		if err := claim("ok", spec(exact("memory", "cores"))); err != nil {
			t.Errorf("memory and cores refused: %v", err)
		}
	})

	// An unhealthy GPU stays in the slice with a NoSchedule taint.
	t.Run("unhealthy GPU", func(t *testing.T) {
		n := newDRANode(t, client)
		n.nvml.Events.Inject(n.nvml.Devices[2], nvml.EventTypeXidCriticalError, 79)
		testenv.WaitFor(t, "gpu-2 tainted in the slice", 10*time.Second, func() bool {
			s := n.slices()
			if len(s) != 1 || len(s[0].Spec.Devices) != 4 {
				return false
			}
			d := s[0].Spec.Devices[2]
			return len(d.Taints) == 1 && d.Taints[0].Key == api.TaintUnhealthy && d.Taints[0].Value == "XID-79" && d.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule
		})
	})
}
