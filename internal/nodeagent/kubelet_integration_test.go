//go:build integration

package nodeagent

// Integration tests against the kubelet's real device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) and the kubelet's real
// pod-resources server, as internal/hollowkubelet wires them, with a real
// kube-apiserver (internal/testenv) and go-nvml's mock DGX A100. The device manager's socket path is fixed at
// /var/lib/kubelet/device-plugins, so TestMain re-executes the test binary
// under `unshare -m` and mounts a tmpfs over /var/lib/kubelet in that
// private mount namespace; the host's directory is never touched.
//
//	go test -tags integration -count=1 ./internal/nodeagent/

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/nodeagent/parts"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/testenv/need"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	mountNSEnv  = "TESSERA_TEST_MOUNTNS"
	kubeletRoot = "/var/lib/kubelet"
	gpuRes      = "nvidia.com/gpu"
)

func TestMain(m *testing.M) {
	fakeMPS() // the test binary is also the fake MPS control daemon
	if os.Getenv(mountNSEnv) == "" {
		if code, ok := need.RootMain("internal/nodeagent (integration)", "its tests run in a private mount namespace, with a tmpfs over /var/lib/kubelet"); !ok {
			os.Exit(code)
		}
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", exe}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), mountNSEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				os.Exit(exit.ExitCode())
			}
			fmt.Fprintf(os.Stderr, "re-running the tests under unshare -m (needs root or CAP_SYS_ADMIN): %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// In the private namespace: a tmpfs over /var/lib/kubelet, or over
	// /var/lib when the host has no /var/lib/kubelet to mount on.
	target := kubeletRoot
	if _, err := os.Stat(kubeletRoot); err != nil {
		target = filepath.Dir(kubeletRoot)
	}
	if err := syscall.Mount("tmpfs", target, "tmpfs", 0, "size=256m"); err != nil {
		fmt.Fprintf(os.Stderr, "mounting a tmpfs on %s: %v\n", target, err)
		os.Exit(1)
	}
	for _, d := range []string{pluginapi.DevicePluginPath, filepath.Dir(deviceplugin.DefaultPodResourcesSocket)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// kubelet is the part of the kubelet that device plugins talk to, from
// the one kubelet emulation (internal/hollowkubelet): the real device
// manager and pod-resources server, driven here one pod at a time as
// HandlePodAdditions does (the pod added to the pod manager first, then
// admitted), so a test can restart the device manager and re-admit pods.
type kubelet struct {
	t      *testing.T
	logger klog.Logger

	sources sources

	mu   sync.Mutex
	cm   *hollowkubelet.ContainerManager
	pods []*v1.Pod // the pod manager's pods (all active here)
}

func startKubelet(t *testing.T) *kubelet {
	k := &kubelet{t: t, logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))}
	k.sources.ready.Store(true)
	k.startDeviceManager()
	srv, err := hollowkubelet.ServePodResources(klog.NewContext(context.Background(), k.logger), deviceplugin.DefaultPodResourcesSocket, k, k.manager())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Stop()
		k.stopDeviceManager()
	})
	return k
}

func (k *kubelet) startDeviceManager() {
	cm, err := hollowkubelet.NewContainerManager()
	if err != nil {
		k.t.Fatal(err)
	}
	if err := cm.StartDeviceManager(k.logger, k.GetActivePods, &k.sources); err != nil {
		k.t.Fatal(err)
	}
	k.mu.Lock()
	k.cm = cm
	k.mu.Unlock()
}

func (k *kubelet) stopDeviceManager() {
	if err := k.manager().StopDeviceManager(k.logger); err != nil {
		k.t.Error(err)
	}
}

// restart is a kubelet restart: a new device manager reading the
// checkpoint and re-creating kubelet.sock, an empty pod manager, and
// sources not ready until the caller has re-admitted the pods.
func (k *kubelet) restart() {
	k.stopDeviceManager()
	k.sources.ready.Store(false)
	k.mu.Lock()
	k.pods = nil
	k.mu.Unlock()
	k.startDeviceManager()
}

func (k *kubelet) manager() *hollowkubelet.ContainerManager {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cm
}

