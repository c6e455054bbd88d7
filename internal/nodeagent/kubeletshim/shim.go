// Package kubeletshim is the kubelet-facing end of Tessera's device
// plugin: a small process that registers the GPU resource with the
// kubelet, holds the socket the kubelet talks to, and forwards every call
// to the node agent's plugin on a socket of its own. It has no state, no
// Kubernetes client and no NVML, so it has no reason to restart when the
// agent does (an upgrade, a crash, a SIGKILL).
//
// Why: the kubelet's device manager marks every device of a resource
// unhealthy the moment its plugin's connection drops, and then rejects
// every pod bound to the node ("no healthy devices present",
// UnexpectedAdmissionError) until a plugin registers again; a rejected pod
// is never retried. With the shim in front, the kubelet's connection
// outlives the agent: the shim keeps reporting the last device list, and a
// call that arrives while the agent is away waits (bounded by AgentWait)
// until it is back. If the agent stays away longer than StaleAfter, the
// shim reports the devices unhealthy, so the node stops taking GPU pods.
//
// The shim also notices a kubelet restart at once (an inotify watch on the
// device-plugin directory: the kubelet re-creates kubelet.sock and removes
// plugin sockets), serves a fresh socket and registers again, with a
// periodic check as a fallback.
package kubeletshim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Options configure a Shim.
type Options struct {
	// Resource is the extended resource registered ("nvidia.com/gpu").
	Resource string
	// PluginDir is the kubelet's device-plugin directory (kubelet.sock).
	PluginDir string
	// Endpoint is the shim's socket file name in PluginDir.
	Endpoint string
	// AgentSocket is the node agent's plugin socket.
	AgentSocket string
	// AgentWait bounds how long a kubelet call waits for the agent to be
	// reachable (default 60s). The kubelet admits one pod at a time, so a
	// waiting Allocate holds up the node's admissions for at most this.
	AgentWait time.Duration
	// StaleAfter is how long the agent may be away before the devices
	// are reported unhealthy (default 2m; negative: never).
	StaleAfter time.Duration
	// CheckInterval is the fallback period of the kubelet-restart check
	// (default 1s).
	CheckInterval time.Duration
}

// Shim serves the kubelet for the agent.
type Shim struct {
	pluginapi.UnimplementedDevicePluginServer
	opts   Options
	logger klog.Logger
	agent  pluginapi.DevicePluginClient
	conn   *grpc.ClientConn

	mu        sync.Mutex
	devices   []*pluginapi.Device // the agent's last list
	have      bool                // a list was received
	connected bool                // the agent's stream is up
	lostAt    time.Time           // when it went down
	changed   chan struct{}
	streams   int           // the kubelet's open ListAndWatch streams
	dropped   chan struct{} // the kubelet closed them all (ServeRegistered)
	calls     int           // the kubelet's calls being forwarded

	registrations int
}

// New prepares a shim; Run serves it.
func New(opts Options, logger klog.Logger) (*Shim, error) {
	if opts.AgentWait <= 0 {
		opts.AgentWait = time.Minute
	}
	if opts.StaleAfter == 0 {
		opts.StaleAfter = 2 * time.Minute
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = time.Second
	}
	if opts.Endpoint == "" {
		opts.Endpoint = EndpointName(opts.Resource)
	}
	// Reconnect to a restarted agent within tens of milliseconds, not
	// gRPC's default of a second growing to two minutes.
	conn, err := grpc.NewClient("unix://"+opts.AgentSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.5, Jitter: 0.1, MaxDelay: 250 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return nil, err
	}
	return &Shim{opts: opts, logger: logger, agent: pluginapi.NewDevicePluginClient(conn), conn: conn, changed: make(chan struct{}), dropped: make(chan struct{}, 1)}, nil
}

// Registrations is how many times the shim registered with the kubelet.
func (s *Shim) Registrations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registrations
}

