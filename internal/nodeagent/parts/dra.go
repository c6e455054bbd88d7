package parts

import (
	"context"
	"sync"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/nodeagent/metrics"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// DRAOptions are what the DRA part needs.
type DRAOptions struct {
	// Driver configures the driver; the part fills in Pods and Recorder.
	Driver dra.Options
	// System is the node's driver and CUDA versions (dra.ReadSystem).
	System  dra.System
	Devices *Devices
	Logger  klog.Logger
}

// DRA is the node's DRA kubelet plugin (docs/dra.md). It serves while the
// node's profile says mode dra; on a node turned back to the device
// plugin it keeps serving, with no devices, until the claims it prepared
// are unprepared (the kubelet needs it for that), then stops.
type DRA struct {
	opts    DRAOptions
	ctx     context.Context // Start's
	running bool
	errMsg  string // last start error reported

	mu     sync.Mutex
	driver *dra.Driver
	// known: the part has reconciled with the Node's configuration and,
	// in mode dra, read the claims it prepared (the driver's checkpoint).
	known bool
}

// NewDRA returns the DRA part.
func NewDRA(opts DRAOptions) *DRA { return &DRA{opts: opts} }

// Driver returns the DRA driver (nil before the node first turned to mode
// dra).
func (d *DRA) Driver() *dra.Driver {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.driver
}

// Start implements Part.
func (d *DRA) Start(ctx context.Context, c Cluster) error {
	d.ctx = ctx
	d.opts.Driver.Pods = PodGetter{Lister: c.Pods, Client: d.opts.Driver.Client}.GetPod
	d.opts.Driver.Recorder = c.Recorder
	return nil
}

// Reconcile implements Part: the driver runs with the inventory's GPUs
// when the node is in mode dra, and otherwise winds down.
func (d *DRA) Reconcile(ctx context.Context, n *Node) {
	dr := d.Driver()
	if n.Configured && (n.Config.Mode != api.ModeDRA || dr != nil) {
		d.setKnown()
	}
	if n.Config.Mode != api.ModeDRA {
		if dr == nil || !d.running {
			return
		}
		if err := dr.SetGPUs(ctx, nil, d.opts.System); err != nil {
			d.opts.Logger.Error(err, "Withdrawing the node's ResourceSlice")
		}
		if len(dr.Prepared()) == 0 {
			dr.Stop()
			d.running = false
			d.opts.Logger.Info("DRA kubelet plugin stopped: the node serves its GPUs through the device plugin", "driver", api.DRADriverName)
		}
		return
	}
	if dr == nil {
		var err error
		if dr, err = dra.New(d.opts.Driver, d.opts.Logger.WithName("dra")); err != nil {
			d.report(err)
			return
		}
		d.mu.Lock()
		d.driver = dr
		d.mu.Unlock()
		if n.Configured {
			d.setKnown()
		}
	}
	handles := d.opts.Devices.Handles()
	gpus := make([]dra.GPU, 0, len(n.Inventory.GPUs))
	for _, g := range n.Inventory.GPUs {
		if h, ok := handles[g.UUID]; ok {
			gpus = append(gpus, dra.ReadGPU(g, h))
		} else {
			gpus = append(gpus, dra.GPU{GPU: g})
		}
	}
	if err := dr.SetGPUs(ctx, gpus, d.opts.System); err != nil {
		d.opts.Logger.Error(err, "Publishing the node's ResourceSlice")
	}
	if !d.running {
		if err := dr.Start(d.ctx); err != nil {
			d.report(err)
			return
		}
		d.running, d.errMsg = true, ""
		d.opts.Logger.Info("DRA kubelet plugin started", "driver", api.DRADriverName, "gpus", len(gpus))
	}
}

func (d *DRA) setKnown() {
	d.mu.Lock()
	d.known = true
	d.mu.Unlock()
}

// ClaimsKnown reports whether Claims lists every claim the node's DRA
// driver prepared: once the part has reconciled with the Node's
// configuration (not the defaults) and, on a node in mode dra, the
// driver has read its checkpoint. Before that, after a restart of the
// agent, claims prepared by the previous agent are missing from Claims.
func (d *DRA) ClaimsKnown() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.known
}

func (d *DRA) report(err error) {
	if err.Error() != d.errMsg {
		d.opts.Logger.Error(err, "DRA kubelet plugin not running; will retry")
	}
	d.errMsg = err.Error()
}

// Resync implements Resyncer: claims that no longer exist are
// unprepared.
func (d *DRA) Resync(ctx context.Context) {
	if dr := d.Driver(); dr != nil && d.running {
		dr.Collect(ctx)
	}
}

// Stop implements Part.
func (d *DRA) Stop() {
	if dr := d.Driver(); dr != nil && d.running {
		dr.Stop()
		d.running = false
	}
}

// Claims lists the DRA claims prepared on the node, with each request's
// GPUs in the order of its limits file (for the metrics).
func (d *DRA) Claims() []metrics.Claim {
	dr := d.Driver()
	if dr == nil {
		return nil
	}
	var out []metrics.Claim
	for _, p := range dr.Prepared() {
		c := metrics.Claim{Namespace: p.Namespace, Name: p.Name}
		for _, r := range p.Requests {
			cr := metrics.ClaimRequest{Request: r.Request, StateFile: r.StateFile(), Confirm: r.Confirm, Borrower: dra.Borrower(p.UID, r.Request)}
			for _, g := range p.Grants {
				if g.Request == r.Request {
					cr.Devices = append(cr.Devices, metrics.ClaimDevice{UUID: g.UUID, MemoryMiB: g.MemoryMiB, CeilingMiB: g.CeilingMiB, Cores: g.Cores, Whole: g.Whole, Admin: g.Admin})
				}
			}
			c.Requests = append(c.Requests, cr)
		}
		out = append(out, c)
	}
	return out
}

// Confirms lists the confirmations of the driver-held memory limits of
// the claims the node's DRA driver prepared (DriverLimitsOptions).
func (d *DRA) Confirms() []string {
	dr := d.Driver()
	if dr == nil {
		return nil
	}
	var out []string
	for _, p := range dr.Prepared() {
		for _, r := range p.Requests {
			if r.Confirm != "" {
				out = append(out, r.Confirm)
			}
		}
	}
	return out
}
