// Package parts holds the node agent's per-mode parts and the seam they
// plug into.
//
// The agent's core (package nodeagent) discovers the GPUs, watches their
// health, applies the node's configuration profile, builds the node's
// inventory and publishes it. Everything a mode adds is a Part: it is
// built once from what it needs (its own options, never the agent),
// started once the agent's API caches have synced, told the node's
// configuration and inventory on every reconcile, and stopped when the
// agent stops. The parts, in the order the agent starts and reconciles
// them (internal/nodeagent/parts.go registers them):
//
//	MIG      (mig.go)      static layouts and dynamic instances; answers the device plugins' MIG grants
//	Trust    (trust.go)    the device plugins' checks of records, the host-side reconciler, their metrics
//	Plugins  (plugins.go)  one kubelet device plugin per resource offered; per-container state directories
//	Volcano  (volcano.go)  Volcano's vGPU protocol on nodes in mode volcano (registration, capacities, the grants' checks)
//	DRA      (dra.go)      the DRA kubelet plugin on nodes in mode dra
//	MPS      (mps.go)      the MPS control daemons on nodes in mps mode
//	Metrics  (metrics.go)  the Prometheus endpoint
//
// A new mode is a new file here: a type implementing Part (and, where it
// needs them, DevicePreparer and Resyncer), a constructor taking what it
// needs, and one line in the agent's registry. No part imports the agent.
package parts

import (
	"context"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Part is one mode's share of the node agent.
type Part interface {
	// Start is called once, after the agent's API caches have synced and
	// before the first reconcile. Goroutines it starts end with ctx; an
	// error stops the agent (the parts started before are stopped).
	Start(ctx context.Context, c Cluster) error
	// Reconcile is called on every reconcile, in registration order, with
	// the node's configuration and what the agent built from it, before
	// the inventory is published. It reports its own errors (logs,
	// events) and retries on a later reconcile.
	Reconcile(ctx context.Context, n *Node)
	// Stop is called once when the agent stops (its context has ended),
	// in reverse registration order, and returns when the part's
	// goroutines have.
	Stop()
}

// DevicePreparer is a part that changes the GPUs themselves (MIG mode,
// MIG instances): PrepareDevices runs on every reconcile before the
// inventory is built from the devices, so the inventory shows the result.
type DevicePreparer interface {
	PrepareDevices(cfg config.Node)
}

// Resyncer is a part with housekeeping on the agent's resync period
// (garbage of pods or claims that are gone).
type Resyncer interface {
	Resync(ctx context.Context)
}

// Cluster is what the agent's API caches give the parts once they have
// synced.
type Cluster struct {
	// Pods are the pods bound to this node (the agent's informer cache).
	Pods corelisters.PodLister
	// Nodes holds this node's Node (the agent's informer cache).
	Nodes corelisters.NodeLister
	// Recorder posts events as tessera-node-agent from this node.
	Recorder record.EventRecorder
	// Poke asks for a reconcile soon (coalesced with any pending one).
	Poke func()
}

// Node is what each reconcile tells the parts.
type Node struct {
	// Config is the node's configuration in force: its profile's, the
	// last good one when the profile is bad, the defaults before any.
	Config config.Node
	// Configured: the Node was read and its configuration applied
	// cleanly, so Config is the Node's and not the defaults.
	Configured bool
	// Inventory is what the agent publishes on the Node for Config.
	Inventory *api.NodeInventory
	// Offer is what the device plugins serve for Config.
	Offer Offer
}

// Offer is what the node's device plugins serve: per resource name, the
// devices listed to the kubelet.
type Offer map[string][]deviceplugin.GPU

// Devices are the node's GPUs as discovered. The list and the NVML
// handles are fixed for the agent's life; the MIG state of each device
// changes (the MIG part applies layouts and creates instances), so it is
// read and changed inside With.
type Devices struct {
	mu   sync.Mutex
	list []discovery.Device
}

// NewDevices holds the discovered devices.
func NewDevices(list []discovery.Device) *Devices { return &Devices{list: list} }

// With calls f with the devices, holding their lock; f must not keep the
// slice past its return.
func (d *Devices) With(f func(list []discovery.Device)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d.list)
}

// List returns a copy of the devices as they are now, taken under the
// lock (the MIG part changes their MIG state in place).
func (d *Devices) List() []discovery.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]discovery.Device(nil), d.list...)
}

// Handles returns the NVML handle of each GPU by UUID.
func (d *Devices) Handles() map[string]nvml.Device {
	h := make(map[string]nvml.Device, len(d.list))
	for _, dev := range d.list {
		h[dev.GPU.UUID] = dev.Handle
	}
	return h
}

// PodGetter reads pods from the informer cache and, on a miss, from the
// API server: the kubelet may see a pod before the agent's cache does. A
// cached pod is complete: the scheduler writes the allocation record in
// the same write that binds the pod (or before it), and the cache only
// holds bound pods.
type PodGetter struct {
	Lister corelisters.PodLister
	Client kubernetes.Interface
}

// GetPod returns the pod ns/name.
func (g PodGetter) GetPod(ctx context.Context, ns, name string) (*v1.Pod, error) {
	if g.Lister != nil {
		if p, err := g.Lister.Pods(ns).Get(name); err == nil {
			return p, nil
		}
	}
	return g.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// RecordReader reads a pod's grants as an allocation record.
type RecordReader func(*v1.Pod) (*api.PodAllocation, error)

// nodeGrants are the device grants of the records, for node, of the
// cached pods keep accepts, read by read (nil: Tessera's records).
func nodeGrants(pods corelisters.PodLister, node string, read RecordReader, keep func(*v1.Pod) bool) []api.DeviceGrant {
	if pods == nil {
		return nil
	}
	list, err := pods.List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []api.DeviceGrant
	for _, p := range list {
		if !keep(p) {
			continue
		}
		if read == nil {
			read = kubeobj.Record
		}
		rec, err := read(p)
		if err != nil || rec.Node != node {
			continue
		}
		for _, c := range rec.Containers {
			out = append(out, c.Devices...)
		}
	}
	return out
}

// gone reports a pod that is finished or being deleted.
func gone(p *v1.Pod) bool {
	return p.DeletionTimestamp != nil || finished(p)
}

// finished reports a pod that ran to its end.
func finished(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}
