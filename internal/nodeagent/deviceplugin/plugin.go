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
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// GPU is one GPU as the plugin offers it.
type GPU struct {
	UUID     string
	NUMANode int
	Healthy  bool
	Slots    int
	// MemoryMiB is the GPU's memory as NVML reports it, and MemoryCapMiB
	// that times the node's memory overcommit: what the agent's own checks
	// hold records to (guard.go). 0: unknown, not checked.
	MemoryMiB, MemoryCapMiB int64
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
	// kubelet restart (default 1s), besides watching its directory.
	CheckInterval time.Duration
	// Guard holds the checks a record must pass before it is served
	// (guard.go); nil only in tests of the matcher.
	Guard *Guard
	// DeviceList is how a container's GPUs are handed to the container
	// runtime (response.go); "" is DeviceListEnvvar.
	DeviceList DeviceListStrategy
	// DriverLimits, if set, has the driver hold the memory limits of
	// limited containers on GPUs it partitions (driverlimits.go).
	DriverLimits *DriverLimits
	// Recorder posts events on the pods it serves (a memory ceiling held
	// to the guarantee under MPS); nil: none.
	Recorder record.EventRecorder
	// Socket, if set, is the path the plugin serves on, and it does not
	// register with the kubelet itself: a kubelet-facing shim (package
	// kubeletshim) holds the kubelet's connection and forwards to it.
	Socket string
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
	// gen counts the lists; sent is, per open ListAndWatch stream, the
	// last list it sent (Withdraw waits for them).
	gen  uint64
	sent map[int]uint64
	next int

	// allocMu makes each Allocate's checks and ledger entry one step, so
	// two answers never both fit into the same room.
	allocMu sync.Mutex

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
	p.gen++
	close(p.changed)
	p.changed = make(chan struct{})
}

// Withdraw offers no devices any more and waits (up to timeout) until
// every open ListAndWatch stream has sent the empty list; the node agent
// calls it before it stops the plugin of a resource no longer offered
// when the plugin is registered with the kubelet directly. (Behind the
// kubelet shim the plugin is not stopped: it goes on serving the empty
// list, since the shim keeps the last list it received.)
func (p *Plugin) Withdraw(timeout time.Duration) {
	p.SetGPUs(nil, p.sharing())
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		done := true
		for _, g := range p.sent {
			done = done && g >= p.gen
		}
		p.mu.Unlock()
		if done {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.logger.Info("Withdrawn resource: a ListAndWatch stream did not take the empty list in time", "timeout", timeout)
}

func (p *Plugin) sharing() api.SharingMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// devices renders the slot list.
func (p *Plugin) devices() ([]*pluginapi.Device, <-chan struct{}) {
	devs, _, changed := p.list()
	return devs, changed
}

// list is devices with the list's generation.
func (p *Plugin) list() ([]*pluginapi.Device, uint64, <-chan struct{}) {
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
	return out, p.gen, p.changed
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
	p.mu.Lock()
	if p.sent == nil {
		p.sent = map[int]uint64{}
	}
	id := p.next
	p.next++
	p.sent[id] = 0
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.sent, id)
		p.mu.Unlock()
	}()
	for {
		devs, gen, changed := p.list()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		p.mu.Lock()
		p.sent[id] = gen
		p.mu.Unlock()
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
	gpus, mode := p.offered()
	if len(gpus) == 0 {
		// Withdrawn (the resource is no longer offered): nothing to give,
		// and nothing to prepare (no MIG instance made for it).
		return nil, fmt.Errorf("%w: pod %s container %s: resource %s is no longer offered on node %s", ErrNoMatch, kubeobj.Key(t.Pod), t.Container, p.opts.Resource, p.opts.Matcher.Node)
	}
	// The node's own checks of the record (guard.go) come first, for
	// every kind of grant; the ledger check and entry are one step.
	p.allocMu.Lock()
	defer p.allocMu.Unlock()
	if err := p.checkGrant(ctx, t, gpus, mode); err != nil {
		return nil, err
	}
	if r, handled, err := p.before(ctx, t, n); handled {
		return r, err
	}
	ref := kubeobj.Key(t.Pod)
	for _, d := range t.Grant.Devices {
		g, ok := gpus[d.UUID]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: pod %s container %s: GPU %s of its allocation record is not offered on node %s", ErrNoMatch, ref, t.Container, d.UUID, p.opts.Matcher.Node)
		case !g.Healthy:
			return nil, fmt.Errorf("%w: pod %s container %s: GPU %s of its allocation record is unhealthy", ErrNoMatch, ref, t.Container, d.UUID)
		}
	}
	limited := needsLimiter(t.Grant, mode)
	files, err := p.prepare(t, limited, mode)
	if err != nil {
		return nil, fmt.Errorf("pod %s container %s: %w", ref, t.Container, err)
	}
	if g := p.opts.Guard; g != nil && g.Admitted != nil && mode == api.SharingShared {
		g.Admitted()
	}
	p.logger.Info("Allocated", "pod", klog.KObj(t.Pod), "container", t.Container, "devices", t.Grant.Devices)
	p.ceilingHeld(t, mode)
	r := buildResponse(t.Grant, limited, files, p.opts.Paths, p.opts.DeviceList)
	if limited && mode == api.SharingShared {
		p.driverLimits(r, t)
	}
	if err := p.after(r, t, mode); err != nil {
		return nil, err
	}
	if pr := p.opts.Matcher.Protocol; pr != nil {
		pr.Served(ctx, t)
	}
	return r, nil
}

