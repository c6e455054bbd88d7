// Package deviceplugin serves the kubelet device plugin API for the GPU
// resource: share slots per healthy GPU, a preferred allocation that
// points the kubelet at the GPUs the scheduler chose, and Allocate answers
// built from the pod's allocation record (see Matcher for how a request is
// tied to its pod).
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// GPU is one GPU as the plugin offers it.
type GPU struct {
	UUID     string
	NUMANode int
	Healthy  bool
	Slots    int
}

// SlotID names slot k of a GPU. IDs are stable across restarts of the
// agent, so the kubelet's checkpointed assignments stay valid.
func SlotID(uuid string, k int) string { return uuid + "::" + strconv.Itoa(k) }

// SlotGPU returns the GPU UUID of a slot ID.
func SlotGPU(id string) string {
	u, _, _ := strings.Cut(id, "::")
	return u
}

// Options configure a Plugin.
type Options struct {
	// Resource is the extended resource name, e.g. "nvidia.com/gpu".
	Resource string
	// PluginDir is the kubelet's device-plugin directory (holds kubelet.sock).
	PluginDir string
	Paths     Paths
	Matcher   *Matcher
	// CheckInterval is how often the kubelet's socket is checked for a
	// kubelet restart (default 1s).
	CheckInterval time.Duration
}

// Plugin is the device plugin. Its GPU set is replaced with SetGPUs.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	opts   Options
	logger klog.Logger

	mu      sync.Mutex
	gpus    []GPU
	mode    api.SharingMode
	pol     Policy        // MIG and MPS answers (migmps.go)
	changed chan struct{} // closed and replaced on every change

	registrations int // for tests: successful registrations
}

// New returns a plugin offering no GPUs until SetGPUs.
func New(opts Options, logger klog.Logger) *Plugin {
	if opts.PluginDir == "" {
		opts.PluginDir = pluginapi.DevicePluginPath
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = time.Second
	}
	return &Plugin{opts: opts, logger: logger, mode: api.SharingShared, changed: make(chan struct{})}
}

// SetGPUs replaces the offered GPUs and the node's sharing mode; open
// ListAndWatch streams send the new list at once if it differs.
func (p *Plugin) SetGPUs(gpus []GPU, mode api.SharingMode) {
	gpus = append([]GPU(nil), gpus...)
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].UUID < gpus[j].UUID })
	p.mu.Lock()
	defer p.mu.Unlock()
	if reflect.DeepEqual(gpus, p.gpus) && mode == p.mode {
		return
	}
	p.gpus, p.mode = gpus, mode
	close(p.changed)
	p.changed = make(chan struct{})
}

// devices renders the slot list.
func (p *Plugin) devices() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*pluginapi.Device
	for _, g := range p.gpus {
		health := pluginapi.Healthy
		if !g.Healthy {
			health = pluginapi.Unhealthy
		}
		var topo *pluginapi.TopologyInfo
		if g.NUMANode >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}
		}
		for k := 0; k < g.Slots; k++ {
			out = append(out, &pluginapi.Device{ID: SlotID(g.UUID, k), Health: health, Topology: topo})
		}
	}
	return out, p.changed
}

// offered is one consistent view of the GPUs and their sharing mode.
func (p *Plugin) offered() (map[string]GPU, api.SharingMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	gpus := make(map[string]GPU, len(p.gpus))
	for _, g := range p.gpus {
		gpus[g.UUID] = g
	}
	return gpus, p.mode
}

// GetDevicePluginOptions implements the device plugin API.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the slot list now and after every change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devs, changed := p.devices()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation points the kubelet at slots of the GPUs the
// scheduler chose, so that the kubelet's view of which GPU a container
// holds (health, pod-resources) is the truth. Without a match it prefers
// nothing special; Allocate then refuses with the reason.
func (p *Plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		var want []string
		if t, err := p.opts.Matcher.Match(ctx, int(cr.AllocationSize)); err == nil {
			for _, d := range t.Grant.Devices {
				want = append(want, d.UUID)
			}
		} else {
			p.logger.V(2).Info("No preference", "reason", err.Error())
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: prefer(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize), want),
		})
	}
	return resp, nil
}

// prefer picks size slots: the must-include ones, then one slot of each
// wanted GPU, then the lowest remaining IDs.
func prefer(available, must []string, size int, want []string) []string {
	avail := append([]string(nil), available...)
	sort.Slice(avail, func(i, j int) bool { return slotLess(avail[i], avail[j]) })
	picked := map[string]bool{}
	out := []string{}
	take := func(id string) {
		if !picked[id] && len(out) < size {
			picked[id] = true
			out = append(out, id)
		}
	}
	for _, id := range must {
		take(id)
	}
	have := map[string]bool{}
	for _, id := range out {
		have[SlotGPU(id)] = true
	}
	for _, u := range want {
		if have[u] {
			continue
		}
		for _, id := range avail {
			if SlotGPU(id) == u && !picked[id] {
				take(id)
				have[u] = true
				break
			}
		}
	}
	for _, id := range avail {
		take(id)
	}
	return out
}