// The pod manager (podresources.PodsProvider).
func (k *kubelet) GetActivePods() []*v1.Pod { return k.GetPods() }
func (k *kubelet) GetPods() []*v1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*v1.Pod(nil), k.pods...)
}
func (k *kubelet) GetPodByName(ns, name string) (*v1.Pod, bool) {
	for _, p := range k.GetPods() {
		if p.Namespace == ns && p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// allocatable returns the healthy device count of the resource.
func (k *kubelet) allocatable() int64 {
	_, alloc, _ := k.manager().GetDevicePluginResourceCapacity()
	q := alloc[gpuRes]
	return q.Value()
}

// admission is what one container got.
type admission struct {
	envs    map[string]string
	mounts  map[string]string // container path -> host path
	devices []string          // the slot IDs the kubelet assigned
}

// admit admits one pod: the pod manager learns it, then the device manager
// allocates its containers in order. A failure rejects the pod (it leaves
// the active pods, as a Failed pod does).
func (k *kubelet) admit(pod *v1.Pod) (map[string]admission, error) {
	if _, known := k.GetPodByName(pod.Namespace, pod.Name); !known {
		k.mu.Lock()
		k.pods = append(k.pods, pod)
		k.mu.Unlock()
	}
	cm := k.manager()
	if err := cm.Admit(pod); err != nil {
		k.reject(pod)
		return nil, err
	}
	out := map[string]admission{}
	all := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		c := &all[i]
		var devices []string
		for _, d := range cm.GetDevices(string(pod.UID), c.Name) {
			if d.ResourceName == gpuRes {
				devices = append(devices, d.DeviceIds...)
			}
		}
		if len(devices) == 0 {
			continue
		}
		opts, err := cm.GetResources(context.Background(), pod, c)
		if err != nil {
			return nil, err
		}
		a := admission{envs: map[string]string{}, mounts: map[string]string{}, devices: devices}
		for _, e := range opts.Envs {
			a.envs[e.Name] = e.Value
		}
		for _, m := range opts.Mounts {
			a.mounts[m.ContainerPath] = m.HostPath
		}
		sort.Strings(a.devices)
		out[c.Name] = a
	}
	return out, nil
}

func (k *kubelet) reject(pod *v1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, p := range k.pods {
		if p.UID == pod.UID {
			k.pods = append(k.pods[:i], k.pods[i+1:]...)
			return
		}
	}
}

// sources is the kubelet's config-source readiness: false from a restart
// until the restarted kubelet has seen every pod again. While it is false
// the device manager keeps checkpointed devices of pods it has not seen.
type sources struct{ ready atomic.Bool }

func (*sources) AddSource(string) {}
func (s *sources) AllReady() bool { return s.ready.Load() }

// runningAgent is a node agent running against the mock NVML.
type runningAgent struct {
	*Agent
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startAgent(t *testing.T, n *nvmltest.Node, client kubernetes.Interface, node, stateRoot string) *runningAgent {
	return startAgentOpts(t, n, client, node, stateRoot, "")
}

// startAgentOpts starts an agent; with a socket directory it serves a
// kubelet shim there instead of registering with the kubelet.
func startAgentOpts(t *testing.T, n *nvmltest.Node, client kubernetes.Interface, node, stateRoot, sockets string) *runningAgent {
	paths := deviceplugin.DefaultPaths()
	paths.StateRoot = stateRoot
	paths.PreloadHost = filepath.Join(filepath.Dir(stateRoot), "ld.so.preload")
	a, err := New(n, client, Options{
		NodeName: node, Resource: gpuRes,
		Health:             health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: 2 * time.Second, WaitTimeout: 10 * time.Millisecond},
		Paths:              paths,
		PluginDir:          pluginapi.DevicePluginPath,
		PodResourcesSocket: deviceplugin.DefaultPodResourcesSocket,
		PluginSocketDir:    sockets,
	}, ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2))).WithName("agent"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{Agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	return r
}

// stop stops the agent; stopping it again does nothing (a test that fails
// between stopping an agent and starting the next leaves the stopped one
// to the cleanup).
func (r *runningAgent) stop(t *testing.T) {
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			t.Error(err)
		}
	})
}

// grantedPod is a pod bound to node holding the grants: one container
// per grant list (an empty list: a container without GPUs), init
// containers first, each asking for as many GPUs as it has grants.
func grantedPod(ns, node, name string, init, app [][]api.DeviceGrant) *v1.Pod {
	p := fixtures.MakePod().Namespace(ns).Name(name).Node(node).RestartPolicy(v1.RestartPolicyNever)
	for i, g := range init {
		p.GPUInitContainer(fmt.Sprintf("init%d", i), g...)
	}
	for i, g := range app {
		p.GPUContainer(fmt.Sprintf("app%d", i), g...)
	}
	return p.Obj()
}

