package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/api"
)

type kubeletDevice = kubeletplugin.Device

// Event reasons the driver posts on ResourceClaims.
const (
	ReasonPrepareFailed = "TesseraPrepareFailed"
	ReasonPrepared      = "TesseraPrepared"
)

// Options configure the driver.
type Options struct {
	NodeName string
	Client   kubernetes.Interface
	// Names are the pod resource names (to recognise a HAMi-style share
	// that reached a DRA node through the extended-resource mapping).
	Names api.ResourceNames
	// Paths are the limiter's paths on the host and in containers (the
	// device plugin's, one home for them).
	Paths deviceplugin.Paths
	// ClaimRoot is the host directory of the per-claim limiter files
	// (<root>/<claim UID>/<request>/{state/,limiter.conf}) and of the
	// checkpoint; default /var/lib/tessera/claims.
	ClaimRoot string
	// CDIDir is where CDI specs are written (the container runtime reads
	// it); default /var/run/cdi.
	CDIDir string
	// PluginDataDir is the kubelet plugin's directory (its dra.sock);
	// default /var/lib/kubelet/plugins/gpu.tessera.io.
	PluginDataDir string
	// RegistrarDir is the kubelet's plugin registration directory;
	// default /var/lib/kubelet/plugins_registry.
	RegistrarDir string
	// Pods reads a pod (informer cache first); nil: from the API.
	Pods func(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// Recorder posts events on claims; nil: none.
	Recorder record.EventRecorder
	// DriverLimits, when the driver partitions GPU memory per cgroup,
	// holds the memory of a claim request's one container (soft = its
	// guarantee, hard = its ceiling) through the device plugins' hook;
	// nil: the limiter holds it.
	DriverLimits *deviceplugin.DriverLimits
	// ReleaseConfirmed clears the driver's limits a confirmation names
	// (memlimits.ReleaseConfirmed), when a claim is unprepared.
	ReleaseConfirmed func(confirm string) error
	// Admitted, if set, runs once claims were prepared, before the
	// kubelet starts their containers: the reconciler's budget part
	// (reconcile.Reconciler.Admitted) writes the GPUs' budget files and
	// reclaims memory borrowed past guarantees that the new claims need.
	Admitted func()
}

// DefaultOptions are the paths of the DaemonSet in deploy/node-agent.
func DefaultOptions() Options {
	return Options{
		ClaimRoot:     "/var/lib/tessera/claims",
		CDIDir:        cdiapi.DefaultDynamicDir,
		PluginDataDir: filepath.Join(kubeletplugin.KubeletPluginsDir, api.DRADriverName),
		RegistrarDir:  kubeletplugin.KubeletRegistryDir,
	}
}

// Driver is the DRA kubelet plugin of one node.
type Driver struct {
	opts   Options
	logger klog.Logger
	cdi    *cdiapi.Cache

	mu       sync.Mutex
	gpus     map[string]GPU // published devices by name
	devices  []resourceapi.Device
	prepared map[types.UID]*Prepared
	helper   *kubeletplugin.Helper
	// missing counts the collect rounds a prepared claim was not found
	// in the API (it is unprepared after two).
	missing map[types.UID]int
}

// New loads the checkpoint and prepares the CDI directory.
func New(opts Options, logger klog.Logger) (*Driver, error) {
	def := DefaultOptions()
	if opts.ClaimRoot == "" {
		opts.ClaimRoot = def.ClaimRoot
	}
	if opts.CDIDir == "" {
		opts.CDIDir = def.CDIDir
	}
	if opts.PluginDataDir == "" {
		opts.PluginDataDir = def.PluginDataDir
	}
	if opts.RegistrarDir == "" {
		opts.RegistrarDir = def.RegistrarDir
	}
	if opts.NodeName == "" {
		return nil, errors.New("node name is empty")
	}
	prepared, err := loadCheckpoint(opts.checkpoint())
	if err != nil {
		return nil, err
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(opts.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI directory %s: %w", opts.CDIDir, err)
	}
	return &Driver{opts: opts, logger: logger, cdi: cache, gpus: map[string]GPU{}, prepared: prepared, missing: map[types.UID]int{}}, nil
}

func (o Options) checkpoint() string { return filepath.Join(o.ClaimRoot, "checkpoint.json") }

// Start registers the plugin with the kubelet and starts publishing the
// node's ResourceSlice (the devices of the last SetGPUs). It returns once
// both sockets serve; Stop ends them.
func (d *Driver) Start(ctx context.Context) error {
	for _, dir := range []string{d.opts.PluginDataDir, d.opts.RegistrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	h, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(api.DRADriverName),
		kubeletplugin.NodeName(d.opts.NodeName),
		kubeletplugin.KubeClient(d.opts.Client),
		kubeletplugin.PluginDataDirectoryPath(d.opts.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(d.opts.RegistrarDir),
		kubeletplugin.GRPCVerbosity(5),
	)
	if err != nil {
		return fmt.Errorf("starting the DRA kubelet plugin %s: %w", api.DRADriverName, err)
	}
	d.mu.Lock()
	d.helper = h
	devs := d.devices
	d.mu.Unlock()
	if devs != nil {
		return d.publish(ctx, devs)
	}
	return nil
}

// Stop unregisters the plugin and stops publishing; the ResourceSlice
// stays (the kubelet removes it if the driver does not come back).
func (d *Driver) Stop() {
	d.mu.Lock()
	h := d.helper
	d.helper = nil
	d.mu.Unlock()
	h.Stop()
}

// SetGPUs sets the GPUs the node offers and republishes the slice when it
// changed.
func (d *Driver) SetGPUs(ctx context.Context, gpus []GPU, sys System) error {
	devs := Devices(gpus, sys)
	byName := make(map[string]GPU, len(gpus))
	for _, g := range gpus {
		byName[DeviceName(g.Index)] = g
	}
	d.mu.Lock()
	d.gpus = byName
	changed := !reflect.DeepEqual(devs, d.devices)
	d.devices = devs
	started := d.helper != nil
	d.mu.Unlock()
	if !changed || !started {
		return nil
	}
	return d.publish(ctx, devs)
}

func (d *Driver) publish(ctx context.Context, devs []resourceapi.Device) error {
	d.mu.Lock()
	h := d.helper
	d.mu.Unlock()
	if h == nil {
		return nil
	}
	d.logger.Info("Publishing the ResourceSlice", "node", d.opts.NodeName, "devices", len(devs))
	return h.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.opts.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}})
}

