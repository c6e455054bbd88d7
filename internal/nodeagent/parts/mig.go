package parts

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/migmgr"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// dynamicGrace is how long an instance the agent created for a pod is kept
// while the agent's cache does not show that pod yet (the kubelet may
// admit a pod before the agent's informer sees it); after that the API
// server is asked.
const dynamicGrace = 5 * time.Second

// MIGOptions are what the MIG part needs.
type MIGOptions struct {
	NodeName string
	Devices  *Devices
	// Health is the GPUs' health now (a MIG device of an unhealthy GPU
	// is not handed out).
	Health func() map[string]health.State
	// Client asks the API server about a pod the cache does not show.
	Client kubernetes.Interface
	// Protocol reads the grants of pods placed by another scheduler
	// (Volcano's mig mode: the volcano part), whose dynamic instances
	// are kept like those of Tessera's records.
	Protocol RecordReader
	Logger   klog.Logger
}

// MIG brings the GPUs to the node's MIG configuration (docs/mig-mps.md):
// a static layout applied with a report per GPU, or, for dynamic MIG,
// MIG mode on, the instances the device plugins' grants need created
// (Prepare) and those of pods that are gone destroyed.
type MIG struct {
	opts MIGOptions

	// Guarded by opts.Devices' lock, with the devices' MIG state.
	reports  map[string]string
	created  map[string]owner // dynamic instances: "<gpu>/<inst>" → the pod
	pods     corelisters.PodLister
	recorder record.EventRecorder
	poke     func()
}

// owner is the pod a dynamic instance was created for.
type owner struct {
	namespace, name string
	uid             types.UID
	at              time.Time
}

// NewMIG returns the MIG part.
func NewMIG(opts MIGOptions) *MIG {
	return &MIG{opts: opts, reports: map[string]string{}, created: map[string]owner{}}
}

// Start implements Part.
func (m *MIG) Start(_ context.Context, c Cluster) error {
	m.opts.Devices.With(func([]discovery.Device) {
		m.pods, m.recorder, m.poke = c.Pods, c.Recorder, c.Poke
	})
	return nil
}

// Reconcile implements Part: the work is done before the inventory is
// built (PrepareDevices).
func (m *MIG) Reconcile(context.Context, *Node) {}

// Stop implements Part. Instances stay: their pods may outlive the agent.
func (m *MIG) Stop() {}

// Reports returns the last report of applying the MIG layout, per GPU.
func (m *MIG) Reports() map[string]string {
	out := map[string]string{}
	m.opts.Devices.With(func([]discovery.Device) {
		for k, v := range m.reports {
			out[k] = v
		}
	})
	return out
}

// PrepareDevices implements DevicePreparer: a static layout applied
// (reported per GPU, logged when the report changes), or MIG mode on for
// dynamic MIG and the instances of pods that are gone destroyed. It
// re-reads every GPU's MIG devices.
func (m *MIG) PrepareDevices(cfg config.Node) {
	m.opts.Devices.With(func(devs []discovery.Device) {
		for i := range devs {
			d := &devs[i]
			switch {
			case cfg.Layout != nil:
				m.report(migmgr.Apply(d, cfg.Layout))
			case cfg.Sharing == api.SharingMIGDynamic && d.GPU.MIG.Capable:
				m.report(migmgr.EnableMIG(d))
			}
			if d.GPU.MIG.Capable {
				if err := d.RefreshMIG(); err != nil {
					m.opts.Logger.Error(err, "Reading MIG devices", "gpu", d.GPU.UUID)
				}
			}
		}
		if cfg.Sharing == api.SharingMIGDynamic {
			m.collectLocked(devs)
		}
	})
}

