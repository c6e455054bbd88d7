// Package nodeagent is Tessera's node agent: it discovers the node's GPUs
// through NVML, watches their health, publishes the node's inventory on
// its Node object when it changes, applies the node's configuration
// profile, serves the kubelet device plugin and removes per-container
// state of pods that are gone.
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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/mps"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nodelabels"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
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
	// NoPlugin skips the device plugin (tests of publishing only).
	NoPlugin bool
	// MPSControl runs nvidia-cuda-mps-control (path and leading
	// arguments; default "nvidia-cuda-mps-control" from $PATH), for nodes
	// in mps mode.
	MPSControl []string
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
	// PluginSocketDir, if set, is where the device plugins serve, one
	// socket per resource (kubeletshim.AgentSocketName), for the
	// kubelet-facing shim, which registers with the kubelet in their
	// stead.
	PluginSocketDir string
	// Reconcile configures the host-side check of what containers hold
	// on the GPUs against their grants; it runs when Interval > 0.
	Reconcile reconcile.Options
	// MetricsAddress is where the Prometheus metrics are served
	// ("host:port"; empty: not served). See observe.go.
	MetricsAddress string
}

// Agent is one node's agent.
type Agent struct {
	opts    Options
	client  kubernetes.Interface
	logger  klog.Logger
	devices []discovery.Device
	monitor *health.Monitor
	config  *config.Store
	plugin  *deviceplugin.Plugin
	state   statedir.Dirs
	names   api.ResourceNames

	// devMu guards devices' MIG state, changed by the reconcile loop and
	// by Allocate (dynamic MIG).
	devMu      sync.Mutex
	migReports map[string]string
	created    map[string]owner // dynamic instances: "<gpu>/<inst>" → the pod
	mps        *mps.Manager
	mpsErr     string
	// plugins serve one resource each (reconcile starts and stops them).
	plugins map[string]*pluginRun
	// withdrawn: plugins of resources no longer offered that keep serving
	// an empty list to the kubelet shim (syncPlugins).
	withdrawn map[string]*pluginRun
	// offeredRead: the previous agent's served resources were read;
	// offeredWritten: what this one last wrote (plugins.go).
	offeredRead    bool
	offeredWritten string
	runCtx         context.Context
	wg             sync.WaitGroup
	// recorder posts Node events (MIG layout reports); nil before Run.
	recorder record.EventRecorder
	// dra is the DRA kubelet plugin (nodes in mode dra).
	dra draRun

	nodes   corelisters.NodeLister
	cms     corelisters.ConfigMapLister
	pods    corelisters.PodLister
	trigger chan struct{}
	metrics *agentMetrics
	// guardCfg is the device plugins' checks of records (trust.go); set
	// by Run before the first plugin starts.
	guardCfg *deviceplugin.Guard

	mu        sync.Mutex
	published string // last inventory we wrote on the Node
	stale     string // the annotation our cache held when we wrote it
	synced    bool   // our cache has shown what we wrote
	patches   int
	configErr string // last configuration error reported

	// driver, lastInv, podsForMetrics and metricsAddr feed the labels and
	// metrics (observe.go).
	driver         nodelabels.Driver
	lastInv        *api.NodeInventory
	podsForMetrics corelisters.PodLister
	metricsAddr    string
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
	handles := map[string]nvml.Device{}
	for _, d := range res.Devices {
		handles[d.GPU.UUID] = d.Handle
	}
	a := &Agent{
		opts: opts, client: client, logger: logger, devices: res.Devices,
		monitor:   health.New(lib, handles, opts.Health, logger.WithName("health")),
		config:    config.NewStore(names),
		names:     names,
		state:     statedir.Dirs{Root: opts.Paths.StateRoot},
		trigger:   make(chan struct{}, 1),
		plugins:   map[string]*pluginRun{},
		withdrawn: map[string]*pluginRun{},
		metrics:   newAgentMetrics(),
		driver:    driverInfo(lib),
	}
	cmd := opts.MPSControl
	if len(cmd) == 0 {
		cmd = []string{"nvidia-cuda-mps-control"}
	}
	root := opts.MPSRoot
	if root == "" {
		root = mps.DefaultRoot
	}
	a.mps = &mps.Manager{Command: cmd, Root: root, Logger: logger.WithName("mps")}
	a.dra.sys = dra.ReadSystem(lib)
	return a, nil
}

// Devices returns the discovered GPUs.
func (a *Agent) Devices() []discovery.Device { return a.devices }