// Prepared returns the prepared claims, by UID.
func (d *Driver) Prepared() map[types.UID]Prepared {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]Prepared, len(d.prepared))
	for k, v := range d.prepared {
		out[k] = *v
	}
	return out
}

// PrepareResourceClaims prepares each claim: checks its allocation against
// this node's GPUs and every claim prepared before, writes its limiter
// files and CDI spec, and records it in the checkpoint. A claim prepared
// before gets the same answer. A failure leaves nothing of that claim
// and is posted as a Warning event on it.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	admitted := false
	for _, c := range claims {
		devs, err := d.prepare(ctx, c)
		if err != nil {
			err = fmt.Errorf("%s: %w", api.DRADriverName, err)
			d.logger.Error(err, "Claim not prepared", "claim", klog.KObj(c))
			d.event(c, corev1.EventTypeWarning, ReasonPrepareFailed, err.Error())
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
		admitted = true
	}
	if admitted && d.opts.Admitted != nil {
		d.opts.Admitted()
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletDevice, error) {
	d.mu.Lock()
	if p, ok := d.prepared[claim.UID]; ok {
		d.mu.Unlock()
		return p.devices(d.opts.NodeName), nil
	}
	gpus := d.gpus
	d.mu.Unlock()
	gs, err := grants(claim, d.opts.NodeName, gpus)
	if err != nil {
		return nil, err
	}
	cfgs, err := configs(claim, requestsOf(gs))
	if err != nil {
		return nil, err
	}
	if err := ceilings(gs, cfgs, gpus); err != nil {
		return nil, err
	}
	// Reads the claim's pods; done before taking the lock.
	if err := d.checkConsumers(ctx, claim); err != nil {
		return nil, err
	}
	sole := d.soleUsers(ctx, claim)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := checkFit(claim.UID, gs, tolerations(claim), d.prepared, d.gpus); err != nil {
		return nil, err
	}
	p, err := d.files(claim, gs, cfgs, sole)
	if err != nil {
		return nil, err
	}
	d.prepared[claim.UID] = p
	if err := saveCheckpoint(d.opts.checkpoint(), d.prepared); err != nil {
		delete(d.prepared, claim.UID)
		return nil, errors.Join(fmt.Errorf("writing the checkpoint: %w", err), d.remove(p))
	}
	d.logger.Info("Claim prepared", "claim", klog.KObj(claim), "uid", claim.UID, "grants", gs)
	return p.devices(d.opts.NodeName), nil
}

// UnprepareResourceClaims removes what prepare wrote for each claim; a
// claim not prepared (or already unprepared) is done.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.unprepare(c.UID)
		if out[c.UID] == nil {
			d.logger.Info("Claim unprepared", "claim", c.NamespacedName, "uid", c.UID)
		}
	}
	return out, nil
}