// report logs a GPU's layout report, and posts it as a Node event, when
// it changed.
func (m *MIG) report(r migmgr.Report) {
	if m.reports[r.UUID] == r.String() {
		return
	}
	m.reports[r.UUID] = r.String()
	node := &v1.ObjectReference{Kind: "Node", Name: m.opts.NodeName, UID: types.UID(m.opts.NodeName)}
	if r.Err != nil {
		m.opts.Logger.Error(r.Err, "MIG layout not applied", "gpu", r.UUID, "index", r.Index)
		if m.recorder != nil {
			m.recorder.Event(node, v1.EventTypeWarning, "MIGLayoutNotApplied", r.String())
		}
		return
	}
	m.opts.Logger.Info("MIG layout", "gpu", r.UUID, "index", r.Index, "result", r.Message)
	if m.recorder != nil && r.Changed {
		m.recorder.Event(node, v1.EventTypeNormal, "MIGLayoutApplied", r.String())
	}
}

// wanted are the dynamic MIG instances the records of the pods on the
// node (not finished) hold, per GPU, and the GPUs where a record holds an
// instance the agent cannot tell (a Volcano position that does not
// resolve now: its device configuration unreadable or changed, which the
// volcano part reports on the Node): every instance of those is kept
// rather than the one a running pod uses destroyed.
func (m *MIG) wanted() (want map[string]map[mig.Instance]bool, unknown map[string]bool) {
	want, unknown = map[string]map[mig.Instance]bool{}, map[string]bool{}
	// A terminating pod no longer holds its instances: destroying one
	// whose processes still run is refused by NVML (busy) and retried.
	holds := func(p *v1.Pod) bool { return !gone(p) && p.Spec.NodeName == m.opts.NodeName }
	for _, g := range nodeGrants(m.pods, m.opts.NodeName, m.record, holds) {
		switch {
		case g.MIG == nil || g.MIG.Device != "":
		case g.MIG.Profile == "":
			unknown[g.UUID] = true
		default:
			if want[g.UUID] == nil {
				want[g.UUID] = map[mig.Instance]bool{}
			}
			want[g.UUID][mig.Instance{Profile: g.MIG.Profile, Start: g.MIG.Start}] = true
		}
	}
	return want, unknown
}

// record reads a pod's grants: Tessera's record, else the protocol's.
func (m *MIG) record(p *v1.Pod) (*api.PodAllocation, error) {
	rec, err := kubeobj.Record(p)
	if errors.Is(err, kubeobj.ErrNoRecord) && m.opts.Protocol != nil {
		return m.opts.Protocol(p)
	}
	return rec, err
}

// collectLocked destroys dynamic MIG instances no record holds (their
// pods are gone), except those just created. An instance whose MIG device
// still runs processes is kept and logged.
func (m *MIG) collectLocked(devs []discovery.Device) {
	want, unknown := m.wanted()
	for i := range devs {
		d := &devs[i]
		if !d.GPU.MIG.Enabled || d.MIG == nil {
			continue
		}
		insts, err := migmgr.Instances(d)
		if err != nil {
			m.opts.Logger.Error(err, "Listing MIG instances", "gpu", d.GPU.UUID)
			continue
		}
		for _, in := range insts {
			key := d.GPU.UUID + "/" + in.String()
			if want[d.GPU.UUID][in] || unknown[d.GPU.UUID] || m.ownerLives(m.created[key]) {
				continue
			}
			if err := migmgr.Destroy(d, in); err != nil {
				m.opts.Logger.Error(err, "Keeping a MIG instance no pod holds", "gpu", d.GPU.UUID, "instance", in.String())
				continue
			}
			delete(m.created, key)
			m.opts.Logger.Info("Destroyed a MIG instance no pod holds", "gpu", d.GPU.UUID, "instance", in.String())
		}
		_ = d.RefreshMIG()
	}
}

