// Package nodeagent is Tessera's node agent: it discovers the node's GPUs
// through NVML, watches their health, applies the node's configuration
// profile and publishes the node's inventory on its Node object when it
// changes. What each mode adds (the kubelet device plugins, the DRA
// kubelet plugin, MIG, MPS, the record checks, the metrics) is a part
// (package parts) the agent drives; parts.go registers them.
package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nodelabels"
	"github.com/tessera-gpu/tessera/internal/nodeagent/parts"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Options configure the agent.
type Options struct {
	NodeName string
	// Resource is the GPU resource served (api.ResourceNames.GPU); the
	// other names (shared rename, MIG profiles) share its prefix.
	Resource string
	// ConfigMapNamespace and ConfigMapName locate the profiles; an empty
	// name runs on the built-in defaults.
	ConfigMapNamespace, ConfigMapName string
	Health                            health.Options
	Paths                             deviceplugin.Paths
	// PluginDir is the kubelet's device-plugin directory.
	PluginDir string
	// PodResourcesSocket is the kubelet's pod-resources socket.
	PodResourcesSocket string
	// Resync is how often the inventory is rebuilt without a trigger and
	// state directories are collected (default 1m).
	Resync time.Duration
	// NoPlugin leaves out the parts that serve the kubelet: the device
	// plugins, their record checks and the DRA kubelet plugin (tests of
	// publishing only).
	NoPlugin bool
	// MPSControl runs nvidia-cuda-mps-control (path and leading
	// arguments; default "nvidia-cuda-mps-control" from $PATH), for nodes
	// in mps mode.
	MPSControl []string
	// VolcanoDeviceConfig is Volcano's device configuration ConfigMap,
	// read on nodes in Volcano's mig mode (default
	// kube-system/volcano-vgpu-device-config, Volcano's).
	VolcanoDeviceConfig types.NamespacedName
	// MPSRoot is the host directory of the MPS daemons' pipes and logs
	// (default mps.DefaultRoot; a profile's flags.mpsRoot wins).
	MPSRoot string
	// DRA are the DRA kubelet plugin's directories (ClaimRoot, CDIDir,
	// PluginDataDir, RegistrarDir; dra.DefaultOptions when empty), for
	// nodes in mode dra. The agent fills in the rest.
	DRA dra.Options
	// RecordKeys locates the scheduler's published public keys: every
	// record is checked against them before it is served. Nil: signatures
	// are not checked (the records rest on the admission policy alone).
	RecordKeys *recordsig.Store
	// AcceptUnsigned serves records without a signature (while upgrading
	// from a release whose scheduler did not sign).
	AcceptUnsigned bool
	// DeviceList is how GPUs are handed to the container runtime.
	DeviceList deviceplugin.DeviceListStrategy
	// DriverLimits, if set (its Hook and CDIDir; Partitions is the
	// agent's), has the driver hold the memory limits of limited
	// containers on GPUs whose driver partitions memory per cgroup: the
	// device plugin's answers run the memory-limits hook, and the agent
	// clears the limits of stopped containers.
	DriverLimits *deviceplugin.DriverLimits
	// PluginSocketDir, if set, is where the device plugins serve, one
	// socket per resource (kubeletshim.AgentSocketName), for the
	// kubelet-facing shim, which registers with the kubelet in their
	// stead.
	PluginSocketDir string
	// Reconcile configures the host-side check of what containers hold
	// on the GPUs against their grants; it runs when Interval > 0.
	Reconcile reconcile.Options
	// MetricsAddress is where the Prometheus metrics are served
	// ("host:port"; empty: not served).
	MetricsAddress string
}

// Agent is one node's agent: the core (discovery, health, the
// configuration profile, the inventory and its publishing, the reconcile
// loop) and the per-mode parts it drives (package parts; registered in
// parts.go).
type Agent struct {
	opts    Options
	client  kubernetes.Interface
	logger  klog.Logger
	names   api.ResourceNames
	devices *parts.Devices
	monitor *health.Monitor
	config  *config.Store
	driver  nodelabels.Driver // the driver's versions, for the labels
	// partitioning: whether the driver can partition each GPU's memory
	// per cgroup, found at start (a metric)
	partitioning map[string]memlimits.Support

	parts   []parts.Part
	trigger chan struct{}

	// Set by Run before the first reconcile.
	nodes corelisters.NodeLister
	cms   corelisters.ConfigMapLister
	pods  corelisters.PodLister

	mu        sync.Mutex
	published string // last inventory we wrote on the Node
	stale     string // the annotation our cache held when we wrote it
	synced    bool   // our cache has shown what we wrote
	patches   int
	configErr string // last configuration error reported
}

