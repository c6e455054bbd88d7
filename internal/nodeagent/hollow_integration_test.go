//go:build integration

package nodeagent

// A hollow kubelet (k8s.io/kubernetes/pkg/kubemark) against a real
// kube-apiserver, with a container manager that hands device calls to the
// kubelet's real device manager, a fake CRI runtime, and the node agent on
// go-nvml's mock DGX A100. Pods are created bound to the node; the kubelet's
// own sync loop admits them, calls the plugin, and creates the containers
// with the plugin's environment, which the test reads from the CRI calls.
//
// A hollow kubelet cannot be stopped and owns the device-plugin socket, so
// the test re-runs itself in a child process (with its own mount
// namespace, see TestMain) and the parent checks the child's result.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/status"
	"k8s.io/kubernetes/pkg/kubemark"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const hollowChildEnv = "TESSERA_HOLLOW_CHILD"

func TestHollowKubelet(t *testing.T) {
	if os.Getenv(hollowChildEnv) == "" {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^TestHollowKubelet$", "-test.v", "-test.count=1")
		var env []string
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, mountNSEnv+"=") {
				env = append(env, e)
			}
		}
		cmd.Env = append(env, hollowChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "hollow_integration_test.go") || strings.Contains(l, "Allocate refused") || strings.HasPrefix(strings.TrimSpace(l), "---") {
				t.Log(l)
			}
		}
		if err != nil {
			t.Fatalf("hollow kubelet child: %v\n%s", err, tail(string(out), 60))
		}
		return
	}
	hollowChild(t)
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func hollowChild(t *testing.T) {
	ctx := context.Background()
	cp := testenv.StartControlPlane(t)
	// The hollow kubelet cannot be stopped; cutting its connections before
	// the control plane stops spares the API server's 60 s wait for them.
	dialer := &killableDialer{}
	t.Cleanup(dialer.kill)
	kcfg := rest.CopyConfig(cp.RestConfig)
	kcfg.Dial = dialer.DialContext
	client, err := clientset.NewForConfig(kcfg)
	if err != nil {
		t.Fatal(err)
	}

	endpoint, err := fakeremote.GenerateEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	fakeRuntime := fakeremote.NewFakeRemoteRuntime()
	if err := fakeRuntime.Start(endpoint); err != nil {
		t.Fatal(err)
	}
	rs, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		t.Fatal(err)
	}
	runtime := &recordingRuntime{RuntimeService: rs, fake: fakeRuntime.RuntimeService, created: map[string]*runtimeapi.ContainerConfig{}}

	port, err := freeTCPPort()
	if err != nil {
		t.Fatal(err)
	}
	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{NodeName: nodeName, KubeletPort: port, MaxPods: 110})
	f.RootDirectory = kubeletRoot // the tmpfs of this mount namespace
	c.NodeStatusUpdateFrequency.Duration = time.Second
	c.SyncFrequency.Duration = time.Second
	hk := kubemark.NewHollowKubelet(f, c, client, client, &cadvisortest.Fake{NodeName: nodeName}, fakeRuntime.ImageService, runtime, newGPUContainerManager())
	go hk.Run(ctx)

	n := nvmltest.DGXA100()
	agent := startAgent(t, n, client, t.TempDir()+"/containers")
	t.Cleanup(func() { agent.stop(t) })
	gpus := make([]string, len(agent.Devices()))
	for i, d := range agent.Devices() {
		gpus[i] = d.GPU.UUID
	}

	start := time.Now()
	waitFor(t, "nvidia.com/gpu in the Node's allocatable", 60*time.Second, func() bool {
		nd, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q := nd.Status.Allocatable[gpuRes]
		return q.Value() == 80
	})
	t.Logf("hollow kubelet registered, plugin slots in Node allocatable after %v", time.Since(start))

	// Pods bound to the node at once, written by 8 concurrent clients.
	const count = 16
	var pods []*v1.Pod
	for i := 0; i < count; i++ {
		var init, app [][]api.DeviceGrant
		app = append(app, []api.DeviceGrant{{UUID: gpus[i%8], MemoryMiB: int64(2000 + i), Cores: 10 + i}})
		if i%4 == 0 {
			init = append(init, []api.DeviceGrant{{UUID: gpus[(i+1)%8], MemoryMiB: int64(700 + i), Cores: 5}})
		}
		if i%5 == 0 {
			app = append(app, []api.DeviceGrant{{UUID: gpus[(i+2)%8], MemoryMiB: int64(300 + i), Cores: 7}, {UUID: gpus[(i+3)%8], MemoryMiB: int64(400 + i), Cores: 7}})
		}
		pods = append(pods, gpuPod(fmt.Sprintf("h%02d", i), init, app))
	}
	rogue := gpuPod("rogue", nil, [][]api.DeviceGrant{{{UUID: gpus[0], MemoryMiB: 1, Cores: 1}}})
	delete(rogue.Annotations, api.AnnotationAllocation)
	pods = append(pods, rogue)
	start = time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(pods); i += 8 {
				created, err := client.CoreV1().Pods("default").Create(ctx, pods[i], metav1.CreateOptions{})
				if err != nil {
					t.Error(err)
					continue
				}
				pods[i] = created
			}
		}(w)
	}
	wg.Wait()

	var states []string
	defer func() {
		if t.Failed() {
			t.Logf("pod states: %s", strings.Join(states, "; "))
		}
	}()
	waitFor(t, "every GPU pod running and the rogue pod rejected", 180*time.Second, func() bool {
		list, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		done := 0
		states = states[:0]
		for _, p := range list.Items {
			if p.Name == "rogue" && p.Status.Phase == v1.PodFailed || p.Name != "rogue" && p.Status.Phase == v1.PodRunning {
				done++
			}
			states = append(states, fmt.Sprintf("%s %s %s %s", p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message))
		}
		return done == len(pods)
	})
	t.Logf("%d pods bound at once: all running after %v; last GPU container created after %v", count, time.Since(start), runtime.lastCreate().Sub(start))

	got, err := client.CoreV1().Pods("default").Get(ctx, "rogue", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Reason != "UnexpectedAdmissionError" || !strings.Contains(got.Status.Message, "has no tessera.io/allocation annotation") {
		t.Errorf("rogue pod status %q: %q", got.Status.Reason, got.Status.Message)
	} else {
		t.Logf("rogue pod refused: %s", got.Status.Message)
	}

	for _, p := range pods[:count] {
		rec, err := api.DecodeAllocation([]byte(p.Annotations[api.AnnotationAllocation]))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range rec.Containers {
			cfg := runtime.config(p.Name, c.Name)
			if cfg == nil {
				t.Errorf("%s/%s: never created", p.Name, c.Name)
				continue
			}
			env := map[string]string{}
			for _, e := range cfg.Envs {
				env[e.Key] = string(e.Value)
			}
			var uuids []string
			for k, d := range c.Devices {
				uuids = append(uuids, d.UUID)
				if env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", k)] != fmt.Sprintf("%dm", d.MemoryMiB) {
					t.Errorf("%s/%s: env %v does not carry device %d of %+v", p.Name, c.Name, env, k, c.Devices)
				}
			}
			if env[api.EnvVisibleDevices] != strings.Join(uuids, ",") {
				t.Errorf("%s/%s: %s=%q, want %q", p.Name, c.Name, api.EnvVisibleDevices, env[api.EnvVisibleDevices], strings.Join(uuids, ","))
			}
			mounts := map[string]bool{}
			for _, m := range cfg.Mounts {
				mounts[m.ContainerPath] = true
			}
			if !mounts["/etc/ld.so.preload"] || !mounts["/tessera/state"] {
				t.Errorf("%s/%s: mounts %v", p.Name, c.Name, cfg.Mounts)
			}
		}
	}
}

