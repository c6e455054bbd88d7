package parts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// PluginsOptions are what the device plugins part needs.
type PluginsOptions struct {
	NodeName string
	Names    api.ResourceNames
	// Paths are the limiter's paths (the preload file written at Start)
	// and the containers' state root.
	Paths deviceplugin.Paths
	// PluginDir is the kubelet's device-plugin directory.
	PluginDir string
	// PodResourcesSocket is the kubelet's pod-resources socket.
	PodResourcesSocket string
	// DeviceList is how GPUs are handed to the container runtime.
	DeviceList deviceplugin.DeviceListStrategy
	// SocketDir, if set, is where the plugins serve, one socket per
	// resource, for the kubelet shim, which registers in their stead.
	SocketDir string
	// Guard checks every record before it is served.
	Guard *deviceplugin.Guard
	// MIG answers MIG grants (nil refuses them).
	MIG deviceplugin.MIGDevices
	// MPSPipeDir locates a GPU's MPS daemon pipes (nil: no MPS).
	MPSPipeDir func(uuid string) string
	// Protocols are the other schedulers' protocols by the resource their
	// plugin serves (volcano.sh/vgpu-number: the volcano part); a
	// resource without one serves Tessera's records.
	Protocols map[string]deviceplugin.Protocol
	// DriverLimits, if set, has the driver hold limited containers'
	// memory limits where it partitions their GPUs.
	DriverLimits *deviceplugin.DriverLimits
	// Client reads a pod the agent's cache does not show yet.
	Client kubernetes.Interface
	// StateAge is how old the state directory of a pod no longer on the
	// node must be before it is removed (the agent's cache may not show a
	// new pod yet).
	StateAge time.Duration
	Logger   klog.Logger
}

// Plugins runs one kubelet device plugin per resource the node offers
// (the GPU resource, its shared rename, MIG profiles) and removes the
// per-container state directories of pods that are gone.
type Plugins struct {
	opts  PluginsOptions
	state statedir.Dirs
	ctx   context.Context // Start's
	pods  PodGetter
	// recorder posts the device plugins' events on pods (Start's).
	recorder record.EventRecorder
	wg       sync.WaitGroup

	mu sync.Mutex
	// plugins serve one resource each (Reconcile starts and stops them).
	plugins map[string]*pluginRun
	// withdrawn: plugins of resources no longer offered that keep serving
	// an empty list to the kubelet shim.
	withdrawn map[string]*pluginRun
	// offeredRead: the previous agent's served resources were read;
	// offeredWritten: what this one last wrote.
	offeredRead    bool
	offeredWritten string
}

// pluginRun is one resource's device plugin and what stops it.
type pluginRun struct {
	plugin *deviceplugin.Plugin
	pr     *deviceplugin.PodResources
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// NewPlugins returns the device plugins part.
func NewPlugins(opts PluginsOptions) *Plugins {
	return &Plugins{
		opts:      opts,
		state:     statedir.Dirs{Root: opts.Paths.StateRoot},
		pods:      PodGetter{Client: opts.Client},
		plugins:   map[string]*pluginRun{},
		withdrawn: map[string]*pluginRun{},
	}
}

// Start implements Part: it writes the preload file containers get.
func (p *Plugins) Start(ctx context.Context, c Cluster) error {
	if err := p.opts.Paths.WritePreload(); err != nil {
		return fmt.Errorf("writing %s: %w", p.opts.Paths.PreloadHost, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctx, p.pods.Lister, p.recorder = ctx, c.Pods, c.Recorder
	return nil
}

// Plugin returns the device plugin serving a resource (nil if none).
func (p *Plugins) Plugin(resource string) *deviceplugin.Plugin {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.plugins[resource]; r != nil {
		return r.plugin
	}
	return nil
}

// Resources lists the resources offered (not the withdrawn ones whose
// plugins serve an empty list to the kubelet shim).
func (p *Plugins) Resources() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.plugins))
	for r := range p.plugins {
		out = append(out, r)
	}
	return out
}