// New discovers the GPUs of lib (initialised) and prepares the agent.
func New(lib nvml.Interface, client kubernetes.Interface, opts Options, logger klog.Logger) (*Agent, error) {
	if opts.NodeName == "" {
		return nil, fmt.Errorf("node name is empty (set --node-name or NODE_NAME)")
	}
	if opts.Resync <= 0 {
		opts.Resync = time.Minute
	}
	prefix, ok := strings.CutSuffix(opts.Resource, "/gpu")
	if !ok {
		return nil, fmt.Errorf("resource %q is not <prefix>/gpu", opts.Resource)
	}
	names, err := api.NewResourceNames(prefix)
	if err != nil {
		return nil, err
	}
	res, err := discovery.Discover(lib, discovery.Options{})
	if err != nil {
		return nil, err
	}
	for _, e := range res.Skipped {
		logger.Error(e, "GPU left out of the inventory")
	}
	devices := parts.NewDevices(res.Devices)
	a := &Agent{
		opts: opts, client: client, logger: logger, names: names, devices: devices,
		monitor: health.New(lib, devices.Handles(), opts.Health, logger.WithName("health")),
		config:  config.NewStore(names),
		driver:  driverInfo(lib),
		trigger: make(chan struct{}, 1),
	}
	a.partitioning = detectPartitioning(lib, a.driver.Version, res.Devices, logger)
	a.parts = a.newParts(lib)
	return a, nil
}

// detectPartitioning finds, and logs, whether the driver can partition
// each GPU's memory per cgroup (memlimits.Detect).
func detectPartitioning(lib nvml.Interface, version string, devs []discovery.Device, logger klog.Logger) map[string]memlimits.Support {
	handles, mig := map[string]nvml.Device{}, map[string]bool{}
	for _, d := range devs {
		handles[d.GPU.UUID], mig[d.GPU.UUID] = d.Handle, d.GPU.MIG.Enabled
	}
	mount, err := cgroup2.FindMount("/proc/self/mountinfo")
	support := memlimits.Detect(version, lib, handles, mig, mount, err)
	for _, d := range devs {
		if s := support[d.GPU.UUID]; s.OK {
			logger.Info("The driver can partition this GPU's memory per cgroup", "gpu", d.GPU.UUID, "cgroup2", mount.Point)
		} else {
			logger.V(2).Info("The driver cannot partition this GPU's memory per cgroup", "gpu", d.GPU.UUID, "reason", s.Reason)
		}
	}
	return support
}

// markDriverLimits sets DriverMemoryLimits on the inventory's GPUs whose
// containers' memory the driver holds: shared GPUs of a device-plugin
// node whose driver partitions memory, where the agent runs the
// memory-limits hook.
func (a *Agent) markDriverLimits(inv *api.NodeInventory, cfg api.NodeConfig) {
	if inv == nil || a.opts.DriverLimits == nil || len(a.opts.DriverLimits.Hook) == 0 || cfg.Mode != "" && cfg.Mode != api.ModeDevicePlugin {
		return
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		g.DriverMemoryLimits = g.Sharing == api.SharingShared && !g.MIG.Enabled && a.partitioning[g.UUID].OK
	}
}

// partitionsNow answers per GPU whether its driver partitions its memory
// per cgroup now: found so at the agent's start (a.partitioning) and not
// in MIG mode since. The MIG part may turn MIG mode on after the start (a
// mig-dynamic or mig-parted profile on a GPU that was not in MIG mode),
// and the driver does not partition a MIG GPU's memory; a GPU whose MIG
// mode goes off again is found partitioned at the agent's next start.
func (a *Agent) partitionsNow() map[string]bool {
	out := make(map[string]bool, len(a.partitioning))
	a.devices.With(func(list []discovery.Device) {
		for _, d := range list {
			if s, ok := a.partitioning[d.GPU.UUID]; ok {
				out[d.GPU.UUID] = s.OK && !d.GPU.MIG.Enabled
			}
		}
	})
	return out
}