// Forwarding is how many of the kubelet's calls the shim is forwarding
// to the agent now, those waiting for it to come back included.
func (s *Shim) Forwarding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Run follows the agent's device list and serves the kubelet until ctx
// ends.
func (s *Shim) Run(ctx context.Context) error {
	defer s.conn.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(2)
	go func() { defer wg.Done(); s.follow(ctx) }()
	go func() { defer wg.Done(); s.staleness(ctx) }()
	ServeRegistered(ctx, s.logger, s.opts.PluginDir, s.opts.Endpoint, s.opts.CheckInterval, s.dropped, s.register, func(srv *grpc.Server) {
		pluginapi.RegisterDevicePluginServer(srv, s)
	})
	return nil
}

func (s *Shim) register(ctx context.Context, kubeletSock string) error {
	err := Register(ctx, kubeletSock, s.opts.Endpoint, s.opts.Resource)
	if err == nil {
		s.mu.Lock()
		s.registrations++
		s.mu.Unlock()
		s.logger.Info("Registered with the kubelet", "resource", s.opts.Resource, "endpoint", s.opts.Endpoint, "agent", s.opts.AgentSocket)
	}
	return err
}

// follow keeps a ListAndWatch stream open to the agent and records every
// list it sends.
func (s *Shim) follow(ctx context.Context) {
	for ctx.Err() == nil {
		stream, err := s.agent.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
		if err == nil {
			for {
				resp, err := stream.Recv()
				if err != nil {
					break
				}
				s.update(resp.Devices, true)
			}
		}
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		if s.connected {
			s.connected, s.lostAt = false, time.Now()
			s.logger.Info("Lost the node agent's device list; keeping the last one for the kubelet while it comes back", "agent", s.opts.AgentSocket)
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *Shim) update(devs []*pluginapi.Device, connected bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if connected && !s.connected && s.have {
		s.logger.Info("The node agent is back", "awayFor", time.Since(s.lostAt).Round(time.Millisecond))
	}
	s.devices, s.have, s.connected = devs, true, connected
	close(s.changed)
	s.changed = make(chan struct{})
}

// staleness marks the devices unhealthy once the agent has been away for
// StaleAfter.
func (s *Shim) staleness(ctx context.Context) {
	if s.opts.StaleAfter < 0 {
		return
	}
	t := time.NewTicker(max(s.opts.StaleAfter/10, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		stale := s.have && !s.connected && time.Since(s.lostAt) > s.opts.StaleAfter && anyHealthy(s.devices)
		s.mu.Unlock()
		if !stale {
			continue
		}
		s.logger.Error(nil, "The node agent has been away too long; reporting its GPUs unhealthy", "away", s.opts.StaleAfter)
		s.mu.Lock()
		var devs []*pluginapi.Device
		for _, d := range s.devices {
			devs = append(devs, &pluginapi.Device{ID: d.ID, Health: pluginapi.Unhealthy, Topology: d.Topology})
		}
		s.mu.Unlock()
		s.update(devs, false)
	}
}

func anyHealthy(devs []*pluginapi.Device) bool {
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			return true
		}
	}
	return false
}

// GetDevicePluginOptions implements the device plugin API.
func (s *Shim) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the agent's last device list and every change. It
// waits for the agent's first list (bounded by AgentWait) so the kubelet
// never sees an empty one from a shim that just started.
func (s *Shim) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	defer s.streamEnded()
	deadline := time.After(s.opts.AgentWait)
	for {
		s.mu.Lock()
		devs, have, changed := s.devices, s.have, s.changed
		s.mu.Unlock()
		if have {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
		}
		select {
		case <-changed:
		case <-deadline:
			if !have {
				if err := stream.Send(&pluginapi.ListAndWatchResponse{}); err != nil {
					return err
				}
			}
		case <-stream.Context().Done():
			return nil
		}
	}
}

// dropGrace is how long the shim waits, once the kubelet has closed its
// last ListAndWatch stream, for the kubelet to open another (it does at
// once after a registration) before it registers again.
const dropGrace = 2 * time.Second

