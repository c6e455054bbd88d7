package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	node = "gpu-node-1"
	res  = "nvidia.com/gpu"
)

func uuid(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }

// fakeKubelet plays the kubelet's pod manager and pod-resources API; fakeAPI
// plays the API server.
type fakeKubelet struct {
	mu   sync.Mutex
	pods []KubeletPod
}

func (k *fakeKubelet) List(context.Context) ([]KubeletPod, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]KubeletPod, len(k.pods))
	for i, p := range k.pods {
		out[i] = KubeletPod{Namespace: p.Namespace, Name: p.Name, Devices: map[string][]string{}}
		for c, d := range p.Devices {
			out[i].Devices[c] = append([]string(nil), d...)
		}
	}
	return out, nil
}

func (k *fakeKubelet) add(p *v1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = append(k.pods, KubeletPod{Namespace: p.Namespace, Name: p.Name, Devices: map[string][]string{}})
}

func (k *fakeKubelet) assign(p *v1.Pod, container string, ids []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, kp := range k.pods {
		if kp.Name == p.Name && kp.Namespace == p.Namespace && !isInit(p, container) {
			kp.Devices[container] = ids
		}
	}
}

type fakeAPI struct {
	mu   sync.Mutex
	pods map[string]*v1.Pod
}

func (a *fakeAPI) GetPod(_ context.Context, ns, name string) (*v1.Pod, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.pods[ns+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(v1.Resource("pods"), name)
	}
	return p, nil
}

func (a *fakeAPI) put(p *v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[p.Namespace+"/"+p.Name] = p
}

type env struct {
	t       *testing.T
	plugin  *Plugin
	kubelet *fakeKubelet
	api     *fakeAPI
	paths   Paths
}

func newEnv(t *testing.T, mode api.SharingMode, shares int) *env {
	root := t.TempDir()
	paths := DefaultPaths()
	paths.StateRoot = filepath.Join(root, "state")
	paths.PreloadHost = filepath.Join(root, "ld.so.preload")
	e := &env{t: t, kubelet: &fakeKubelet{}, api: &fakeAPI{pods: map[string]*v1.Pod{}}, paths: paths}
	m := &Matcher{Node: node, Resource: res, Kubelet: e.kubelet, Pods: e.api, State: statedir.Dirs{Root: paths.StateRoot}}
	e.plugin = New(Options{Resource: res, Matcher: m, Paths: paths, PluginDir: root}, ktesting.NewLogger(t, ktesting.NewConfig()))
	var gpus []GPU
	for i := 0; i < 4; i++ {
		gpus = append(gpus, GPU{UUID: uuid(i), NUMANode: i / 2, Healthy: true, Slots: shares})
	}
	e.plugin.SetGPUs(gpus, mode)
	return e
}

// spec describes a container: name, init, GPU count and the grant.
type spec struct {
	name   string
	init   bool
	grants []api.DeviceGrant
}

func pod(name string, specs ...spec) *v1.Pod {
	b := fixtures.MakePod().Namespace("ns").Name(name).UID("uid-" + name).Node(node)
	for _, s := range specs {
		if s.init {
			b.GPUInitContainer(s.name, s.grants...)
		} else {
			b.GPUContainer(s.name, s.grants...)
		}
	}
	return b.Obj()
}

func share(i int, mem int64, cores int) api.DeviceGrant {
	return api.DeviceGrant{UUID: uuid(i), MemoryMiB: mem, Cores: cores}
}

func whole(i int) api.DeviceGrant {
	return api.DeviceGrant{UUID: uuid(i), MemoryMiB: 40960, Cores: 100, Exclusive: true}
}

// admit does what the kubelet's admission does for one pod: add it to the
// pod manager, then per GPU container (init first) GetPreferredAllocation
// and Allocate, recording the devices. It returns the responses by
// container.
func (e *env) admit(p *v1.Pod) (map[string]*pluginapi.ContainerAllocateResponse, error) {
	ctx := context.Background()
	e.kubelet.add(p)
	out := map[string]*pluginapi.ContainerAllocateResponse{}
	all := append(append([]v1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...)
	for _, c := range all {
		q, ok := c.Resources.Limits[res]
		if !ok {
			continue
		}
		n := int(q.Value())
		devs, _ := e.plugin.devices()
		var avail []string
		for _, d := range devs {
			avail = append(avail, d.ID)
		}
		pref, err := e.plugin.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: avail, AllocationSize: int32(n)}}})
		if err != nil {
			return nil, err
		}
		ids := pref.ContainerResponses[0].DeviceIDs
		if len(ids) != n {
			return nil, fmt.Errorf("preferred %d devices, want %d", len(ids), n)
		}
		resp, err := e.plugin.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
		if err != nil {
			return nil, err
		}
		e.kubelet.assign(p, c.Name, ids)
		out[c.Name] = resp.ContainerResponses[0]
		out[c.Name+"/ids"] = &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"ids": strings.Join(ids, ",")}}
	}
	return out, nil
}