// Devices returns the discovered GPUs.
func (a *Agent) Devices() []discovery.Device { return a.devices.List() }

func (a *Agent) poke() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Run runs the agent until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(a.client, a.opts.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.opts.NodeName).String()
		}))
	podFactory := informers.NewSharedInformerFactoryWithOptions(a.client, a.opts.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.opts.NodeName).String()
		}))
	onChange := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.poke() },
		UpdateFunc: func(any, any) { a.poke() },
		DeleteFunc: func(any) { a.poke() },
	}
	nodeInf := nodeFactory.Core().V1().Nodes()
	if _, err := nodeInf.Informer().AddEventHandler(onChange); err != nil {
		return err
	}
	a.nodes = nodeInf.Lister()
	a.pods = podFactory.Core().V1().Pods().Lister()
	podInformer := podFactory.Core().V1().Pods().Informer()
	// Pods coming, ending or going change what MIG instances and MPS
	// limits the node needs (a poke coalesces with any pending one).
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { a.poke() },
		UpdateFunc: func(o, n any) {
			op, ok1 := o.(*v1.Pod)
			np, ok2 := n.(*v1.Pod)
			if !ok1 || !ok2 || op.Status.Phase != np.Status.Phase || (op.DeletionTimestamp == nil) != (np.DeletionTimestamp == nil) {
				a.poke()
			}
		},
		DeleteFunc: func(any) { a.poke() },
	}); err != nil {
		return err
	}
	synced := []cache.InformerSynced{nodeInf.Informer().HasSynced, podInformer.HasSynced}
	if a.opts.ConfigMapName != "" {
		cmFactory := informers.NewSharedInformerFactoryWithOptions(a.client, a.opts.Resync,
			informers.WithNamespace(a.opts.ConfigMapNamespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.opts.ConfigMapName).String()
			}))
		cmInf := cmFactory.Core().V1().ConfigMaps()
		if _, err := cmInf.Informer().AddEventHandler(onChange); err != nil {
			return err
		}
		a.cms = cmInf.Lister()
		synced = append(synced, cmInf.Informer().HasSynced)
		cmFactory.Start(ctx.Done())
	}
	nodeFactory.Start(ctx.Done())
	podFactory.Start(ctx.Done())
	a.logger.Info("Waiting for the API caches (Node, pods on the node, ConfigMap)", "node", a.opts.NodeName, "gpus", len(a.devices.List()))
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}

	// Deferred calls run in reverse: the context ends, the parts stop,
	// the event broadcaster shuts down, the health monitor has returned.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.monitor.Run(ctx); err != nil {
			a.logger.Error(err, "Health monitor stopped; GPU errors will not be detected")
		}
	}()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "tessera-node-agent", Host: a.opts.NodeName})
	started := 0
	defer func() {
		cancel()
		for i := started - 1; i >= 0; i-- {
			a.parts[i].Stop()
		}
	}()
	cluster := parts.Cluster{Pods: a.pods, Nodes: a.nodes, Recorder: recorder, Poke: a.poke}
	for _, p := range a.parts {
		if err := p.Start(ctx, cluster); err != nil {
			return err
		}
		started++
	}

	tick := time.NewTicker(a.opts.Resync)
	defer tick.Stop()
	for {
		a.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-a.trigger:
		case <-a.monitor.Changes():
		case <-tick.C:
			for _, p := range a.parts {
				if r, ok := p.(parts.Resyncer); ok {
					r.Resync(ctx)
				}
			}
		}
	}
}

