//go:build integration

package nodeagent

// Integration tests against the kubelet's real device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) and the kubelet's real
// pod-resources server, with a real kube-apiserver (internal/testenv) and
// go-nvml's mock DGX A100. The device manager's socket path is fixed at
// /var/lib/kubelet/device-plugins, so TestMain re-executes the test binary
// under `unshare -m` and mounts a tmpfs over /var/lib/kubelet in that
// private mount namespace; the host's directory is never touched.
//
//	go test -tags integration -count=1 ./internal/nodeagent/

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	mountNSEnv  = "TESSERA_TEST_MOUNTNS"
	kubeletRoot = "/var/lib/kubelet"
	gpuRes      = "nvidia.com/gpu"
	nodeName    = "gpu-node-1"
	shares      = 4
)

func TestMain(m *testing.M) {
	if os.Getenv(mountNSEnv) == "" {
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

// kubelet is the part of the kubelet that device plugins talk to: the
// real device manager and pod-resources server, and an admission loop
// that calls the device manager the way HandlePodAdditions does (one pod
// at a time, added to the pod manager first, init containers first).
type kubelet struct {
	t      *testing.T
	logger klog.Logger

	sources sources

	mu   sync.Mutex
	mgr  *devicemanager.ManagerImpl
	pods []*v1.Pod // the pod manager's pods (all active here)

	prServer *grpc.Server
}

func startKubelet(t *testing.T) *kubelet {
	k := &kubelet{t: t, logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))}
	k.sources.ready.Store(true)
	k.startDeviceManager()
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(context.Background(), podresources.PodResourcesProviders{
		Pods: k, Devices: devicesAdapter{k}, Cpus: noCPUs{}, Memory: noMemory{}, DynamicResources: noDRA{},
	}))
	_ = os.Remove(deviceplugin.DefaultPodResourcesSocket)
	lis, err := net.Listen("unix", deviceplugin.DefaultPodResourcesSocket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	k.prServer = srv
	t.Cleanup(func() {
		srv.Stop()
		k.stopDeviceManager()
	})
	return k
}

func (k *kubelet) startDeviceManager() {
	mgr, err := devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
	if err != nil {
		k.t.Fatal(err)
	}
	if err := mgr.Start(k.logger, k.GetActivePods, &k.sources, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		k.t.Fatal(err)
	}
	k.mu.Lock()
	k.mgr = mgr
	k.mu.Unlock()
}

