package hollowkubelet

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/testenv/need"
	"github.com/tessera-gpu/tessera/internal/testenv/poll"
)

// mountNSEnv marks the test binary re-executed in a private mount
// namespace (inMountNamespace).
const mountNSEnv = "TESSERA_HOLLOWKUBELET_MOUNTNS"

// inMountNamespace runs the calling test again, alone, in a private mount
// namespace with a tmpfs over /var/lib/kubelet (the device manager's
// socket directory is fixed there), and reports its result; it returns
// true in that namespace, where the test is to do its work. It skips the
// test where that needs what the machine does not give (root, unshare).
func inMountNamespace(t *testing.T) bool {
	t.Helper()
	if os.Getenv(mountNSEnv) != "" {
		target := "/var/lib/kubelet"
		if _, err := os.Stat(target); err != nil {
			target = "/var/lib"
		}
		if err := syscall.Mount("tmpfs", target, "tmpfs", 0, "size=64m"); err != nil {
			t.Fatalf("mounting a tmpfs on %s: %v", target, err)
		}
		if err := os.MkdirAll(pluginapi.DevicePluginPath, 0o755); err != nil {
			t.Fatal(err)
		}
		return true
	}
	need.Root(t, "the kubelet's device manager serves the fixed /var/lib/kubelet/device-plugins, mounted over in a private mount namespace")
	unshare := need.Command(t, "unshare", "apt-get install util-linux")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", exe, "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), mountNSEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("the test in a private mount namespace: %v", err)
	}
	return false
}

// sourcesReady is the kubelet's config-source readiness.
type sourcesReady struct{ ready atomic.Bool }

func (*sourcesReady) AddSource(string) {}
func (s *sourcesReady) AllReady() bool { return s.ready.Load() }

// onePlugin is a device plugin with one healthy device.
type onePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (onePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (onePlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: "gpu-0", Health: pluginapi.Healthy}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (onePlugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range r.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

func gpuPod(uid string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: uid, UID: types.UID(uid)},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
		}}}},
	}
}

// TestRestartedKubeletAdmitsRunningPods: a restarted kubelet admits the
// pods whose containers ran on through its restart before the device
// plugin has registered again, as the kubelet's own container manager
// does with the containers it reads from the runtime; a pod bound during
// the restart, with no container yet, still waits for the plugin (the
// kubelet rejects it: the device manager has no healthy device).
func TestRestartedKubeletAdmitsRunningPods(t *testing.T) {
	if !inMountNamespace(t) {
		return
	}
	ctx := klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig()))
	running, bound := gpuPod("running"), gpuPod("bound-during-restart")
	pods := []*v1.Pod{running}
	active := func() []*v1.Pod { return pods }
	getNode := func(context.Context) (*v1.Node, error) { return &v1.Node{}, nil }

	// The kubelet before its restart, with the plugin registered,
	// admits the pod (the device manager checkpoints its device).
	first, err := NewContainerManager()
	if err != nil {
		t.Fatal(err)
	}
	ready := &sourcesReady{}
	ready.ready.Store(true)
	if err := first.Start(ctx, &v1.Node{}, active, getNode, ready, nil, apitest.NewFakeRuntimeService(), false); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(pluginapi.DevicePluginPath, "one.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	plugin := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(plugin, onePlugin{})
	go func() { _ = plugin.Serve(lis) }()
	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "one.sock", ResourceName: "nvidia.com/gpu"})
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the plugin's device allocatable", 10*time.Second, func() bool {
		_, alloc, _ := first.GetDevicePluginResourceCapacity()
		q := alloc["nvidia.com/gpu"]
		return q.Value() == 1
	})
	if err := first.Admit(running); err != nil {
		t.Fatalf("admitting %s before the restart: %v", running.Name, err)
	}
	// The kubelet dies; the plugin is away (it has not registered with
	// the restarted kubelet yet); the pod's container runs on.
	if err := first.StopDeviceManager(klog.FromContext(ctx)); err != nil {
		t.Fatal(err)
	}
	plugin.Stop()

	rs := apitest.NewFakeRuntimeService()
	rs.SetFakeSandboxes([]*apitest.FakePodSandbox{{PodSandboxStatus: runtimeapi.PodSandboxStatus{
		Id: "sandbox-running", State: runtimeapi.PodSandboxState_SANDBOX_READY,
		Metadata: &runtimeapi.PodSandboxMetadata{Name: running.Name, Namespace: running.Namespace, Uid: string(running.UID)},
	}}})
	rs.SetFakeContainers([]*apitest.FakeContainer{{SandboxID: "sandbox-running", ContainerStatus: runtimeapi.ContainerStatus{
		Id: "container-running", State: runtimeapi.ContainerState_CONTAINER_RUNNING,
		Metadata: &runtimeapi.ContainerMetadata{Name: "c"},
	}}})
	restarted, err := NewContainerManager()
	if err != nil {
		t.Fatal(err)
	}
	pods = []*v1.Pod{running, bound}
	if err := restarted.Start(ctx, &v1.Node{}, active, getNode, &sourcesReady{}, nil, rs, false); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = restarted.StopDeviceManager(klog.FromContext(ctx)) }()
	if err := restarted.Admit(running); err != nil {
		t.Errorf("the restarted kubelet rejected %s, whose container runs: %v", running.Name, err)
	}
	if err := restarted.Admit(bound); err == nil || !strings.Contains(err.Error(), "no healthy devices") {
		t.Errorf("admitting %s, with no container, before the plugin registered: %v; want no healthy devices", bound.Name, err)
	}
}

func TestRuntimeContainers(t *testing.T) {
	rs := apitest.NewFakeRuntimeService()
	rs.SetFakeSandboxes([]*apitest.FakePodSandbox{{PodSandboxStatus: runtimeapi.PodSandboxStatus{
		Id: "sb", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid"},
	}}})
	rs.SetFakeContainers([]*apitest.FakeContainer{
		{SandboxID: "sb", ContainerStatus: runtimeapi.ContainerStatus{Id: "up", State: runtimeapi.ContainerState_CONTAINER_RUNNING, Metadata: &runtimeapi.ContainerMetadata{Name: "a"}}},
		{SandboxID: "sb", ContainerStatus: runtimeapi.ContainerStatus{Id: "down", State: runtimeapi.ContainerState_CONTAINER_EXITED, Metadata: &runtimeapi.ContainerMetadata{Name: "b"}}},
		{SandboxID: "gone", ContainerStatus: runtimeapi.ContainerStatus{Id: "orphan", State: runtimeapi.ContainerState_CONTAINER_RUNNING, Metadata: &runtimeapi.ContainerMetadata{Name: "c"}}},
	})
	containers, running := RuntimeContainers(context.Background(), rs)
	if id, err := containers.GetContainerID("uid", "a"); err != nil || id != "up" {
		t.Errorf("container a: %q %v", id, err)
	}
	if id, err := containers.GetContainerID("uid", "b"); err != nil || id != "down" {
		t.Errorf("container b: %q %v", id, err)
	}
	if _, _, err := containers.GetContainerRef("orphan"); err == nil {
		t.Error("a container without a sandbox was mapped")
	}
	if !running.Has("up") || running.Len() != 1 {
		t.Errorf("running %v, want [up]", running.UnsortedList())
	}
	if c, r := RuntimeContainers(context.Background(), nil); c == nil || r == nil || r.Len() != 0 {
		t.Error("no runtime: want empty map and set")
	}
}