// Reconcile implements Part: one device plugin per resource of the
// offer, with its devices and the configuration's policy; the plugins of
// resources no longer offered are withdrawn, so that the kubelet sees
// their devices go.
//
// Registered with the kubelet directly, a withdrawn plugin stops: the
// kubelet's device manager marks a disconnected resource's devices
// unhealthy itself. Behind the kubelet shim it keeps serving an empty
// list instead: the shim keeps reporting the last list it got while the
// agent is away, so a stopped plugin whose empty list the shim had not
// received (its stream reconnecting, or the list still queued when the
// server stopped) would leave the kubelet offering the old devices until
// the shim's StaleAfter. A re-offered resource's plugin resumes. The
// resources served are written to the socket directory (offeredFile), so
// that an agent restarted with fewer resources (the MIG label changed
// while it was down) withdraws the others the same way, at its first
// offer made from the Node's configuration (n.Configured; an offer from
// the defaults withdraws nothing of the record). Withdrawn resources are
// not forgotten: they stay registered, at 0, until the socket directory
// is cleared.
func (p *Plugins) Reconcile(_ context.Context, n *Node) {
	cfg := n.Config
	pol := deviceplugin.Policy{FailRequestsGreaterThanOne: cfg.FailRequestsGreaterThanOne, MIG: p.opts.MIG}
	if p.opts.MPSPipeDir != nil {
		pol.MPS = &deviceplugin.MPS{PipeDir: p.opts.MPSPipeDir, SlotPercent: 100 / max(cfg.SharesPerGPU, 1)}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for res, gpus := range n.Offer {
		r := p.plugins[res]
		if r == nil && p.withdrawn[res] != nil {
			r = p.withdrawn[res]
			delete(p.withdrawn, res)
			p.plugins[res] = r
			p.opts.Logger.Info("Device plugin resumed: resource offered again", "resource", res)
		}
		fresh := r == nil
		if fresh {
			r = p.newPluginLocked(res)
		}
		r.plugin.SetPolicy(pol)
		r.plugin.SetGPUs(gpus, cfg.Sharing)
		if fresh {
			// Started once it has its devices: the first ListAndWatch
			// already lists them.
			p.startLocked(r)
		}
	}
	if p.opts.SocketDir != "" && n.Configured && !p.offeredRead {
		// The first offer after a start: what the previous agent served
		// and this one does not is withdrawn below, like a live change.
		p.offeredRead = true
		for _, res := range p.readOffered() {
			if _, ok := n.Offer[res]; ok || p.plugins[res] != nil || p.withdrawn[res] != nil {
				continue
			}
			r := p.newPluginLocked(res)
			r.plugin.SetPolicy(pol)
			r.plugin.SetGPUs(nil, cfg.Sharing)
			p.startLocked(r)
		}
	}
	for res, r := range p.plugins {
		if _, ok := n.Offer[res]; ok {
			continue
		}
		delete(p.plugins, res)
		if p.opts.SocketDir != "" {
			r.plugin.SetGPUs(nil, cfg.Sharing)
			p.withdrawn[res] = r
			p.opts.Logger.Info("Device plugin withdrawn: resource no longer offered; the kubelet shim is told it has no devices", "resource", res)
			continue
		}
		r.plugin.Withdraw(time.Second)
		r.cancel()
		<-r.done
		r.pr.Close()
		p.opts.Logger.Info("Device plugin stopped: resource no longer offered", "resource", res)
	}
	if p.offeredRead { // not before: the previous agent's record is still to be read
		p.writeOfferedLocked()
	}
}

// Resync implements Resyncer: it removes the state directories of pods
// no longer on the node.
func (p *Plugins) Resync(context.Context) {
	p.mu.Lock()
	pods := p.pods.Lister
	p.mu.Unlock()
	if pods == nil {
		return
	}
	list, err := pods.List(labels.Everything())
	if err != nil {
		p.opts.Logger.Error(err, "Listing pods to remove state directories")
		return
	}
	running := make(map[types.UID]bool, len(list))
	for _, pod := range list {
		if !finished(pod) {
			running[pod.UID] = true
		}
	}
	live := func(uid types.UID) bool { return running[uid] }
	removed, err := p.state.GC(live, p.opts.StateAge, time.Now())
	if err != nil {
		p.opts.Logger.Error(err, "Removing state directories of finished pods")
	}
	if len(removed) > 0 {
		p.opts.Logger.Info("Removed state directories of finished pods", "pods", removed)
	}
}

// Stop implements Part: every plugin stops.
func (p *Plugins) Stop() {
	p.mu.Lock()
	for _, m := range []map[string]*pluginRun{p.plugins, p.withdrawn} {
		for res, r := range m {
			r.cancel()
			<-r.done
			r.pr.Close()
			delete(m, res)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Plugins) startLocked(r *pluginRun) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(r.done)
		_ = r.plugin.Run(r.ctx)
	}()
}

func (p *Plugins) newPluginLocked(res string) *pluginRun {
	pr := &deviceplugin.PodResources{Socket: p.opts.PodResourcesSocket, Resource: res}
	socket := ""
	if p.opts.SocketDir != "" {
		socket = filepath.Join(p.opts.SocketDir, kubeletshim.AgentSocketName(res))
	}
	plugin := deviceplugin.New(deviceplugin.Options{
		Resource:     res,
		PluginDir:    p.opts.PluginDir,
		Paths:        p.opts.Paths,
		Guard:        p.opts.Guard,
		DeviceList:   p.opts.DeviceList,
		DriverLimits: p.opts.DriverLimits,
		Recorder:     p.recorder,
		Socket:       socket,
		Matcher: &deviceplugin.Matcher{
			Node: p.opts.NodeName, Resource: res,
			Kubelet:  pr,
			Pods:     p.pods,
			State:    p.state,
			Protocol: p.opts.Protocols[res],
		},
	}, p.opts.Logger.WithName("deviceplugin").WithValues("resource", res))
	ctx, cancel := context.WithCancel(p.ctx)
	r := &pluginRun{plugin: plugin, pr: pr, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	p.plugins[res] = r
	return r
}

// OfferedFile, in the plugins' socket directory, lists the resources the
// agent serves the kubelet shim (offered or withdrawn), one per line. The
// shim manager ignores it (not a socket).
const OfferedFile = "tessera-resources"

// maxOffered bounds what readOffered takes from the file (a node offers
// its GPU resource, a shared rename and a few dozen MIG profiles), and
// maxOfferedBytes what it reads of it.
const (
	maxOffered      = 256
	maxOfferedBytes = 64 << 10
)

// readOffered is the resources a previous agent served under this agent's
// resource prefix; a missing or unreadable file is nothing (logged), a
// line that is not such a resource name is skipped (another prefix's
// resources are not this agent's to withdraw).
func (p *Plugins) readOffered() []string {
	path := filepath.Join(p.opts.SocketDir, OfferedFile)
	b, err := readLimited(path, maxOfferedBytes)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.opts.Logger.Error(err, "Reading the resources the previous agent served; those it no longer offers stay with the kubelet shim until its --stale-after", "file", path)
		}
		return nil
	}
	var out []string
	skipped := 0
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		if len(out) == maxOffered {
			p.opts.Logger.Error(nil, "Too many resources in the file of served resources; the rest ignored", "file", path, "limit", maxOffered)
			break
		}
		// A qualified name (one "/", a DNS-subdomain prefix without "_")
		// under the agent's prefix: its socket name maps back to it.
		if !strings.HasPrefix(line, p.opts.Names.Prefix+"/") || len(validation.IsQualifiedName(line)) > 0 {
			if skipped++; skipped <= 3 {
				p.opts.Logger.Error(nil, "Ignoring a line of the file of served resources: not a resource name under the agent's prefix", "file", path, "line", fmt.Sprintf("%.80q", line), "prefix", p.opts.Names.Prefix)
			}
			continue
		}
		out = append(out, line)
	}
	return out
}

// readLimited reads at most limit bytes of a file.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// writeOfferedLocked records the resources served (offered and withdrawn)
// when they change, replacing the file atomically.
func (p *Plugins) writeOfferedLocked() {
	var all []string
	for _, m := range []map[string]*pluginRun{p.plugins, p.withdrawn} {
		for res := range m {
			all = append(all, res)
		}
	}
	sort.Strings(all)
	content := strings.Join(all, "\n") + "\n"
	if content == p.offeredWritten {
		return
	}
	path := filepath.Join(p.opts.SocketDir, OfferedFile)
	err := os.MkdirAll(p.opts.SocketDir, 0o755)
	if err == nil {
		err = atomicfile.Write(path, []byte(content), 0o644)
	}
	if err != nil {
		p.opts.Logger.Error(err, "Recording the resources served for the next agent", "file", path)
		return
	}
	p.offeredWritten = content
}
