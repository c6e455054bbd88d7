package kubeletshim

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/testenv/poll"
)

// fakeKubelet is the kubelet's registration service on dir/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	mu   sync.Mutex
	regs []*pluginapi.RegisterRequest
	srv  *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.regs = append(k.regs, r)
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.regs)
}

// start serves kubelet.sock in dir, first removing every socket there as
// a starting kubelet does.
func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	t.Cleanup(k.srv.Stop)
	return k
}

// fakeAgent is the node agent's plugin.
type fakeAgent struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	calls   int
	mu      sync.Mutex
}

func (a *fakeAgent) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: a.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (a *fakeAgent) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	a.mu.Lock()
	a.calls++
	a.mu.Unlock()
	return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{Envs: map[string]string{"DEVS": strings.Join(r.ContainerRequests[0].DevicesIds, ",")}}}}, nil
}

func startAgent(t *testing.T, sock string) *grpc.Server {
	t.Helper()
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &fakeAgent{devices: []*pluginapi.Device{{ID: "GPU-1::0", Health: pluginapi.Healthy}, {ID: "GPU-1::1", Health: pluginapi.Healthy}}})
	go func() { _ = srv.Serve(lis) }()
	return srv
}

// TestShimOutlivesTheAgent: the kubelet's connection stays up and healthy
// while the agent restarts; an Allocate arriving meanwhile waits for the
// agent and succeeds; one whose agent stays away fails after AgentWait
// with a message saying so; a restarted kubelet is re-registered through
// the inotify watch long before the periodic check would notice.
func TestShimOutlivesTheAgent(t *testing.T) {
	dir := t.TempDir()
	agentSock := filepath.Join(t.TempDir(), "agent.sock")
	kubelet := startKubelet(t, dir)
	agent := startAgent(t, agentSock)
	shim := runShim(t, dir, agentSock, 1500*time.Millisecond)
	ctx := t.Context()
	poll.Until(t, "registration", 5*time.Second, func() bool { return kubelet.count() == 1 })

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "shim.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || len(first.Devices) != 2 {
		t.Fatalf("first list %v %v", first, err)
	}
	alloc := func() (*pluginapi.AllocateResponse, error) {
		return client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-1::0"}}}})
	}
	if r, err := alloc(); err != nil || r.ContainerResponses[0].Envs["DEVS"] != "GPU-1::0" {
		t.Fatalf("allocate through the shim: %v %v", r, err)
	}

	// The agent dies; an Allocate arrives and waits in the shim; the agent
	// comes back.
	agent.Stop()
	got := make(chan error, 1)
	start := time.Now()
	go func() { _, err := alloc(); got <- err }()
	poll.Until(t, "the Allocate waiting in the shim", 5*time.Second, func() bool { return shim.Forwarding() == 1 })
	agent = startAgent(t, agentSock)
	if err := <-got; err != nil {
		t.Fatalf("an Allocate during the agent's restart failed: %v", err)
	}
	if n := shim.Forwarding(); n != 0 {
		t.Errorf("%d calls still counted as forwarded after the answer", n)
	}
	t.Logf("Allocate waited %v for the restarted agent", time.Since(start).Round(time.Millisecond))
	// The kubelet's stream never broke and never saw an unhealthy device.
	recv := make(chan *pluginapi.ListAndWatchResponse, 10)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				close(recv)
				return
			}
			recv <- r
		}
	}()

	// The agent stays away: the call fails after AgentWait, naming why.
	agent.Stop()
	start = time.Now()
	_, err = alloc()
	if err == nil || !strings.Contains(err.Error(), "did not answer within 2s") || time.Since(start) < 2*time.Second {
		t.Errorf("agent away: %v after %v", err, time.Since(start))
	}
	// Past StaleAfter the kubelet is told the GPUs are unhealthy.
	poll.Until(t, "the devices reported unhealthy", 5*time.Second, func() bool {
		select {
		case r, ok := <-recv:
			return ok && len(r.Devices) == 2 && r.Devices[0].Health == pluginapi.Unhealthy
		default:
			return false
		}
	})
	agent = startAgent(t, agentSock)
	defer agent.Stop()
	poll.Until(t, "the devices healthy again", 5*time.Second, func() bool {
		select {
		case r, ok := <-recv:
			return ok && len(r.Devices) == 2 && r.Devices[0].Health == pluginapi.Healthy
		default:
			return false
		}
	})

	// The kubelet restarts: sockets removed, kubelet.sock re-created. The
	// periodic check is an hour away; the watch re-registers at once.
	kubelet.srv.Stop()
	start = time.Now()
	kubelet = startKubelet(t, dir)
	poll.Until(t, "re-registration after the kubelet restart", 2*time.Second, func() bool { return kubelet.count() == 1 })
	t.Logf("re-registered %v after the kubelet restarted", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(dir, "shim.sock")); err != nil {
		t.Errorf("the shim's socket was not served again: %v", err)
	}
}