func (d *Driver) unprepare(uid types.UID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.prepared[uid]
	if !ok {
		return nil
	}
	d.release(p)
	if err := d.remove(p); err != nil {
		return err
	}
	delete(d.prepared, uid)
	delete(d.missing, uid)
	return saveCheckpoint(d.opts.checkpoint(), d.prepared)
}

// HandleError logs background errors (ResourceSlice publishing); they are
// all recoverable for this driver: the controller retries.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.logger.Error(err, msg)
}

// Collect unprepares claims the checkpoint holds that no longer exist in
// the API (deleted, or replaced under their name) on two calls in a row:
// the kubelet unprepares claims as their pods go, this catches what a
// kubelet that lost its own state never will. Call it now and then.
func (d *Driver) Collect(ctx context.Context) {
	d.mu.Lock()
	list := make([]Prepared, 0, len(d.prepared))
	for _, p := range d.prepared {
		list = append(list, *p)
	}
	d.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].UID < list[j].UID })
	for _, p := range list {
		c, err := d.opts.Client.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		gone := apierrors.IsNotFound(err) || (err == nil && c.UID != p.UID)
		if err != nil && !gone {
			continue
		}
		d.mu.Lock()
		if !gone {
			delete(d.missing, p.UID)
			d.mu.Unlock()
			continue
		}
		d.missing[p.UID]++
		n := d.missing[p.UID]
		d.mu.Unlock()
		if n < 2 {
			continue
		}
		if err := d.unprepare(p.UID); err != nil {
			d.logger.Error(err, "Removing the files of a claim that no longer exists", "claim", p.Namespace+"/"+p.Name, "uid", p.UID)
			continue
		}
		d.logger.Info("Unprepared a claim that no longer exists", "claim", p.Namespace+"/"+p.Name, "uid", p.UID, "since", time.Since(p.Prepared).Round(time.Second))
	}
}

func (d *Driver) event(claim *resourceapi.ResourceClaim, typ, reason, msg string) {
	if d.opts.Recorder != nil {
		d.opts.Recorder.Event(claim, typ, reason, msg)
	}
}

// Registered reports whether the kubelet accepted the plugin's
// registration.
func (d *Driver) Registered() bool {
	d.mu.Lock()
	h := d.helper
	d.mu.Unlock()
	if h == nil {
		return false
	}
	st := h.RegistrationStatus()
	return st != nil && st.PluginRegistered
}

// release clears the driver's memory limits of a claim's requests (their
// containers are gone) before their confirmations are removed. A failure
// is logged: the driver may keep the group's soft limit reserved.
func (d *Driver) release(p *Prepared) {
	for _, r := range p.Requests {
		if r.Confirm == "" || d.opts.ReleaseConfirmed == nil {
			continue
		}
		if err := d.opts.ReleaseConfirmed(r.Confirm); err != nil {
			d.logger.Error(err, "Clearing the driver's memory limits of an unprepared claim; the driver may keep its soft limit reserved", "claim", klog.KRef(p.Namespace, p.Name), "request", r.Request)
		}
	}
}