func TestAllocateShared(t *testing.T) {
	e := newEnv(t, api.SharingShared, 10)
	p := pod("a",
		spec{name: "fetch", init: true, grants: []api.DeviceGrant{share(1, 2048, 10)}},
		spec{name: "main", grants: []api.DeviceGrant{share(2, 10240, 30), share(3, 8192, 30)}},
		spec{name: "sidecar"},
		spec{name: "whole", grants: []api.DeviceGrant{whole(0)}},
	)
	e.api.put(p)
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	main := out["main"]
	want := map[string]string{
		api.EnvVisibleDevices:        uuid(2) + "," + uuid(3),
		"CUDA_DEVICE_MEMORY_LIMIT_0": "10240m",
		"CUDA_DEVICE_MEMORY_LIMIT_1": "8192m",
		api.EnvSMLimit:               "30",
		api.EnvSharedCache:           "/tessera/state/cache",
	}
	if fmt.Sprint(main.Envs) != fmt.Sprint(want) {
		t.Errorf("main envs\n got %v\nwant %v", main.Envs, want)
	}
	stateDir := filepath.Join(e.paths.StateRoot, "uid-a", "main", "state")
	limits := filepath.Join(e.paths.StateRoot, "uid-a", "main", "limiter.conf")
	if len(main.Mounts) != 4 || main.Mounts[0].HostPath != e.paths.LimiterHost || !main.Mounts[0].ReadOnly ||
		main.Mounts[1].HostPath != stateDir || main.Mounts[1].ReadOnly ||
		main.Mounts[2].ContainerPath != "/etc/ld.so.preload" || !main.Mounts[2].ReadOnly ||
		main.Mounts[3].ContainerPath != limiterconf.Path || main.Mounts[3].HostPath != limits || !main.Mounts[3].ReadOnly {
		t.Errorf("mounts %v", main.Mounts)
	}
	if fi, err := os.Stat(stateDir); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("state dir: %v %v", fi, err)
	}
	// The limits file holds the record's limits, which the limiter takes
	// over any environment variable.
	b, err := os.ReadFile(limits)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := limiterconf.Parse(b)
	if err != nil || len(cfg.Devices) != 2 || cfg.Devices[0].UUID != uuid(2) || cfg.Devices[0].MemoryMiB != 10240 || cfg.Devices[0].SMPercent != 30 ||
		cfg.Devices[1].MemoryMiB != 8192 || cfg.StatePath != "/tessera/state/cache" {
		t.Errorf("limits file %+v %v:\n%s", cfg, err, b)
	}
	// The kubelet was steered to slots of the recorded GPUs.
	if ids := out["main/ids"].Envs["ids"]; !strings.Contains(ids, uuid(2)+"::") || !strings.Contains(ids, uuid(3)+"::") {
		t.Errorf("main got slots %s", ids)
	}
	if out["fetch"].Envs["CUDA_DEVICE_MEMORY_LIMIT_0"] != "2048m" || out["fetch"].Envs[api.EnvSMLimit] != "10" {
		t.Errorf("init container envs %v", out["fetch"].Envs)
	}
	// Whole GPUs get no limiter.
	if w := out["whole"]; len(w.Envs) != 1 || w.Envs[api.EnvVisibleDevices] != uuid(0) || len(w.Mounts) != 0 {
		t.Errorf("exclusive container %v %v", w.Envs, w.Mounts)
	}
	// A second request after everything is served is refused.
	_, err = e.plugin.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{SlotID(uuid(0), 1)}}}})
	if !errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), "all served") {
		t.Errorf("err %v", err)
	}
}

