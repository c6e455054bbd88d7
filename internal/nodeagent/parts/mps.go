package parts

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/mps"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// mpsCheck is how often an MPS node's control daemons are checked (and
// started again when they died), besides every reconcile.
const mpsCheck = 5 * time.Second

// MPSOptions are what the MPS part needs.
type MPSOptions struct {
	NodeName string
	// Control runs nvidia-cuda-mps-control (path and leading arguments;
	// default "nvidia-cuda-mps-control" from $PATH).
	Control []string
	// Root is the host directory of the daemons' pipes and logs (default
	// mps.DefaultRoot; a profile's flags.mpsRoot wins).
	Root   string
	Logger klog.Logger
}

// MPS runs the MPS control daemons of a node in mps mode, one per GPU
// (docs/mig-mps.md), and stops them on a node turned to another mode.
// A stopped agent leaves them to their clients (a DaemonSet restart ends
// them with the container; the next agent starts them again).
type MPS struct {
	manager *mps.Manager
	opts    MPSOptions
	pods    corelisters.PodLister
	errMsg  string      // last error reported
	on      atomic.Bool // the node is in mps mode
	wg      sync.WaitGroup
}

// NewMPS returns the MPS part.
func NewMPS(opts MPSOptions) *MPS {
	if len(opts.Control) == 0 {
		opts.Control = []string{"nvidia-cuda-mps-control"}
	}
	if opts.Root == "" {
		opts.Root = mps.DefaultRoot
	}
	return &MPS{opts: opts, manager: &mps.Manager{Command: opts.Control, Root: opts.Root, Logger: opts.Logger.WithName("mps")}}
}

// Manager is the daemons' manager.
func (m *MPS) Manager() *mps.Manager { return m.manager }

// PipeDir is the host directory of GPU uuid's daemon pipes (the device
// plugins hand it to MPS clients).
func (m *MPS) PipeDir(uuid string) string { return m.manager.PipeDir(uuid) }

// Start implements Part: while the node is in mps mode it asks for a
// reconcile every mpsCheck, so a daemon that died is started again.
func (m *MPS) Start(ctx context.Context, c Cluster) error {
	m.pods = c.Pods
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(mpsCheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if m.on.Load() {
					c.Poke()
				}
			}
		}
	}()
	return nil
}

// Stop implements Part; the daemons keep running (see MPS).
func (m *MPS) Stop() { m.wg.Wait() }

// Reconcile implements Part: on a node in mps mode each GPU's daemon
// runs, its servers bounded by the largest share a client of it holds
// (an equal 1/replicas when no pod is there yet); otherwise none runs.
func (m *MPS) Reconcile(ctx context.Context, n *Node) {
	cfg := n.Config
	if cfg.MPSRoot != "" && cfg.MPSRoot != m.manager.Root {
		m.manager.Root = cfg.MPSRoot
	}
	m.on.Store(cfg.Sharing == api.SharingMPS)
	var gpus []mps.GPU
	if cfg.Sharing == api.SharingMPS {
		most := map[string]mps.Limits{}
		for _, g := range nodeGrants(m.pods, m.opts.NodeName, nil, func(p *v1.Pod) bool { return !finished(p) }) {
			l := most[g.UUID]
			l.ThreadPercent = max(l.ThreadPercent, deviceplugin.MPSThreadPercent(g.Cores, 100/max(cfg.SharesPerGPU, 1)))
			l.PinnedMiB = max(l.PinnedMiB, g.MemoryMiB)
			most[g.UUID] = l
		}
		for _, g := range n.Inventory.GPUs {
			l, ok := most[g.UUID]
			if !ok || l.ThreadPercent == 0 {
				l.ThreadPercent = max(1, 100/max(g.MaxShares, 1))
			}
			if !ok {
				l.PinnedMiB = g.MemoryMiB / int64(max(g.MaxShares, 1))
			}
			l.ThreadPercent = min(l.ThreadPercent, 100)
			gpus = append(gpus, mps.GPU{UUID: g.UUID, Limits: l})
		}
	}
	if err := m.manager.Ensure(ctx, gpus); err != nil {
		if err.Error() != m.errMsg {
			m.opts.Logger.Error(err, "MPS control daemons")
		}
		m.errMsg = err.Error()
		return
	}
	m.errMsg = ""
}
