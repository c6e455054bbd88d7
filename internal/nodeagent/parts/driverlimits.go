package parts

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
)

// DriverLimitsOptions are what the driver-limits part needs.
type DriverLimitsOptions struct {
	Lib    nvml.Interface
	State  statedir.Dirs
	Limits *deviceplugin.DriverLimits
	// Confirms lists the confirmations of DRA claim requests whose memory
	// the driver holds (the DRA part's); nil: none.
	Confirms func() []string
	// Interval is how often the containers' confirmations are checked
	// (default 1 s): a container whose processes are gone has its limits
	// cleared before its runtime removes its group.
	Interval time.Duration
	Logger   klog.Logger
}

// DriverLimits keeps the driver's memory limits to the containers that
// run (memlimits.Reconcile): at start it sets the limits of the running
// containers again, then clears those of containers whose processes are
// gone, and removes the CDI specs of containers the agent no longer
// records.
type DriverLimits struct {
	opts DriverLimitsOptions
	wg   sync.WaitGroup
	// seen are the DRA confirmations a pass found confirmed: a claim's
	// is listed only once the DRA driver has read its checkpoint, after
	// this part's first pass, so its limits are set again the first time
	// it is seen confirmed.
	seen map[string]bool
}

// NewDriverLimits returns the part.
func NewDriverLimits(o DriverLimitsOptions) *DriverLimits {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	return &DriverLimits{opts: o, seen: map[string]bool{}}
}

// Start implements Part.
func (d *DriverLimits) Start(ctx context.Context, _ Cluster) error {
	d.Pass(true)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		wait.UntilWithContext(ctx, func(context.Context) { d.Pass(false) }, d.opts.Interval)
	}()
	return nil
}

// Reconcile implements Part.
func (d *DriverLimits) Reconcile(context.Context, *Node) {}

// Stop implements Part.
func (d *DriverLimits) Stop() { d.wg.Wait() }

// Pass reconciles every recorded container once (reapply: the first
// pass after the agent's start).
func (d *DriverLimits) Pass(reapply bool) {
	log := d.opts.Logger
	entries, err := d.opts.State.Entries()
	if err != nil {
		log.Error(err, "Listing the containers' directories for the driver's memory limits")
		return
	}
	for _, e := range entries {
		d.reconcile(d.opts.State.ConfirmFile(e.PodUID, e.Container), reapply, "podUID", e.PodUID, "container", e.Container)
	}
	if d.opts.Confirms != nil {
		listed := map[string]bool{}
		for _, f := range d.opts.Confirms() {
			listed[f] = true
			d.reconcile(f, reapply || !d.seen[f], "confirmation", f)
		}
		for f := range d.seen {
			if !listed[f] {
				delete(d.seen, f) // its claim was unprepared
			}
		}
	}
	d.removeSpecs()
}

// reconcile brings the driver's table in line with one confirmation.
func (d *DriverLimits) reconcile(confirm string, reapply bool, kv ...any) {
	log := d.opts.Logger
	out, c, err := memlimits.Reconcile(d.opts.Lib, confirm, reapply)
	if c.Cgroup != "" && out != memlimits.Released && out != memlimits.Lost {
		d.seen[confirm] = true
	} else {
		delete(d.seen, confirm)
	}
	kv = append(kv, "cgroup", c.Cgroup)
	switch {
	case out == memlimits.Lost:
		log.Error(err, "The container's group went before its memory limits were cleared; the driver may keep its soft limit reserved", kv...)
	case err != nil:
		log.Error(err, "The driver's memory limits of a container", append(kv, "outcome", out)...)
	case out == memlimits.Reapplied:
		log.Info("Set the driver's memory limits of a running container again", append(kv, "grants", c.Grants)...)
	case out == memlimits.Released:
		log.V(2).Info("Cleared the driver's memory limits of a stopped container", kv...)
	}
}

// removeSpecs removes the CDI specs of containers the agent no longer
// records (their pods are gone and their directories removed).
func (d *DriverLimits) removeSpecs() {
	l := d.opts.Limits
	files, _ := filepath.Glob(filepath.Join(l.CDIDir, "*.json"))
	for _, f := range files {
		uid, container, ok := l.SpecOf(filepath.Base(f))
		if !ok || d.opts.State.Served(types.UID(uid), container) {
			continue
		}
		if err := l.RemoveSpec(types.UID(uid), container); err != nil {
			d.opts.Logger.Error(err, "Removing the CDI spec of a container that is gone", "spec", f)
		}
	}
}