func TestPerDeviceCores(t *testing.T) {
	r := buildResponse(api.ContainerAllocation{Name: "c", Devices: []api.DeviceGrant{share(0, 100, 20), share(1, 100, 50), share(2, 100, 0)}}, true, containerFiles{StateDir: "/d"}, DefaultPaths(), DeviceListEnvvar)
	if r.Envs[api.EnvSMLimit] != "20" || r.Envs["CUDA_DEVICE_SM_LIMIT_1"] != "50" || r.Envs["CUDA_DEVICE_SM_LIMIT_2"] != "0" {
		t.Errorf("%v", r.Envs)
	}
	r = buildResponse(api.ContainerAllocation{Name: "c", Devices: []api.DeviceGrant{share(0, 100, 0)}}, true, containerFiles{StateDir: "/d"}, DefaultPaths(), DeviceListEnvvar)
	if _, ok := r.Envs[api.EnvSMLimit]; ok {
		t.Errorf("cores 0 set an SM limit: %v", r.Envs)
	}
}

func TestTimeSlicingAndExclusiveModesHaveNoLimiter(t *testing.T) {
	for _, mode := range []api.SharingMode{api.SharingTimeSlicing, api.SharingExclusive} {
		e := newEnv(t, mode, 1)
		p := pod("ts", spec{name: "main", grants: []api.DeviceGrant{share(1, 1000, 10)}})
		e.api.put(p)
		out, err := e.admit(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(out["main"].Envs) != 1 || len(out["main"].Mounts) != 0 {
			t.Errorf("%s: %v", mode, out["main"])
		}
	}
}

func TestFailClosed(t *testing.T) {
	e := newEnv(t, api.SharingShared, 10)
	// Placed by another scheduler: GPU limit, no record.
	rogue := pod("rogue", spec{name: "main"})
	rogue.Spec.Containers[0].Resources.Limits = v1.ResourceList{res: resource.MustParse("1")}
	e.api.put(rogue)
	if _, err := e.admit(rogue); !errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), "pod ns/rogue has no tessera.io/allocation annotation") {
		t.Errorf("rogue: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.paths.StateRoot, "uid-rogue")); !os.IsNotExist(err) {
		t.Errorf("refused pod got a state directory: %v", err)
	}

	other := pod("other", spec{name: "main", grants: []api.DeviceGrant{share(0, 100, 10)}})
	rec, _ := api.DecodeAllocation([]byte(other.Annotations[api.AnnotationAllocation]))
	rec.Node = "elsewhere"
	b, _ := api.EncodeAllocation(rec)
	other.Annotations[api.AnnotationAllocation] = string(b)
	e2 := newEnv(t, api.SharingShared, 10)
	e2.api.put(other)
	if _, err := e2.admit(other); err == nil || !strings.Contains(err.Error(), `allocation record is for node "elsewhere", this is node "gpu-node-1"`) {
		t.Errorf("other node: %v", err)
	}

	e3 := newEnv(t, api.SharingShared, 10)
	bad := pod("bad", spec{name: "main", grants: []api.DeviceGrant{share(0, 100, 10)}})
	bad.Annotations[api.AnnotationAllocation] = `{"apiVersion":"tessera.io/v9"}`
	e3.api.put(bad)
	if _, err := e3.admit(bad); err == nil || !strings.Contains(err.Error(), `version "tessera.io/v9" is not supported`) {
		t.Errorf("bad record: %v", err)
	}

	e4 := newEnv(t, api.SharingShared, 10)
	sick := pod("sick", spec{name: "main", grants: []api.DeviceGrant{share(3, 100, 10)}})
	e4.api.put(sick)
	e4.plugin.SetGPUs([]GPU{{UUID: uuid(0), Healthy: true, Slots: 10}, {UUID: uuid(3), Healthy: false, Slots: 10}}, api.SharingShared)
	if _, err := e4.admit(sick); err == nil || !strings.Contains(err.Error(), "GPU "+uuid(3)+" of its allocation record is unhealthy") {
		t.Errorf("unhealthy: %v", err)
	}

	// The only waiting container asks for another count.
	e6 := newEnv(t, api.SharingShared, 10)
	two := pod("two", spec{name: "main", grants: []api.DeviceGrant{share(0, 100, 10), share(1, 100, 10)}})
	e6.api.put(two)
	e6.kubelet.add(two)
	_, err := e6.plugin.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{SlotID(uuid(0), 0)}}}})
	if err == nil || !strings.Contains(err.Error(), "pod ns/two container main asks for 2 nvidia.com/gpu, the kubelet's request is for 1") {
		t.Errorf("count mismatch: %v", err)
	}

	// A pod re-created under its name while the old one terminates: the
	// kubelet lists the name twice; it is one pod.
	e7 := newEnv(t, api.SharingShared, 10)
	sts := pod("db-0", spec{name: "main", grants: []api.DeviceGrant{share(2, 100, 10)}})
	e7.api.put(sts)
	e7.kubelet.add(sts)
	e7.kubelet.pods[0].Devices["main"] = []string{SlotID(uuid(5), 0)} // the old pod's
	if out, err := e7.admit(sts); err != nil || out["main"].Envs[api.EnvVisibleDevices] != uuid(2) {
		t.Errorf("re-created pod: %v %v", out, err)
	}
	e7b := newEnv(t, api.SharingShared, 10)
	e7b.api.put(sts)
	e7b.kubelet.add(sts)
	if out, err := e7b.admit(sts); err != nil || out["main"].Envs[api.EnvVisibleDevices] != uuid(2) {
		t.Errorf("re-created pod, no devices listed: %v %v", out, err)
	}

	// Two pods waiting at once with the same count: refuse, never guess.
	e5 := newEnv(t, api.SharingShared, 10)
	x := pod("x", spec{name: "main", grants: []api.DeviceGrant{share(0, 100, 10)}})
	y := pod("y", spec{name: "main", grants: []api.DeviceGrant{share(1, 100, 10)}})
	e5.api.put(x)
	e5.api.put(y)
	e5.kubelet.add(y)
	if _, err := e5.admit(x); err == nil || !strings.Contains(err.Error(), "2 pods are waiting (ns/x container main wants 1; ns/y container main wants 1)") {
		t.Errorf("ambiguous: %v", err)
	}
}