// check verifies that every container got exactly its own grant.
func check(t *testing.T, pod *v1.Pod, got map[string]admission, stateRoot string) {
	t.Helper()
	rec, err := api.DecodeAllocation([]byte(pod.Annotations[api.AnnotationAllocation]))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rec.Containers {
		a, ok := got[c.Name]
		if !ok {
			t.Errorf("%s/%s: no allocation", pod.Name, c.Name)
			continue
		}
		var uuids []string
		for k, d := range c.Devices {
			uuids = append(uuids, d.UUID)
			if want := fmt.Sprintf("%dm", d.MemoryMiB); a.envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", k)] != want {
				t.Errorf("%s/%s device %d: memory limit %q, want %q (envs %v)", pod.Name, c.Name, k, a.envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", k)], want, a.envs)
			}
		}
		if a.envs[api.EnvVisibleDevices] != strings.Join(uuids, ",") {
			t.Errorf("%s/%s: visible devices %q, want %q", pod.Name, c.Name, a.envs[api.EnvVisibleDevices], strings.Join(uuids, ","))
		}
		if want := filepath.Join(stateRoot, string(pod.UID), c.Name, "state"); a.mounts["/tessera/state"] != want {
			t.Errorf("%s/%s: state mount %q, want %q", pod.Name, c.Name, a.mounts["/tessera/state"], want)
		}
		// GetPreferredAllocation steered the kubelet to the recorded GPUs.
		// (App containers of a pod with GPU init containers reuse the init
		// containers' slots first: that is the kubelet's rule.)
		if len(pod.Spec.InitContainers) > 0 {
			continue
		}
		gotGPUs := map[string]bool{}
		for _, id := range a.devices {
			gotGPUs[deviceplugin.SlotGPU(id)] = true
		}
		for _, u := range uuids {
			if !gotGPUs[u] {
				t.Errorf("%s/%s: kubelet slots %v are not on recorded GPU %s", pod.Name, c.Name, a.devices, u)
			}
		}
	}
}

// slots is what the agent offers on the mock DGX A100: 8 GPUs × 10
// shares (the default profile).
const slots = 8 * 10

// deviceNode is one subtest's node: its own Node object and namespace on
// the shared API server, a kubelet (device manager and pod-resources
// server) and a node agent over a fresh mock DGX A100, all stopped when the
// subtest ends. The device manager's directory is fixed, so subtests run
// one after the other.
type deviceNode struct {
	t         *testing.T
	client    kubernetes.Interface
	name      string // the node's name, also the namespace of its pods
	kubelet   *kubelet
	nvml      *nvmltest.Node
	agent     *runningAgent
	stateRoot string
	gpus      []string
}

func newDeviceNode(t *testing.T, client kubernetes.Interface) *deviceNode {
	ctx := context.Background()
	name := "gpu-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()[strings.LastIndex(t.Name(), "/")+1:]))
	if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := &deviceNode{t: t, client: client, name: name, kubelet: startKubelet(t), nvml: nvmltest.DGXA100(),
		stateRoot: filepath.Join(t.TempDir(), "containers")}
	d.agent = startAgent(t, d.nvml, client, name, d.stateRoot)
	t.Cleanup(func() { d.agent.stop(t) })
	for _, dev := range d.agent.Devices() {
		d.gpus = append(d.gpus, dev.GPU.UUID)
	}
	return d
}

// registered waits until the kubelet lists every slot of the agent.
func (d *deviceNode) registered() {
	d.t.Helper()
	testenv.WaitFor(d.t, "the plugin's devices in the device manager", 30*time.Second, func() bool { return d.kubelet.allocatable() == slots })
}

// pod is a pod of this node holding the grants (grantedPod).
func (d *deviceNode) pod(name string, init, app [][]api.DeviceGrant) *v1.Pod {
	return grantedPod(d.name, d.name, name, init, app)
}

// admitted is what the kubelet gave the pods it admitted.
type admitted struct {
	pods    []*v1.Pod
	results map[string]map[string]admission
}