// streamEnded notes a closed stream; with none left after dropGrace the
// kubelet has dropped the plugin (its device manager disconnects a
// resource's current client when an older one's stream ends, so a
// plugin registered twice in quick succession can be left with none).
func (s *Shim) streamEnded() {
	s.mu.Lock()
	s.streams--
	last := s.streams == 0
	s.mu.Unlock()
	if !last {
		return
	}
	time.AfterFunc(dropGrace, func() {
		s.mu.Lock()
		none := s.streams == 0
		s.mu.Unlock()
		if none {
			select {
			case s.dropped <- struct{}{}:
			default:
			}
		}
	})
}

// forward calls the agent, waiting for it to be reachable for up to
// AgentWait. The agent's own answers, refusals included, pass unchanged.
func forward[Req, Resp any](ctx context.Context, s *Shim, call func(context.Context, *Req, ...grpc.CallOption) (*Resp, error), req *Req) (*Resp, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.calls--
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, s.opts.AgentWait)
	defer cancel()
	for {
		resp, err := call(ctx, req, grpc.WaitForReady(true))
		if err == nil || ctx.Err() == nil && status.Code(err) != codes.Unavailable {
			return resp, err
		}
		if ctx.Err() != nil {
			return nil, status.Errorf(codes.Unavailable, "the Tessera node agent (%s) did not answer within %v: %v", s.opts.AgentSocket, s.opts.AgentWait, err)
		}
		// Unavailable: the agent went away in the middle of the call.
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// GetPreferredAllocation forwards to the agent.
func (s *Shim) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return forward(ctx, s, s.agent.GetPreferredAllocation, req)
}

// Allocate forwards to the agent.
func (s *Shim) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return forward(ctx, s, s.agent.Allocate, req)
}

// PreStartContainer forwards to the agent.
func (s *Shim) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return forward(ctx, s, s.agent.PreStartContainer, req)
}

// Register registers endpoint (a socket name in kubeletSock's directory)
// for resource with the kubelet.
func Register(ctx context.Context, kubeletSock, endpoint, resource string) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet: %w", resource, err)
	}
	return nil
}

// ServeRegistered serves a device plugin on endpoint in dir and keeps it
// registered with the kubelet until ctx ends: whenever the kubelet
// restarts (it re-creates kubelet.sock and removes the plugin sockets),
// it serves a fresh socket and registers again. A restart is noticed by
// an inotify watch on dir within milliseconds, and by a check every
// interval in case the watch misses it.
//
// A receive from dropped (nil: never) also registers again: the kubelet
// closed every stream of the plugin while its socket stayed.
func ServeRegistered(ctx context.Context, logger klog.Logger, dir, endpoint string, interval time.Duration, dropped <-chan struct{}, register func(context.Context, string) error, serve func(*grpc.Server)) {
	kubeletSock := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	sock := filepath.Join(dir, endpoint)
	events := make(chan struct{}, 1)
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(dir); err != nil {
			w.Close()
		}
	}
	if err != nil {
		logger.Error(err, "Cannot watch the kubelet's device-plugin directory; checking it every interval instead", "dir", dir, "interval", interval)
	} else {
		defer w.Close()
		go func() {
			for {
				select {
				case ev, ok := <-w.Events:
					if !ok {
						return
					}
					if ev.Name == kubeletSock && ev.Has(fsnotify.Create) || ev.Name == sock && ev.Has(fsnotify.Remove) {
						select {
						case events <- struct{}{}:
						default:
						}
					}
				case _, ok := <-w.Errors:
					if !ok {
						return
					}
				}
			}
		}()
	}
	for ctx.Err() == nil {
		id, srv, err := serveAndRegister(ctx, kubeletSock, sock, endpoint, events, register, serve)
		if err != nil {
			logger.Error(err, "Device plugin registration failed; retrying")
			wait := min(interval, 200*time.Millisecond)
			if errors.Is(err, errSocketGone) {
				wait = 20 * time.Millisecond // the kubelet is up; serve again at once
			}
			select {
			case <-ctx.Done():
			case <-events:
			case <-time.After(wait):
			}
			continue
		}
		waitForRestart(ctx, logger, kubeletSock, sock, id, interval, events, dropped)
		srv.Stop()
	}
}