// TestManyPodsBoundAtOnce binds many pods to the node at once; the
// kubelet admits them one at a time in an order the agent cannot predict,
// while health changes and ListAndWatch run concurrently. Every container
// must get exactly its own record.
func TestManyPodsBoundAtOnce(t *testing.T) {
	e := newEnv(t, api.SharingShared, 128)
	const n = 60
	var pods []*v1.Pod
	for i := 0; i < n; i++ {
		specs := []spec{{name: "main", grants: []api.DeviceGrant{share(i%4, int64(1000+i), 1+i%50)}}}
		if i%3 == 0 {
			specs = append([]spec{{name: "init", init: true, grants: []api.DeviceGrant{share((i+1)%4, int64(500+i), 5)}}}, specs...)
		}
		if i%5 == 0 {
			specs = append(specs, spec{name: "two", grants: []api.DeviceGrant{share(i%4, 100, 1), share((i+2)%4, 200, 1)}})
		}
		pods = append(pods, pod(fmt.Sprintf("p%02d", i), specs...))
	}
	// All bound "at once": every record is visible before admission starts.
	for _, p := range pods {
		e.api.put(p)
	}
	rand.New(rand.NewSource(7)).Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // health flapping on an unrelated GPU count; ListAndWatch readers
		defer wg.Done()
		for k := 0; ctx.Err() == nil; k++ {
			var gpus []GPU
			for i := 0; i < 4; i++ {
				gpus = append(gpus, GPU{UUID: uuid(i), Healthy: true, Slots: 128 - k%2})
			}
			e.plugin.SetGPUs(gpus, api.SharingShared)
			e.plugin.devices()
			time.Sleep(100 * time.Microsecond)
		}
	}()
	start := time.Now()
	for _, p := range pods {
		out, err := e.admit(p)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		rec, _ := api.DecodeAllocation([]byte(p.Annotations[api.AnnotationAllocation]))
		for _, c := range rec.Containers {
			got := out[c.Name]
			if got == nil {
				t.Fatalf("%s/%s not allocated", p.Name, c.Name)
			}
			for k, d := range c.Devices {
				if got.Envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", k)] != fmt.Sprintf("%dm", d.MemoryMiB) {
					t.Errorf("%s/%s got %v, want %+v", p.Name, c.Name, got.Envs, c.Devices)
				}
			}
			if !strings.Contains(got.Mounts[1].HostPath, string(p.UID)) {
				t.Errorf("%s/%s state dir %s", p.Name, c.Name, got.Mounts[1].HostPath)
			}
		}
	}
	cancel()
	wg.Wait()
	t.Logf("admitted %d pods in %v", n, time.Since(start))
}

func TestListAndWatch(t *testing.T) {
	e := newEnv(t, api.SharingShared, 2)
	devs, changed := e.plugin.devices()
	if len(devs) != 8 || devs[0].Topology.Nodes[0].ID != 0 || devs[7].Topology.Nodes[0].ID != 1 {
		t.Fatalf("devices %v", devs)
	}
	e.plugin.SetGPUs([]GPU{{UUID: uuid(0), NUMANode: -1, Healthy: false, Slots: 2}}, api.SharingShared)
	select {
	case <-changed:
	default:
		t.Fatal("no change signalled")
	}
	devs, changed = e.plugin.devices()
	if len(devs) != 2 || devs[0].Health != pluginapi.Unhealthy || devs[0].Topology != nil {
		t.Errorf("devices %v", devs)
	}
	e.plugin.SetGPUs([]GPU{{UUID: uuid(0), NUMANode: -1, Healthy: false, Slots: 2}}, api.SharingShared)
	select {
	case <-changed:
		t.Error("identical update signalled")
	default:
	}
}

