package nodeagent

import (
	"context"

	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draRun is the node's DRA kubelet plugin (docs/dra.md). It serves while
// the node's profile says mode dra; on a node turned back to the device
// plugin it keeps serving, with no devices, until the claims it prepared
// are unprepared (the kubelet needs it for that), then stops.
type draRun struct {
	driver  *dra.Driver
	running bool
	sys     dra.System
	err     string // last start error reported
}

// DRADriver returns the DRA driver (nil before the node first turned to
// mode dra).
func (a *Agent) DRADriver() *dra.Driver {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dra.driver
}

// syncDRA runs the DRA driver with the inventory's GPUs when the node is
// in mode dra, and otherwise winds it down.
func (a *Agent) syncDRA(ctx context.Context, cfg api.NodeConfig, inv *api.NodeInventory) {
	if a.opts.NoPlugin || a.runCtx == nil {
		return
	}
	dr := a.DRADriver()
	if cfg.Mode != api.ModeDRA {
		if dr == nil || !a.dra.running {
			return
		}
		if err := dr.SetGPUs(ctx, nil, a.dra.sys); err != nil {
			a.logger.Error(err, "Withdrawing the node's ResourceSlice")
		}
		if len(dr.Prepared()) == 0 {
			dr.Stop()
			a.dra.running = false
			a.logger.Info("DRA kubelet plugin stopped: the node serves its GPUs through the device plugin", "driver", api.DRADriverName)
		}
		return
	}
	if dr == nil {
		o := a.opts.DRA
		o.NodeName, o.Client, o.Names, o.Paths = a.opts.NodeName, a.client, a.names, a.opts.Paths
		o.Pods = podGetter{lister: a.pods, client: a.client}.GetPod
		a.devMu.Lock()
		o.Recorder = a.recorder
		a.devMu.Unlock()
		var err error
		if dr, err = dra.New(o, a.logger.WithName("dra")); err != nil {
			a.reportDRA(err)
			return
		}
		a.mu.Lock()
		a.dra.driver = dr
		a.mu.Unlock()
	}
	handles := make(map[string]int, len(a.devices))
	for i, d := range a.devices {
		handles[d.GPU.UUID] = i
	}
	gpus := make([]dra.GPU, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		if i, ok := handles[g.UUID]; ok {
			gpus = append(gpus, dra.ReadGPU(g, a.devices[i].Handle))
		} else {
			gpus = append(gpus, dra.GPU{GPU: g})
		}
	}
	if err := dr.SetGPUs(ctx, gpus, a.dra.sys); err != nil {
		a.logger.Error(err, "Publishing the node's ResourceSlice")
	}
	if !a.dra.running {
		if err := dr.Start(a.runCtx); err != nil {
			a.reportDRA(err)
			return
		}
		a.dra.running, a.dra.err = true, ""
		a.logger.Info("DRA kubelet plugin started", "driver", api.DRADriverName, "gpus", len(gpus))
	}
}

func (a *Agent) reportDRA(err error) {
	if err.Error() != a.dra.err {
		a.logger.Error(err, "DRA kubelet plugin not running; will retry")
	}
	a.dra.err = err.Error()
}

// collectDRA unprepares claims that no longer exist.
func (a *Agent) collectDRA(ctx context.Context) {
	if dr := a.DRADriver(); dr != nil && a.dra.running {
		dr.Collect(ctx)
	}
}

func (a *Agent) stopDRA() {
	if dr := a.DRADriver(); dr != nil && a.dra.running {
		dr.Stop()
		a.dra.running = false
	}
}