func (k *kubelet) stopDeviceManager() {
	if err := k.manager().Stop(k.logger); err != nil {
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

func (k *kubelet) manager() *devicemanager.ManagerImpl {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.mgr
}

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
	_, alloc, _ := k.manager().GetCapacity()
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
	mgr := k.manager()
	all := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		if err := mgr.Allocate(pod, &all[i]); err != nil {
			k.reject(pod)
			return nil, err
		}
	}
	out := map[string]admission{}
	for i := range all {
		c := &all[i]
		opts, err := mgr.GetDeviceRunContainerOptions(context.Background(), pod, c)
		if err != nil {
			return nil, err
		}
		if opts == nil {
			continue
		}
		a := admission{envs: map[string]string{}, mounts: map[string]string{}}
		for _, e := range opts.Envs {
			a.envs[e.Name] = e.Value
		}
		for _, m := range opts.Mounts {
			a.mounts[m.ContainerPath] = m.HostPath
		}
		for id := range mgr.GetDevices(string(pod.UID), c.Name)[gpuRes] {
			a.devices = append(a.devices, id)
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

// devicesAdapter is the container manager's translation from the device
// manager to the pod-resources API.
type devicesAdapter struct{ k *kubelet }

func (d devicesAdapter) UpdateAllocatedDevices() { d.k.manager().UpdateAllocatedDevices() }
func (d devicesAdapter) GetDevices(podUID, container string) []*podresourcesapi.ContainerDevices {
	return hollowkubelet.ContainerDevices(d.k.manager().GetDevices(podUID, container))
}
func (d devicesAdapter) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return hollowkubelet.ContainerDevices(d.k.manager().GetAllocatableDevices())
}

type noCPUs struct{}

func (noCPUs) GetCPUs(string, string) []int64 { return nil }
func (noCPUs) GetAllocatableCPUs() []int64    { return nil }

type noMemory struct{}

func (noMemory) GetMemory(string, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory() []*podresourcesapi.ContainerMemory    { return nil }

type noDRA struct{}

func (noDRA) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// runningAgent is a node agent running against the mock NVML.
type runningAgent struct {
	*Agent
	cancel context.CancelFunc
	done   chan error
}

func startAgent(t *testing.T, n *nvmltest.Node, client kubernetes.Interface, stateRoot string) *runningAgent {
	paths := deviceplugin.DefaultPaths()
	paths.StateRoot = stateRoot
	paths.PreloadHost = filepath.Join(filepath.Dir(stateRoot), "ld.so.preload")
	a, err := New(n, client, Options{
		NodeName: nodeName, Resource: gpuRes,
		Health:             health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: 2 * time.Second, WaitTimeout: 10 * time.Millisecond},
		Paths:              paths,
		PluginDir:          pluginapi.DevicePluginPath,
		PodResourcesSocket: deviceplugin.DefaultPodResourcesSocket,
	}, ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2))).WithName("agent"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{Agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	return r
}

func (r *runningAgent) stop(t *testing.T) {
	r.cancel()
	if err := <-r.done; err != nil {
		t.Error(err)
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out after %v waiting for %s", timeout, what)
}

// gpuPod builds a pod bound to the node with its allocation record: one
// container per grant list, init containers first.
func gpuPod(name string, init [][]api.DeviceGrant, app [][]api.DeviceGrant) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{}},
		Spec:       v1.PodSpec{NodeName: nodeName, RestartPolicy: v1.RestartPolicyNever},
	}
	rec := &api.PodAllocation{Node: nodeName}
	mk := func(prefix string, i int, g []api.DeviceGrant, isInit bool) v1.Container {
		c := v1.Container{Name: fmt.Sprintf("%s%d", prefix, i), Image: "example.invalid/cuda:12", ImagePullPolicy: v1.PullIfNotPresent}
		if len(g) > 0 {
			q := *resource.NewQuantity(int64(len(g)), resource.DecimalSI)
			c.Resources.Limits = v1.ResourceList{gpuRes: q}
			c.Resources.Requests = v1.ResourceList{gpuRes: q}
			rec.Containers = append(rec.Containers, api.ContainerAllocation{Name: c.Name, Init: isInit, Devices: g})
		}
		return c
	}
	for i, g := range init {
		p.Spec.InitContainers = append(p.Spec.InitContainers, mk("init", i, g, true))
	}
	for i, g := range app {
		p.Spec.Containers = append(p.Spec.Containers, mk("app", i, g, false))
	}
	if len(rec.Containers) > 0 {
		b, err := api.EncodeAllocation(rec)
		if err != nil {
			panic(err)
		}
		p.Annotations[api.AnnotationAllocation] = string(b)
	}
	return p
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
		if want := filepath.Join(stateRoot, string(pod.UID), c.Name); a.mounts["/tessera/state"] != want {
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

func TestDeviceManager(t *testing.T) {
	ctx := context.Background()
	cp := testenv.StartControlPlane(t)
	client := cp.Client
	if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kl := startKubelet(t)
	n := nvmltest.DGXA100()
	stateRoot := filepath.Join(t.TempDir(), "containers")
	agent := startAgent(t, n, client, stateRoot)
	defer func() { agent.stop(t) }()

	gpus := make([]string, len(agent.Devices()))
	for i, d := range agent.Devices() {
		gpus[i] = d.GPU.UUID
	}
	const slots = 8 * 10 // default profile: 10 shares per GPU

	t.Run("registration", func(t *testing.T) {
		start := time.Now()
		waitFor(t, "the plugin's devices in the device manager", 30*time.Second, func() bool { return kl.allocatable() == slots })
		t.Logf("registered and listed %d slots in %v", slots, time.Since(start))
		waitFor(t, "the inventory on the Node", 30*time.Second, func() bool {
			nd, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
			return err == nil && nd.Annotations[api.AnnotationInventory] != ""
		})
	})

	t.Run("unhealthy GPU", func(t *testing.T) {
		n.Events.Inject(n.Devices[7], nvml.EventTypeXidCriticalError, 79)
		start := time.Now()
		waitFor(t, "GPU 7's slots unhealthy", 10*time.Second, func() bool { return kl.allocatable() == slots-10 })
		t.Logf("XID 79 to Unhealthy in the device manager: %v", time.Since(start))
		waitFor(t, "GPU 7 recovered", 30*time.Second, func() bool { return kl.allocatable() == slots })
		t.Logf("XID 79 to recovered (2s quiet period): %v", time.Since(start))
	})

	// Pods bound to the node at once: 4 writers create them while the
	// kubelet admits them as they appear, in creation order, one at a time.
	var admitted []*v1.Pod
	results := map[string]map[string]admission{}
	t.Run("pods bound at once", func(t *testing.T) {
		const count = 24
		var want []*v1.Pod
		for i := 0; i < count; i++ {
			g := func(k int, mem int64) api.DeviceGrant {
				return api.DeviceGrant{UUID: gpus[k%7], MemoryMiB: mem, Cores: 5 + i%20}
			}
			var init, app [][]api.DeviceGrant
			app = append(app, []api.DeviceGrant{g(i, int64(1000+i))})
			if i%3 == 0 {
				init = append(init, []api.DeviceGrant{g(i+1, int64(500+i))})
			}
			if i%4 == 0 {
				app = append(app, nil, []api.DeviceGrant{g(i+2, int64(300+i)), g(i+3, int64(200+i))})
			}
			want = append(want, gpuPod(fmt.Sprintf("p%02d", i), init, app))
		}
		rogue := gpuPod("rogue", nil, [][]api.DeviceGrant{{{UUID: gpus[0], MemoryMiB: 1, Cores: 1}}})
		delete(rogue.Annotations, api.AnnotationAllocation) // placed by another scheduler
		want = append(want, rogue)

		work := make(chan *v1.Pod)
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for p := range work {
					if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
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
		start := time.Now()
		var rogueErr error
		for len(seen) < len(want) && time.Since(start) < 60*time.Second {
			list, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
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
				got, err := kl.admit(p)
				if p.Name == "rogue" {
					rogueErr = err
					continue
				}
				if err != nil {
					t.Errorf("admitting %s: %v", p.Name, err)
					continue
				}
				check(t, p, got, stateRoot)
				admitted = append(admitted, p)
				results[p.Name] = got
			}
			time.Sleep(2 * time.Millisecond)
		}
		wg.Wait()
		t.Logf("admitted %d pods bound concurrently in %v", len(admitted), time.Since(start))
		if len(admitted) != count {
			t.Errorf("admitted %d pods, want %d", len(admitted), count)
		}
		if rogueErr == nil || !strings.Contains(rogueErr.Error(), "pod default/rogue has no tessera.io/allocation annotation") {
			t.Errorf("rogue pod: got %v, want a refusal naming the missing record", rogueErr)
		}
		if _, err := os.Stat(filepath.Join(stateRoot)); err != nil {
			t.Error(err)
		}
	})

	// Re-admitting admitted pods (what a kubelet restart does) must give
	// each container the same answer without calling the plugin again.
	readmit := func(t *testing.T) {
		for _, p := range admitted {
			got, err := kl.admit(p)
			if err != nil {
				t.Fatalf("re-admitting %s: %v", p.Name, err)
			}
			for c, a := range results[p.Name] {
				if fmt.Sprint(got[c].envs) != fmt.Sprint(a.envs) || fmt.Sprint(got[c].devices) != fmt.Sprint(a.devices) {
					t.Errorf("%s/%s changed across the restart: %v -> %v", p.Name, c, a, got[c])
				}
			}
		}
	}
	newPod := func(t *testing.T, name string) {
		p := gpuPod(name, nil, [][]api.DeviceGrant{{{UUID: gpus[3], MemoryMiB: 4242, Cores: 42}}})
		created, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := kl.admit(created)
		if err != nil {
			t.Fatalf("admitting %s: %v", name, err)
		}
		check(t, created, got, stateRoot)
		admitted = append(admitted, created)
		results[name] = got
	}

	t.Run("kubelet restart", func(t *testing.T) {
		regs := agent.Plugin().Registrations()
		start := time.Now()
		kl.restart()
		waitFor(t, "re-registration", 30*time.Second, func() bool { return agent.Plugin().Registrations() > regs && kl.allocatable() == slots })
		t.Logf("kubelet restart to re-registered: %v", time.Since(start))
		readmit(t)
		kl.sources.ready.Store(true)
		newPod(t, "after-kubelet-restart")
	})

	t.Run("agent restart", func(t *testing.T) {
		agent.stop(t)
		agent = startAgent(t, n, client, stateRoot)
		start := time.Now()
		waitFor(t, "the new agent registered", 30*time.Second, func() bool {
			return agent.Plugin() != nil && agent.Plugin().Registrations() > 0 && kl.allocatable() == slots
		})
		t.Logf("agent restart to registered: %v", time.Since(start))
		readmit(t) // a container restart: the kubelet reuses its answers

		// Nothing is served twice: every active pod is served, so a stray
		// request is refused.
		_, err := agent.Plugin().Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{deviceplugin.SlotID(gpus[0], 0)}}}})
		if !errors.Is(err, deviceplugin.ErrNoMatch) {
			t.Errorf("stray Allocate after agent restart: %v", err)
		}
		newPod(t, "after-agent-restart")
	})

	t.Run("state directories of deleted pods are removed", func(t *testing.T) {
		victim := admitted[0]
		dir := filepath.Join(stateRoot, string(victim.UID))
		if _, err := os.Stat(dir); err != nil {
			t.Fatal(err)
		}
		if err := client.CoreV1().Pods("default").Delete(ctx, victim.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(dir, old, old); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "pod informer to drop the pod", 10*time.Second, func() bool {
			_, err := agent.pods.Pods("default").Get(victim.Name)
			return err != nil
		})
		agent.collect()
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("state directory of deleted pod still there: %v", err)
		}
		if _, err := os.Stat(filepath.Join(stateRoot, string(admitted[1].UID))); err != nil {
			t.Errorf("state directory of a live pod removed: %v", err)
		}
	})
}