func TestPrefer(t *testing.T) {
	avail := []string{SlotID("B", 1), SlotID("A", 10), SlotID("A", 2), SlotID("B", 0), SlotID("C", 0)}
	got := prefer(avail, []string{SlotID("C", 0)}, 3, []string{"C", "B"})
	if strings.Join(got, " ") != "C::0 B::0 A::2" {
		t.Errorf("got %v", got)
	}
}

func isInit(pod *v1.Pod, name string) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// TestLostAnswerAnsweredAgain: the kubelet is killed after the agent
// answered an app container and before it recorded the answer; the
// restarted kubelet asks for the container again and gets the same answer
// (the fault run found the kubelet rejecting such a pod: "all served").
// An init container's answer is never repeated: the kubelet does not list
// init containers, so a served one is taken as recorded.
func TestLostAnswerAnsweredAgain(t *testing.T) {
	e := newEnv(t, api.SharingShared, 10)
	p := pod("lost", spec{name: "init", init: true, grants: []api.DeviceGrant{share(0, 100, 10)}}, spec{name: "main", grants: []api.DeviceGrant{share(1, 2048, 20)}})
	e.api.put(p)
	e.kubelet.add(p)
	alloc := func() (*pluginapi.ContainerAllocateResponse, error) {
		r, err := e.plugin.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{SlotID(uuid(1), 0)}}}})
		if err != nil {
			return nil, err
		}
		return r.ContainerResponses[0], nil
	}
	if _, err := alloc(); err != nil { // the init container
		t.Fatal(err)
	}
	first, err := alloc() // main: answered, then the kubelet dies
	if err != nil || first.Envs["CUDA_DEVICE_MEMORY_LIMIT_0"] != "2048m" {
		t.Fatalf("main: %v %v", first, err)
	}
	again, err := alloc() // the restarted kubelet asks for main again
	if err != nil {
		t.Fatalf("the repeated request was refused: %v", err)
	}
	if fmt.Sprint(again.Envs) != fmt.Sprint(first.Envs) || fmt.Sprint(again.Mounts) != fmt.Sprint(first.Mounts) {
		t.Errorf("answered differently:\n%v %v\n%v %v", first.Envs, first.Mounts, again.Envs, again.Mounts)
	}
	// Once the kubelet recorded it, nothing is waiting.
	e.kubelet.assign(p, "main", []string{SlotID(uuid(1), 0)})
	if _, err := alloc(); !errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), "all served") {
		t.Errorf("after the kubelet recorded the answer: %v", err)
	}
}

// sendRecorder is a ListAndWatch stream that takes a while to send.
type sendRecorder struct {
	grpc.ServerStream
	ctx   context.Context
	mu    sync.Mutex
	lists [][]*pluginapi.Device
}

func (s *sendRecorder) Context() context.Context { return s.ctx }

func (s *sendRecorder) Send(r *pluginapi.ListAndWatchResponse) error {
	time.Sleep(50 * time.Millisecond)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists = append(s.lists, r.Devices)
	return nil
}

func (s *sendRecorder) last() ([]*pluginapi.Device, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lists) == 0 {
		return nil, 0
	}
	return s.lists[len(s.lists)-1], len(s.lists)
}

// TestWithdraw: a withdrawn resource's open streams have sent the empty
// list when Withdraw returns (a kubelet shim keeps the last list it got).
func TestWithdraw(t *testing.T) {
	e := newEnv(t, api.SharingShared, 2)
	ctx, cancel := context.WithCancel(context.Background())
	s := &sendRecorder{ctx: ctx}
	done := make(chan struct{})
	go func() { defer close(done); _ = e.plugin.ListAndWatch(&pluginapi.Empty{}, s) }()
	defer func() { cancel(); <-done }()
	testenv.WaitFor(t, "the first list sent", 10*time.Second, func() bool { _, n := s.last(); return n > 0 })
	e.plugin.Withdraw(5 * time.Second)
	if devs, n := s.last(); len(devs) != 0 || n != 2 {
		t.Errorf("after Withdraw the stream sent %d lists, the last %v; want the empty list last", n, devs)
	}
}