// reconcile applies configuration and health: the parts are told the
// node's configuration and inventory, and the Node's inventory annotation
// and labels are written when they changed.
func (a *Agent) reconcile(ctx context.Context) {
	node, err := a.nodes.Get(a.opts.NodeName)
	if err != nil {
		a.logger.Error(err, "Node not readable; inventory not published", "node", a.opts.NodeName)
		node = nil
	}
	if a.cms != nil && node != nil {
		a.applyConfig(node)
	}
	cfg, _ := a.config.Current()
	for _, p := range a.parts {
		if d, ok := p.(parts.DevicePreparer); ok {
			d.PrepareDevices(cfg)
		}
	}
	n := &parts.Node{Config: cfg, Configured: node != nil && (a.cms == nil || a.ConfigError() == "")}
	a.devices.With(func(devs []discovery.Device) {
		n.Inventory, n.Offer = BuildInventory(devs, a.monitor.Snapshot(), cfg.NodeConfig, a.names)
	})
	a.markDriverLimits(n.Inventory, cfg.NodeConfig)
	for _, p := range a.parts {
		p.Reconcile(ctx, n)
	}
	if node == nil {
		return
	}
	if cfg.Mode == api.ModeVolcano {
		// Volcano's scheduler places this node's GPUs: Tessera's must not
		// see them (docs/volcano.md).
		err = a.unpublish(ctx, node)
	} else {
		err = a.publish(ctx, node, n.Inventory)
	}
	if err == nil {
		err = a.publishLabels(ctx, node, n.Inventory)
	}
	if err != nil {
		a.logger.Error(err, "Publishing the inventory or labels failed; will retry", "node", a.opts.NodeName)
		go func() { time.Sleep(5 * time.Second); a.poke() }()
	}
}

func (a *Agent) applyConfig(node *v1.Node) {
	cm, err := a.cms.ConfigMaps(a.opts.ConfigMapNamespace).Get(a.opts.ConfigMapName)
	var data map[string]string
	switch {
	case apierrors.IsNotFound(err):
		err = fmt.Errorf("ConfigMap %s/%s not found", a.opts.ConfigMapNamespace, a.opts.ConfigMapName)
	case err == nil:
		data = cm.Data
	}
	changed := false
	if err == nil {
		changed, err = a.config.Update(data, node.Labels)
	}
	cur, profile := a.config.Current()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if err.Error() != a.configErr {
			a.logger.Error(err, "Bad node configuration; keeping the last good one", "profile", profile, "config", cur)
		}
		a.configErr = err.Error()
		return
	}
	a.configErr = ""
	if changed {
		a.logger.Info("Node configuration applied", "profile", profile, "config", cur.NodeConfig, "migLayout", cur.MIGLayout)
		for _, n := range cur.Notes {
			a.logger.Info("Profile field accepted and not used", "profile", profile, "note", n)
		}
	}
}

// Patches returns how many times the inventory was written.
func (a *Agent) Patches() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.patches
}

// ConfigError returns the last configuration error, "" when the current
// configuration applied cleanly.
func (a *Agent) ConfigError() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.configErr
}

func (a *Agent) publish(ctx context.Context, node *v1.Node, inv *api.NodeInventory) error {
	b, err := api.EncodeInventory(inv)
	if err != nil {
		return err
	}
	val := string(b)
	cached := node.Annotations[api.AnnotationInventory]
	a.mu.Lock()
	if cached == val {
		a.synced = true
	}
	// Unchanged, or written by us and our cache has not caught up yet. Once
	// it has, any other value (someone removed or edited it) is rewritten.
	skip := cached == val || (a.published == val && !a.synced && a.stale == cached)
	a.mu.Unlock()
	if skip {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationInventory: val}}})
	if err != nil {
		return err
	}
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.opts.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	a.mu.Lock()
	a.published, a.stale, a.synced = val, cached, false
	a.patches++
	a.mu.Unlock()
	a.logger.Info("Inventory published", "node", a.opts.NodeName, "gpus", len(inv.GPUs))
	return nil
}

// unpublish removes the inventory annotation (a node whose GPUs another
// scheduler places).
func (a *Agent) unpublish(ctx context.Context, node *v1.Node) error {
	if _, ok := node.Annotations[api.AnnotationInventory]; !ok {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{api.AnnotationInventory: nil}}})
	if err != nil {
		return err
	}
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.opts.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	a.mu.Lock()
	a.published, a.stale, a.synced = "", "", false
	a.mu.Unlock()
	a.logger.Info("Inventory withdrawn: the node's GPUs are placed by Volcano (mode volcano)", "node", a.opts.NodeName)
	return nil
}