// admitNew creates the pod and admits it; it must be admitted and get
// its record.
func (d *deviceNode) admitNew(into *admitted, p *v1.Pod) {
	d.t.Helper()
	created, err := d.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	got, err := d.kubelet.admit(created)
	if err != nil {
		d.t.Fatalf("admitting %s: %v", p.Name, err)
	}
	check(d.t, created, got, d.stateRoot)
	into.pods = append(into.pods, created)
	into.results[created.Name] = got
}

// admitSome admits a few pods one after the other: shares, an init
// container, a container on two GPUs.
func (d *deviceNode) admitSome() *admitted {
	a := &admitted{results: map[string]map[string]admission{}}
	for i := 0; i < 4; i++ {
		g := func(k int, mem int64) api.DeviceGrant {
			return api.DeviceGrant{UUID: d.gpus[k%7], MemoryMiB: mem, Cores: 5 + i}
		}
		var init [][]api.DeviceGrant
		if i == 1 {
			init = [][]api.DeviceGrant{{g(i+1, 500)}}
		}
		app := [][]api.DeviceGrant{{g(i, int64(1000+i))}}
		if i == 2 {
			app = append(app, nil, []api.DeviceGrant{g(i+2, 300), g(i+3, 300)})
		}
		d.admitNew(a, d.pod(fmt.Sprintf("p%02d", i), init, app))
	}
	return a
}

// readmit admits the pods again (what a kubelet restart does): each
// container must get the same answer, without the plugin being asked
// again.
func (d *deviceNode) readmit(a *admitted) {
	d.t.Helper()
	for _, p := range a.pods {
		got, err := d.kubelet.admit(p)
		if err != nil {
			d.t.Fatalf("re-admitting %s: %v", p.Name, err)
		}
		for c, want := range a.results[p.Name] {
			if fmt.Sprint(got[c].envs) != fmt.Sprint(want.envs) || fmt.Sprint(got[c].devices) != fmt.Sprint(want.devices) {
				d.t.Errorf("%s/%s changed across the restart: %v -> %v", p.Name, c, want, got[c])
			}
		}
	}
}