// errSocketGone: the plugin socket was removed while registering.
var errSocketGone = errors.New("plugin socket removed while registering")

// registerPoll is how often serveAndRegister checks, besides on every
// watch event, that its socket is still there while it registers.
const registerPoll = 100 * time.Millisecond

func serveAndRegister(ctx context.Context, kubeletSock, sock, endpoint string, events <-chan struct{}, register func(context.Context, string) error, serve func(*grpc.Server)) (string, *grpc.Server, error) {
	id, err := inode(kubeletSock)
	if err != nil {
		return "", nil, fmt.Errorf("kubelet socket %s: %w", kubeletSock, err)
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", nil, err
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return "", nil, err
	}
	own, err := inode(sock)
	if err != nil {
		lis.Close()
		return "", nil, err
	}
	srv := grpc.NewServer()
	serve(srv)
	go func() { _ = srv.Serve(lis) }()
	// A kubelet that is starting removes every socket of the directory
	// before it serves kubelet.sock. If that removal lands between our
	// Listen and its Listen, our registration reaches the new kubelet
	// with an endpoint that is gone: the kubelet's device manager then
	// dials it until the Register call ends, which Register bounds at
	// 10 s, and pods it admits meanwhile meet no healthy device. So the
	// call is given up as soon as our socket is gone, and the loop serves
	// a fresh one at once.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		t := time.NewTicker(registerPoll)
		defer t.Stop()
		for {
			if cur, err := inode(sock); err != nil || cur != own {
				cancel()
				return
			}
			select {
			case <-rctx.Done():
				return
			case <-events:
			case <-t.C:
			}
		}
	}()
	err = register(rctx, kubeletSock)
	cancel()
	<-watching
	if cur, serr := inode(sock); serr != nil || cur != own {
		// Registered or not, the kubelet cannot reach what it was told.
		srv.Stop()
		return "", nil, fmt.Errorf("%w (%s; the registration: %v)", errSocketGone, sock, err)
	}
	if err != nil {
		srv.Stop()
		return "", nil, err
	}
	// The kubelet registered with is the one whose socket is there now. A
	// kubelet starting while this ran may have re-created its socket
	// after the first read; taking that for yet another restart would
	// register twice, and the kubelet may then drop the second connection
	// when the first one's stream ends (its device manager disconnects
	// whichever client is current for the resource). A restart after this
	// read removes the plugin socket too, which the watch sees.
	if now, err := inode(kubeletSock); err == nil {
		id = now
	}
	return id, srv, nil
}

// waitForRestart returns when ctx ends, the kubelet socket is replaced, or
// our socket is removed.
func waitForRestart(ctx context.Context, logger klog.Logger, kubeletSock, sock, id string, interval time.Duration, events, dropped <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	select { // a drop noticed before this registration is old news
	case <-dropped:
	default:
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
		case <-t.C:
		case <-dropped:
			logger.Info("The kubelet closed every stream of the device plugin; registering again")
			return
		}
		if cur, err := inode(kubeletSock); err != nil || cur != id {
			logger.Info("Kubelet socket re-created; registering again")
			return
		}
		if _, err := os.Stat(sock); err != nil {
			logger.Info("Plugin socket removed; registering again")
			return
		}
	}
}

// inode identifies a file by inode and change time: a re-created socket
// differs even if the file system reuses the inode number.
func inode(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("no inode for %s", path)
	}
	return fmt.Sprintf("%d@%d.%d", st.Ino, st.Ctim.Sec, st.Ctim.Nsec), nil
}