// killableDialer dials TCP and can close every connection it made and
// refuse new ones.
type killableDialer struct {
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (d *killableDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, fmt.Errorf("test over: not dialing %s", addr)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *killableDialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// recordingRuntime remembers the config of every container created, and
// makes init containers exit successfully once started, so that the
// kubelet goes on to the app containers.
type recordingRuntime struct {
	internalapi.RuntimeService
	fake    *apitest.FakeRuntimeService
	mu      sync.Mutex
	created map[string]*runtimeapi.ContainerConfig // "pod/container"
	last    time.Time                              // of the last CreateContainer
}

func (r *recordingRuntime) StartContainer(ctx context.Context, id string) error {
	if err := r.RuntimeService.StartContainer(ctx, id); err != nil {
		return err
	}
	r.fake.Lock()
	defer r.fake.Unlock()
	if c, ok := r.fake.Containers[id]; ok && strings.HasPrefix(c.Metadata.GetName(), "init") {
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		c.FinishedAt = time.Now().UnixNano()
		c.ExitCode = 0
		c.Reason = "Completed"
	}
	return nil
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, sandbox string, cfg *runtimeapi.ContainerConfig, sb *runtimeapi.PodSandboxConfig) (string, error) {
	r.mu.Lock()
	r.created[sb.GetMetadata().GetName()+"/"+cfg.GetMetadata().GetName()] = cfg
	r.last = time.Now()
	r.mu.Unlock()
	return r.RuntimeService.CreateContainer(ctx, sandbox, cfg, sb)
}

func (r *recordingRuntime) lastCreate() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func (r *recordingRuntime) config(pod, container string) *runtimeapi.ContainerConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.created[pod+"/"+container]
}

// gpuContainerManager is the kubelet's stub container manager with the
// device manager wired in the way the real one does it.
type gpuContainerManager struct {
	cm.ContainerManager
	dm *devicemanager.ManagerImpl
}

func newGPUContainerManager() *gpuContainerManager {
	dm, err := devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
	if err != nil {
		panic(err)
	}
	return &gpuContainerManager{ContainerManager: cm.NewStubContainerManager(), dm: dm}
}

func (g *gpuContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc, getNode cm.GetNodeFunc, sources config.SourcesReady, ps status.PodStatusProvider, rs internalapi.RuntimeService, lsci bool) error {
	if err := g.ContainerManager.Start(ctx, node, activePods, getNode, sources, ps, rs, lsci); err != nil {
		return err
	}
	return g.dm.Start(klog.FromContext(ctx), devicemanager.ActivePodsFunc(activePods), sources, containermap.NewContainerMap(), sets.New[string]())
}

func (g *gpuContainerManager) GetDevicePluginResourceCapacity() (v1.ResourceList, v1.ResourceList, []string) {
	return g.dm.GetCapacity()
}

func (g *gpuContainerManager) GetResources(ctx context.Context, pod *v1.Pod, c *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts := &kubecontainer.RunContainerOptions{}
	dev, err := g.dm.GetDeviceRunContainerOptions(ctx, pod, c)
	if err != nil || dev == nil {
		return opts, err
	}
	opts.Envs, opts.Mounts, opts.Devices = dev.Envs, dev.Mounts, dev.Devices
	return opts, nil
}

func (g *gpuContainerManager) UpdatePluginResources(n *schedulerframework.NodeInfo, a *lifecycle.PodAdmitAttributes) error {
	return g.dm.UpdatePluginResources(n, a)
}

func (g *gpuContainerManager) ShouldResetExtendedResourceCapacity() bool {
	return g.dm.ShouldResetExtendedResourceCapacity()
}

func (g *gpuContainerManager) GetAllocateResourcesPodAdmitHandler() lifecycle.PodAdmitHandler {
	return deviceAdmitHandler{g.dm}
}

func (g *gpuContainerManager) UpdateAllocatedDevices() { g.dm.UpdateAllocatedDevices() }

func (g *gpuContainerManager) GetDevices(podUID, container string) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(g.dm.GetDevices(podUID, container))
}

func (g *gpuContainerManager) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return toContainerDevices(g.dm.GetAllocatableDevices())
}

func (g *gpuContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, s *v1.PodStatus) {
	g.dm.UpdateAllocatedResourcesStatus(pod, s)
}

// deviceAdmitHandler allocates devices container by container, init
// containers first, as the topology manager's admit handler does.
type deviceAdmitHandler struct{ dm *devicemanager.ManagerImpl }

func (h deviceAdmitHandler) Admit(attrs *lifecycle.PodAdmitAttributes) lifecycle.PodAdmitResult {
	pod := attrs.Pod
	all := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		if err := h.dm.Allocate(pod, &all[i]); err != nil {
			return lifecycle.PodAdmitResult{Admit: false, Reason: "UnexpectedAdmissionError", Message: fmt.Sprintf("Allocate failed due to %v, which is unexpected", err)}
		}
	}
	return lifecycle.PodAdmitResult{Admit: true}
}