// TestShimRegistersAgainWhenDropped: the kubelet's device manager can
// drop a plugin's current connection while its socket stays (it
// disconnects the resource's current client when an older client's
// stream ends); the shim then registers again, and only then.
func TestShimRegistersAgainWhenDropped(t *testing.T) {
	dir := t.TempDir()
	agentSock := filepath.Join(t.TempDir(), "agent.sock")
	kubelet := startKubelet(t, dir)
	agent := startAgent(t, agentSock)
	defer agent.Stop()
	runShim(t, dir, agentSock, 0)
	poll.Until(t, "registration", 5*time.Second, func() bool { return kubelet.count() == 1 })
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "shim.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The kubelet's stream: while it is open, nothing happens.
	sctx, drop := context.WithCancel(t.Context())
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(dropGrace + 500*time.Millisecond)
	if n := kubelet.count(); n != 1 {
		t.Fatalf("%d registrations with the kubelet's stream open", n)
	}
	// The kubelet drops it.
	drop()
	start := time.Now()
	poll.Until(t, "registration after the kubelet dropped the plugin", dropGrace+5*time.Second, func() bool { return kubelet.count() == 2 })
	t.Logf("registered again %v after the kubelet dropped the stream", time.Since(start).Round(time.Millisecond))
}

// dialingKubelet answers Register as the kubelet's device manager does:
// it dials the plugin's endpoint, retrying, for as long as the call lasts
// (the kubelet's blocking gRPC dial), and answers once connected. The
// first call finds the endpoint removed first, as when the shim served
// its socket just before a starting kubelet cleaned the directory.
type dialingKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir       string
	calls     atomic.Int32
	connected atomic.Int32
}

func (k *dialingKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	sock := filepath.Join(k.dir, r.Endpoint)
	if k.calls.Add(1) == 1 {
		_ = os.Remove(sock)
	}
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			k.connected.Add(1)
			return &pluginapi.Empty{}, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestShimRegistersAgainWhenItsSocketGoesMidRegistration: a starting
// kubelet that removes the shim's socket while the shim registers would
// dial the missing endpoint until Register's 10 s timeout, leaving the
// node without GPUs for the pods it admits meanwhile; the shim gives the
// call up as soon as its socket is gone and registers a fresh one.
func TestShimRegistersAgainWhenItsSocketGoesMidRegistration(t *testing.T) {
	dir := t.TempDir()
	agentSock := filepath.Join(t.TempDir(), "agent.sock")
	agent := startAgent(t, agentSock)
	defer agent.Stop()
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	kubelet := &dialingKubelet{dir: dir}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, kubelet)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	start := time.Now()
	runShim(t, dir, agentSock, 0)
	poll.Until(t, "the kubelet connected to the shim's socket", 3*time.Second, func() bool { return kubelet.connected.Load() == 1 })
	t.Logf("registered %v after the first attempt's socket was removed (%d Register calls)", time.Since(start).Round(time.Millisecond), kubelet.calls.Load())
	if _, err := os.Stat(filepath.Join(dir, "shim.sock")); err != nil {
		t.Errorf("the shim's socket: %v", err)
	}
}

// runShim runs a shim for the kubelet in dir and the agent at agentSock
// until the test ends (staleAfter 0: the default).
func runShim(t *testing.T, dir, agentSock string, staleAfter time.Duration) *Shim {
	t.Helper()
	s, err := New(Options{Resource: "nvidia.com/gpu", PluginDir: dir, Endpoint: "shim.sock", AgentSocket: agentSock,
		AgentWait: 2 * time.Second, StaleAfter: staleAfter, CheckInterval: time.Hour}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}