// Prepare implements deviceplugin.MIGDevices: the MIG device of each
// grant, created now for a dynamic grant (or found, when it exists from
// an earlier answer or before an agent restart).
func (m *MIG) Prepare(_ context.Context, pod *v1.Pod, container string, grants []api.DeviceGrant) (out []string, err error) {
	m.opts.Devices.With(func(devs []discovery.Device) {
		out, err = m.prepareLocked(devs, pod, container, grants)
	})
	if err != nil {
		return nil, err
	}
	if m.poke != nil {
		m.poke() // the inventory lists the new instances
	}
	return out, nil
}

func (m *MIG) prepareLocked(devs []discovery.Device, pod *v1.Pod, container string, grants []api.DeviceGrant) ([]string, error) {
	snap := m.opts.Health()
	var out []string
	for _, g := range grants {
		d := device(devs, g.UUID)
		if d == nil {
			return nil, fmt.Errorf("GPU %s of the record is not on this node", g.UUID)
		}
		if s, ok := snap[g.UUID]; ok && !s.Healthy {
			return nil, fmt.Errorf("GPU %s is unhealthy (%s), and with it its MIG devices", g.UUID, s.Reason)
		}
		if g.MIG.Device != "" {
			found := false
			for _, md := range d.MIGDevices {
				found = found || md.UUID == g.MIG.Device
			}
			if !found {
				return nil, fmt.Errorf("MIG device %s (%s@%d) of the record does not exist on GPU %s (was the layout changed?)", g.MIG.Device, g.MIG.Profile, g.MIG.Start, g.UUID)
			}
			out = append(out, g.MIG.Device)
			continue
		}
		if d.MIG == nil {
			return nil, fmt.Errorf("GPU %s (%s): no MIG geometry to create %s@%d", g.UUID, d.GPU.Model, g.MIG.Profile, g.MIG.Start)
		}
		in := mig.Instance{Profile: g.MIG.Profile, Start: g.MIG.Start}
		if u := existing(d, in); u != "" {
			out = append(out, u)
			continue
		}
		u, err := migmgr.Create(d.Handle, d.MIG, in)
		if err != nil {
			// The room may still hold instances of pods gone a moment ago
			// (pods preempted for this one): destroy those no record
			// holds and whose processes have exited, then try once more.
			m.collectLocked(devs)
			u, err = migmgr.Create(d.Handle, d.MIG, in)
		}
		if err != nil {
			_ = d.RefreshMIG()
			return nil, fmt.Errorf("creating MIG instance %s on GPU %s for pod %s container %s: %w", in, g.UUID, kubeobj.Key(pod), container, err)
		}
		m.created[g.UUID+"/"+in.String()] = owner{namespace: pod.Namespace, name: pod.Name, uid: pod.UID, at: time.Now()}
		_ = d.RefreshMIG()
		m.opts.Logger.Info("Created a MIG instance", "pod", kubeobj.Key(pod), "container", container, "gpu", g.UUID, "instance", in.String(), "device", u)
		out = append(out, u)
	}
	return out, nil
}

// ownerLives reports whether the pod an instance was created for may
// still need it: it exists, is not finished, and is the same pod.
func (m *MIG) ownerLives(o owner) bool {
	if o.name == "" {
		return false // not created by this agent: kept only if a record holds it
	}
	if m.pods != nil {
		if p, err := m.pods.Pods(o.namespace).Get(o.name); err == nil {
			return p.UID == o.uid && !gone(p)
		}
	}
	if time.Since(o.at) < dynamicGrace {
		return true
	}
	p, err := m.opts.Client.CoreV1().Pods(o.namespace).Get(context.Background(), o.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		return true // cannot tell: keep it for now
	}
	return p.UID == o.uid && !gone(p)
}

func device(devs []discovery.Device, uuid string) *discovery.Device {
	for i := range devs {
		if devs[i].GPU.UUID == uuid {
			return &devs[i]
		}
	}
	return nil
}

func existing(d *discovery.Device, in mig.Instance) string {
	_ = d.RefreshMIG()
	for _, md := range d.MIGDevices {
		if md.Profile == in.Profile && md.Start == in.Start {
			return md.UUID
		}
	}
	return ""
}