// TestDeviceManager runs the node agent against the kubelet's real device
// manager. Each subtest has its own node, kubelet, agent and pods, so any
// of them passes alone (-run 'TestDeviceManager/kubelet_restart').
func TestDeviceManager(t *testing.T) {
	client := testenv.StartControlPlane(t).Client
	ctx := context.Background()

	t.Run("registration", func(t *testing.T) {
		d := newDeviceNode(t, client)
		start := time.Now()
		d.registered()
		t.Logf("registered and listed %d slots in %v", slots, time.Since(start))
		testenv.WaitFor(t, "the inventory on the Node", 30*time.Second, func() bool {
			nd, err := client.CoreV1().Nodes().Get(ctx, d.name, metav1.GetOptions{})
			return err == nil && nd.Annotations[api.AnnotationInventory] != ""
		})
	})

	t.Run("unhealthy GPU", func(t *testing.T) {
		d := newDeviceNode(t, client)
		d.registered()
		d.nvml.Events.Inject(d.nvml.Devices[7], nvml.EventTypeXidCriticalError, 79)
		start := time.Now()
		testenv.WaitFor(t, "GPU 7's slots unhealthy", 10*time.Second, func() bool { return d.kubelet.allocatable() == slots-10 })
		t.Logf("XID 79 to Unhealthy in the device manager: %v", time.Since(start))
		testenv.WaitFor(t, "GPU 7 recovered", 30*time.Second, func() bool { return d.kubelet.allocatable() == slots })
		t.Logf("XID 79 to recovered (2s quiet period): %v", time.Since(start))
	})

	// Pods bound to the node at once: 4 writers create them while the
	// kubelet admits them as they appear, in creation order, one at a time.
	t.Run("pods bound at once", func(t *testing.T) {
		d := newDeviceNode(t, client)
		d.registered()
		const count = 24
		var want []*v1.Pod
		for i := 0; i < count; i++ {
			g := func(k int, mem int64) api.DeviceGrant {
				return api.DeviceGrant{UUID: d.gpus[k%7], MemoryMiB: mem, Cores: 5 + i%20}
			}
			var init, app [][]api.DeviceGrant
			app = append(app, []api.DeviceGrant{g(i, int64(1000+i))})
			if i%3 == 0 {
				init = append(init, []api.DeviceGrant{g(i+1, int64(500+i))})
			}
			if i%4 == 0 {
				app = append(app, nil, []api.DeviceGrant{g(i+2, int64(300+i)), g(i+3, int64(300+i))})
			}
			want = append(want, d.pod(fmt.Sprintf("p%02d", i), init, app))
		}
		rogue := d.pod("rogue", nil, [][]api.DeviceGrant{{{UUID: d.gpus[0], MemoryMiB: 1, Cores: 1}}})
		delete(rogue.Annotations, api.AnnotationAllocation) // placed by another scheduler
		want = append(want, rogue)

		work := make(chan *v1.Pod)
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for p := range work {
					if _, err := client.CoreV1().Pods(d.name).Create(ctx, p, metav1.CreateOptions{}); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		go func() {
			for _, p := range want {
				work <- p
			}
			close(work)
		}()
		seen := map[string]bool{}
		admittedPods := 0
		start := time.Now()
		var rogueErr error
		for len(seen) < len(want) && time.Since(start) < 60*time.Second {
			list, err := client.CoreV1().Pods(d.name).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			batch := list.Items
			sort.Slice(batch, func(i, j int) bool { return batch[i].CreationTimestamp.Before(&batch[j].CreationTimestamp) })
			for i := range batch {
				p := &batch[i]
				if seen[p.Name] {
					continue
				}
				seen[p.Name] = true
				got, err := d.kubelet.admit(p)
				if p.Name == "rogue" {
					rogueErr = err
					continue
				}
				if err != nil {
					t.Errorf("admitting %s: %v", p.Name, err)
					continue
				}
				check(t, p, got, d.stateRoot)
				admittedPods++
			}
			time.Sleep(2 * time.Millisecond)
		}
		wg.Wait()
		t.Logf("admitted %d pods bound concurrently in %v", admittedPods, time.Since(start))
		if admittedPods != count {
			t.Errorf("admitted %d pods, want %d", admittedPods, count)
		}
		if want := "pod " + d.name + "/rogue has no tessera.io/allocation annotation"; rogueErr == nil || !strings.Contains(rogueErr.Error(), want) {
			t.Errorf("rogue pod: got %v, want a refusal naming the missing record", rogueErr)
		}
		if _, err := os.Stat(d.stateRoot); err != nil {
			t.Error(err)
		}
	})

	// After a kubelet restart every admitted pod gets the same answer as
	// before, and new pods are admitted.
	t.Run("kubelet restart", func(t *testing.T) {
		d := newDeviceNode(t, client)
		d.registered()
		a := d.admitSome()
		regs := d.agent.Plugin().Registrations()
		start := time.Now()
		d.kubelet.restart()
		testenv.WaitFor(t, "re-registration", 30*time.Second, func() bool {
			return d.agent.Plugin().Registrations() > regs && d.kubelet.allocatable() == slots
		})
		t.Logf("kubelet restart to re-registered: %v", time.Since(start))
		d.readmit(a)
		d.kubelet.sources.ready.Store(true)
		d.admitNew(a, d.pod("after-kubelet-restart", nil, [][]api.DeviceGrant{{{UUID: d.gpus[3], MemoryMiB: 4242, Cores: 42}}}))
	})

	// After an agent restart nothing is served twice, admitted pods keep
	// their answers, and new pods are admitted.
	t.Run("agent restart", func(t *testing.T) {
		d := newDeviceNode(t, client)
		d.registered()
		a := d.admitSome()
		d.agent.stop(t)
		d.agent = startAgent(t, d.nvml, client, d.name, d.stateRoot)
		start := time.Now()
		testenv.WaitFor(t, "the new agent registered", 30*time.Second, func() bool {
			return d.agent.Plugin() != nil && d.agent.Plugin().Registrations() > 0 && d.kubelet.allocatable() == slots
		})
		t.Logf("agent restart to registered: %v", time.Since(start))
		d.readmit(a) // a container restart: the kubelet reuses its answers

		// Every active pod is served, so a stray request is refused.
		_, err := d.agent.Plugin().Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{deviceplugin.SlotID(d.gpus[0], 0)}}}})
		if !errors.Is(err, deviceplugin.ErrNoMatch) {
			t.Errorf("stray Allocate after agent restart: %v", err)
		}
		d.admitNew(a, d.pod("after-agent-restart", nil, [][]api.DeviceGrant{{{UUID: d.gpus[3], MemoryMiB: 4242, Cores: 42}}}))
	})

	// Behind the kubelet shim, an agent restart is invisible to the
	// kubelet: its devices stay healthy, and a pod admitted while the
	// agent is away waits for it and is admitted (without the shim the
	// device manager has no healthy devices then and rejects the pod for
	// good: "no healthy devices present").
	t.Run("agent restart behind the kubelet shim", func(t *testing.T) {
		d := newDeviceNode(t, client)
		d.registered()
		d.agent.stop(t)
		sock := t.TempDir()
		shims := kubeletshim.NewManager(kubeletshim.ManagerOptions{PluginDir: pluginapi.DevicePluginPath, AgentSocketDir: sock, AgentWait: 30 * time.Second},
			ktesting.NewLogger(t, ktesting.NewConfig()).WithName("shim"))
		sctx, stopShim := context.WithCancel(ctx)
		shimDone := make(chan struct{})
		go func() { defer close(shimDone); _ = shims.Run(sctx) }()
		defer func() { stopShim(); <-shimDone }()
		d.agent = startAgentOpts(t, d.nvml, client, d.name, d.stateRoot, sock)
		testenv.WaitFor(t, "the shim registered with the agent's devices", 30*time.Second, func() bool {
			s := shims.Shim(gpuRes)
			return s != nil && s.Registrations() > 0 && d.kubelet.allocatable() == slots
		})
		a := &admitted{results: map[string]map[string]admission{}}
		d.admitNew(a, d.pod("before", nil, [][]api.DeviceGrant{{{UUID: d.gpus[1], MemoryMiB: 1000, Cores: 10}}}))

		d.agent.stop(t)
		p := d.pod("during", nil, [][]api.DeviceGrant{{{UUID: d.gpus[2], MemoryMiB: 2000, Cores: 20}}})
		created, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			got map[string]admission
			err error
		}
		admittedCh := make(chan result, 1)
		start := time.Now()
		shim := shims.Shim(gpuRes)
		regs := shim.Registrations()
		go func() {
			got, err := d.kubelet.admit(created)
			admittedCh <- result{got, err}
		}()
		// The kubelet's call reaching the shim while the agent is away
		// means the device manager still had healthy devices to allocate
		// from (with none it fails the pod before calling the plugin).
		testenv.WaitFor(t, "the kubelet's call waiting in the shim for the agent", 30*time.Second, func() bool {
			select {
			case r := <-admittedCh:
				t.Fatalf("the pod's admission ended while the agent was away: %v", r.err)
			default:
			}
			return shim.Forwarding() > 0
		})
		if n := d.kubelet.allocatable(); n != slots {
			t.Fatalf("the kubelet saw %d healthy slots while the agent was away, want %d", n, slots)
		}
		if n := shim.Registrations(); n != regs {
			t.Fatalf("the shim registered again (%d -> %d) while the agent was away", regs, n)
		}
		d.agent = startAgentOpts(t, d.nvml, client, d.name, d.stateRoot, sock)
		r := <-admittedCh
		if r.err != nil {
			t.Fatalf("a pod admitted while the agent restarted was rejected: %v", r.err)
		}
		t.Logf("admission waited %v for the restarted agent", time.Since(start).Round(time.Millisecond))
		check(t, created, r.got, d.stateRoot)
		d.readmit(a)
	})

	t.Run("state directories of deleted pods are removed", func(t *testing.T) {
		d := newDeviceNode(t, client)
		d.registered()
		a := d.admitSome()
		victim := a.pods[0]
		dir := filepath.Join(d.stateRoot, string(victim.UID))
		if _, err := os.Stat(dir); err != nil {
			t.Fatal(err)
		}
		if err := client.CoreV1().Pods(d.name).Delete(ctx, victim.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(dir, old, old); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "pod informer to drop the pod", 10*time.Second, func() bool {
			_, err := d.agent.pods.Pods(d.name).Get(victim.Name)
			return err != nil
		})
		plugins, _ := part[*parts.Plugins](d.agent.Agent)
		plugins.Resync(ctx)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("state directory of deleted pod still there: %v", err)
		}
		if _, err := os.Stat(filepath.Join(d.stateRoot, string(a.pods[1].UID))); err != nil {
			t.Errorf("state directory of a live pod removed: %v", err)
		}
	})
}