// Plugin returns the device plugin (nil before Run creates it).
func (a *Agent) Plugin() *deviceplugin.Plugin {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.plugin
}

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
	a.logger.Info("Waiting for the API caches (Node, pods on the node, ConfigMap)", "node", a.opts.NodeName, "gpus", len(a.devices))
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}

	defer a.wg.Wait()
	defer a.stopPlugins()
	if a.opts.MetricsAddress != "" {
		if err := a.serveMetrics(ctx); err != nil {
			return fmt.Errorf("metrics address %q: %w", a.opts.MetricsAddress, err)
		}
	}
	defer a.stopDRA()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.monitor.Run(ctx); err != nil {
			a.logger.Error(err, "Health monitor stopped; GPU errors will not be detected")
		}
	}()
	a.runCtx = ctx
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	a.devMu.Lock()
	a.recorder = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "tessera-node-agent", Host: a.opts.NodeName})
	a.devMu.Unlock()
	if !a.opts.NoPlugin {
		if err := a.opts.Paths.WritePreload(); err != nil {
			return fmt.Errorf("writing %s: %w", a.opts.Paths.PreloadHost, err)
		}
		guard, err := a.guard(ctx, &a.wg)
		if err != nil {
			return err
		}
		a.mu.Lock()
		a.guardCfg = guard
		a.mu.Unlock()
		if a.opts.Reconcile.Interval > 0 {
			r := a.reconciler()
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				r.Run(ctx)
			}()
		}
	}
	// MPS daemons are not stopped here: a stopped agent leaves them to
	// their clients (a DaemonSet restart ends them with the container;
	// the next agent starts them again, docs/mig-mps.md).
	tick := time.NewTicker(a.opts.Resync)
	defer tick.Stop()
	// On an MPS node the control daemons are checked (and started again
	// when they died) at least this often.
	mpsTick := time.NewTicker(mpsCheck)
	defer mpsTick.Stop()
	skip := false
	for {
		if !skip {
			a.reconcile(ctx)
		}
		skip = false
		select {
		case <-ctx.Done():
			return nil
		case <-a.trigger:
		case <-a.monitor.Changes():
		case <-tick.C:
			a.collect()
			a.collectDRA(ctx)
		case <-mpsTick.C:
			cfg, _ := a.config.Current()
			skip = cfg.Sharing != api.SharingMPS
		}
	}
}

// reconcile applies configuration and health: the device plugin's list
// and the Node's inventory annotation (written only when it changed).
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
	a.reconcileMIG(cfg)
	a.devMu.Lock()
	inv, offer := BuildInventory(a.devices, a.monitor.Snapshot(), cfg.NodeConfig, a.names)
	a.devMu.Unlock()
	a.remember(inv)
	a.syncPlugins(cfg, offer, node != nil && (a.cms == nil || a.ConfigError() == ""))
	a.syncDRA(ctx, cfg.NodeConfig, inv)
	a.reconcileMPS(ctx, cfg, inv)
	if node == nil {
		return
	}
	err = a.publish(ctx, node, inv)
	if err == nil {
		err = a.publishLabels(ctx, node, inv)
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
		if cur.MPSRoot != "" && a.mps != nil {
			a.mps.Root = cur.MPSRoot
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

// collect removes the state directories of pods no longer on the node.
func (a *Agent) collect() {
	pods, err := a.pods.List(labels.Everything())
	if err != nil {
		a.logger.Error(err, "Listing pods to remove state directories")
		return
	}
	running := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		if p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			running[p.UID] = true
		}
	}
	live := func(uid types.UID) bool { return running[uid] }
	removed, err := a.state.GC(live, 2*a.opts.Resync, time.Now())
	if err != nil {
		a.logger.Error(err, "Removing state directories of finished pods")
	}
	if len(removed) > 0 {
		a.logger.Info("Removed state directories of finished pods", "pods", removed)
	}
}

// podGetter reads pods from the informer cache and, on a miss, from the
// API server: the kubelet may see a pod before our cache does. A cached
// pod is complete: the scheduler writes the allocation record in the same
// write that binds the pod (or before it), and the cache only holds bound
// pods.
type podGetter struct {
	lister corelisters.PodLister
	client kubernetes.Interface
}

func (g podGetter) GetPod(ctx context.Context, ns, name string) (*v1.Pod, error) {
	if p, err := g.lister.Pods(ns).Get(name); err == nil {
		return p, nil
	}
	return g.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}