// prepare creates the container's directory (the record that it was
// served), its limits file when the limiter applies, and its ledger entry.
func (p *Plugin) prepare(t *Target, limited bool, mode api.SharingMode) (containerFiles, error) {
	st := p.opts.Matcher.State
	// The image's own preload list, which the agent's read-only list
	// replaces, as the pod declares it: kept after the limiter. The
	// webhook checked it at creation; annotations can change since, so it
	// is checked again, before anything is served.
	v, declares := t.Pod.Annotations[api.AnnotationPreload]
	declared, err := api.ParsePreloads(v)
	if limited && declares && err != nil {
		return containerFiles{}, fmt.Errorf("%w: annotation %s: %v", ErrNoMatch, api.AnnotationPreload, err)
	}
	if _, err := p.opts.Matcher.MarkServed(t.Pod.UID, t.Container); err != nil {
		return containerFiles{}, err
	}
	files := containerFiles{StateDir: st.StateDir(t.Pod.UID, t.Container)}
	if limited {
		b, err := limitsFile(t.Grant, p.opts.Paths, mode, statedir.Borrower(t.Pod.UID, t.Container))
		if err != nil {
			return containerFiles{}, err
		}
		if Bursts(t.Grant, mode) {
			if err := os.MkdirAll(p.opts.Paths.BudgetHost, 0o755); err != nil {
				return containerFiles{}, fmt.Errorf("creating the GPU budget directory: %w", err)
			}
			files.Budgets = true
		}
		if err := st.WriteLimits(t.Pod.UID, t.Container, b); err != nil {
			return containerFiles{}, fmt.Errorf("writing the limits file: %w", err)
		}
		files.LimitsFile = st.LimitsFile(t.Pod.UID, t.Container)
		if declares {
			if err := st.WritePreload(t.Pod.UID, t.Container, api.PreloadList(p.opts.Paths.LimiterContainer, declared)); err != nil {
				return containerFiles{}, fmt.Errorf("writing the preload list: %w", err)
			}
			files.PreloadFile = st.PreloadFile(t.Pod.UID, t.Container)
		}
	}
	err = st.WriteGrant(statedir.Grant{
		PodUID: t.Pod.UID, Namespace: t.Pod.Namespace, Pod: t.Pod.Name, Container: t.Container,
		Init: t.Grant.Init, Devices: t.Grant.Devices, Served: time.Now(),
	})
	if err != nil {
		return containerFiles{}, fmt.Errorf("recording the grant: %w", err)
	}
	return files, nil
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

// Run serves the plugin until ctx ends. Without Options.Socket it
// registers with the kubelet itself and registers again whenever the
// kubelet restarts (kubeletshim.ServeRegistered: an inotify watch on the
// device-plugin directory, and a periodic check). With Options.Socket it
// serves there for a kubelet-facing shim and registers nothing: the
// shim's connection to the kubelet outlives this process.
func (p *Plugin) Run(ctx context.Context) error {
	if p.opts.Socket != "" {
		return p.serveForShim(ctx)
	}
	kubeletshim.ServeRegistered(ctx, p.logger, p.opts.PluginDir, p.socketName(), p.opts.CheckInterval, nil,
		func(ctx context.Context, kubeletSock string) error {
			if err := kubeletshim.Register(ctx, kubeletSock, p.socketName(), p.opts.Resource); err != nil {
				return err
			}
			p.mu.Lock()
			p.registrations++
			p.mu.Unlock()
			p.logger.Info("Registered with the kubelet", "resource", p.opts.Resource, "socket", filepath.Join(p.opts.PluginDir, p.socketName()))
			return nil
		},
		func(srv *grpc.Server) { pluginapi.RegisterDevicePluginServer(srv, p) })
	return nil
}

// serveForShim serves on Options.Socket until ctx ends.
func (p *Plugin) serveForShim(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(p.opts.Socket), 0o755); err != nil {
		return err
	}
	if err := os.Remove(p.opts.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	lis, err := net.Listen("unix", p.opts.Socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	p.logger.Info("Serving the device plugin for the kubelet shim", "socket", p.opts.Socket)
	return srv.Serve(lis)
}