// slotLess orders slot IDs by GPU, then numerically by slot.
func slotLess(a, b string) bool {
	ua, ka, _ := strings.Cut(a, "::")
	ub, kb, _ := strings.Cut(b, "::")
	if ua != ub {
		return ua < ub
	}
	na, _ := strconv.Atoi(ka)
	nb, _ := strconv.Atoi(kb)
	return na < nb
}

// Allocate answers each container request from its pod's allocation
// record. Any doubt fails the request, and with it the pod's admission.
func (p *Plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		r, err := p.allocate(ctx, len(cr.DevicesIds))
		if err != nil {
			p.logger.Error(err, "Allocate refused", "devices", cr.DevicesIds)
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

func (p *Plugin) allocate(ctx context.Context, n int) (*pluginapi.ContainerAllocateResponse, error) {
	t, err := p.opts.Matcher.Match(ctx, n)
	if err != nil {
		return nil, err
	}
	if r, handled, err := p.before(ctx, t, n); handled {
		return r, err
	}
	ref := kubeobj.Key(t.Pod)
	gpus, mode := p.offered()
	for _, d := range t.Grant.Devices {
		g, ok := gpus[d.UUID]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: pod %s container %s: GPU %s of its allocation record is not offered on node %s", ErrNoMatch, ref, t.Container, d.UUID, p.opts.Matcher.Node)
		case !g.Healthy:
			return nil, fmt.Errorf("%w: pod %s container %s: GPU %s of its allocation record is unhealthy", ErrNoMatch, ref, t.Container, d.UUID)
		}
	}
	dir, err := p.opts.Matcher.MarkServed(t.Pod.UID, t.Container)
	if err != nil {
		return nil, fmt.Errorf("pod %s container %s: %w", ref, t.Container, err)
	}
	p.logger.Info("Allocated", "pod", klog.KObj(t.Pod), "container", t.Container, "devices", t.Grant.Devices)
	r := buildResponse(t.Grant, needsLimiter(t.Grant, mode), dir, p.opts.Paths)
	if err := p.after(r, t, mode); err != nil {
		return nil, err
	}
	return r, nil
}

// PreStartContainer is not requested (options say so).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// socketName is the plugin's socket file in PluginDir.
func (p *Plugin) socketName() string {
	if _, name, _ := strings.Cut(p.opts.Resource, "/"); name != "gpu" {
		// MIG profiles and renamed resources: short, so the socket path
		// stays within a unix socket's 107 bytes in deep plugin
		// directories (the lab's).
		return "t-" + strings.NewReplacer(".", "-", "+", "-").Replace(name) + ".sock"
	}
	return "tessera-" + strings.NewReplacer("/", "-", ".", "-").Replace(p.opts.Resource) + ".sock"
}

// Registrations returns how many times the plugin registered.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registrations
}

// Run serves the plugin and registers it with the kubelet until ctx ends.
// When the kubelet restarts (its socket is re-created, or it removed ours)
// the plugin serves a fresh socket and registers again.
func (p *Plugin) Run(ctx context.Context) error {
	kubeletSock := filepath.Join(p.opts.PluginDir, filepath.Base(pluginapi.KubeletSocket))
	for ctx.Err() == nil {
		srv, sockID, err := p.serveAndRegister(ctx, kubeletSock)
		if err != nil {
			p.logger.Error(err, "Device plugin registration failed; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(p.opts.CheckInterval):
			}
			continue
		}
		p.waitForRestart(ctx, kubeletSock, sockID)
		srv.Stop()
	}
	return nil
}

// serveAndRegister starts the gRPC server and registers it. It returns
// the identity of the kubelet socket it registered with.
func (p *Plugin) serveAndRegister(ctx context.Context, kubeletSock string) (*grpc.Server, string, error) {
	id, err := inode(kubeletSock)
	if err != nil {
		return nil, "", fmt.Errorf("kubelet socket %s: %w", kubeletSock, err)
	}
	sock := filepath.Join(p.opts.PluginDir, p.socketName())
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, "", err
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, "", err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, "", err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.socketName(),
		ResourceName: p.opts.Resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		srv.Stop()
		return nil, "", fmt.Errorf("registering %s with the kubelet: %w", p.opts.Resource, err)
	}
	p.mu.Lock()
	p.registrations++
	p.mu.Unlock()
	p.logger.Info("Registered with the kubelet", "resource", p.opts.Resource, "socket", sock)
	return srv, id, nil
}

// waitForRestart returns when ctx ends, the kubelet socket is replaced, or
// our socket is removed (the kubelet cleans the directory on start).
func (p *Plugin) waitForRestart(ctx context.Context, kubeletSock string, id string) {
	sock := filepath.Join(p.opts.PluginDir, p.socketName())
	t := time.NewTicker(p.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if cur, err := inode(kubeletSock); err != nil || cur != id {
			p.logger.Info("Kubelet socket re-created; registering again")
			return
		}
		if _, err := os.Stat(sock); err != nil {
			p.logger.Info("Plugin socket removed; registering again")
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
