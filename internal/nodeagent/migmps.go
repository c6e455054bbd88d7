package nodeagent

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/migmgr"
	"github.com/tessera-gpu/tessera/internal/nodeagent/mps"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// dynamicGrace is how long an instance the agent created for a pod is kept
// while the agent's cache does not show that pod yet (the kubelet may
// admit a pod before the agent's informer sees it); after that the API
// server is asked.
const dynamicGrace = 5 * time.Second

// mpsCheck is how often an MPS node's control daemons are checked.
const mpsCheck = 5 * time.Second

// owner is the pod a dynamic instance was created for.
type owner struct {
	namespace, name string
	uid             types.UID
	at              time.Time
}

// MIGReports returns the last report of applying the MIG layout, per GPU.
func (a *Agent) MIGReports() map[string]string {
	a.devMu.Lock()
	defer a.devMu.Unlock()
	out := make(map[string]string, len(a.migReports))
	for k, v := range a.migReports {
		out[k] = v
	}
	return out
}

// reconcileMIG brings the GPUs to the configuration's MIG state: a static
// layout applied (reported per GPU, logged when the report changes), or
// MIG mode on for dynamic MIG and the instances of pods that are gone
// destroyed. It re-reads every GPU's MIG devices.
func (a *Agent) reconcileMIG(cfg config.Node) {
	a.devMu.Lock()
	defer a.devMu.Unlock()
	if a.migReports == nil {
		a.migReports = map[string]string{}
	}
	report := func(r migmgr.Report) {
		if a.migReports[r.UUID] == r.String() {
			return
		}
		a.migReports[r.UUID] = r.String()
		node := &v1.ObjectReference{Kind: "Node", Name: a.opts.NodeName, UID: types.UID(a.opts.NodeName)}
		if r.Err != nil {
			a.logger.Error(r.Err, "MIG layout not applied", "gpu", r.UUID, "index", r.Index)
			if a.recorder != nil {
				a.recorder.Event(node, v1.EventTypeWarning, "MIGLayoutNotApplied", r.String())
			}
			return
		}
		a.logger.Info("MIG layout", "gpu", r.UUID, "index", r.Index, "result", r.Message)
		if a.recorder != nil && r.Changed {
			a.recorder.Event(node, v1.EventTypeNormal, "MIGLayoutApplied", r.String())
		}
	}
	for i := range a.devices {
		d := &a.devices[i]
		switch {
		case cfg.Layout != nil:
			report(migmgr.Apply(d, cfg.Layout))
		case cfg.Sharing == api.SharingMIGDynamic && d.GPU.MIG.Capable:
			report(migmgr.EnableMIG(d))
		}
		if d.GPU.MIG.Capable {
			if err := d.RefreshMIG(); err != nil {
				a.logger.Error(err, "Reading MIG devices", "gpu", d.GPU.UUID)
			}
		}
	}
	if cfg.Sharing == api.SharingMIGDynamic {
		a.collectInstancesLocked()
	}
}

// wantedInstances are the dynamic MIG instances the records of the pods
// on the node (not finished) hold, per GPU.
func (a *Agent) wantedInstances() map[string]map[mig.Instance]bool {
	out := map[string]map[mig.Instance]bool{}
	if a.pods == nil {
		return out
	}
	pods, err := a.pods.List(labels.Everything())
	if err != nil {
		return out
	}
	for _, p := range pods {
		// A terminating pod no longer holds its instances: destroying one
		// whose processes still run is refused by NVML (busy) and retried.
		if gone(p) || p.Spec.NodeName != a.opts.NodeName {
			continue
		}
		rec, err := kubeobj.Record(p)
		if err != nil || rec.Node != a.opts.NodeName {
			continue
		}
		for _, c := range rec.Containers {
			for _, g := range c.Devices {
				if g.MIG == nil || g.MIG.Device != "" {
					continue
				}
				if out[g.UUID] == nil {
					out[g.UUID] = map[mig.Instance]bool{}
				}
				out[g.UUID][mig.Instance{Profile: g.MIG.Profile, Start: g.MIG.Start}] = true
			}
		}
	}
	return out
}

// collectInstancesLocked destroys dynamic MIG instances no record holds
// (their pods are gone), except those just created. An instance whose MIG
// device still runs processes is kept and logged.
func (a *Agent) collectInstancesLocked() {
	want := a.wantedInstances()
	for i := range a.devices {
		d := &a.devices[i]
		if !d.GPU.MIG.Enabled || d.MIG == nil {
			continue
		}
		insts, err := migmgr.Instances(d)
		if err != nil {
			a.logger.Error(err, "Listing MIG instances", "gpu", d.GPU.UUID)
			continue
		}
		for _, in := range insts {
			key := d.GPU.UUID + "/" + in.String()
			if want[d.GPU.UUID][in] || a.ownerLives(a.created[key]) {
				continue
			}
			if err := migmgr.Destroy(d, in); err != nil {
				a.logger.Error(err, "Keeping a MIG instance no pod holds", "gpu", d.GPU.UUID, "instance", in.String())
				continue
			}
			delete(a.created, key)
			a.logger.Info("Destroyed a MIG instance no pod holds", "gpu", d.GPU.UUID, "instance", in.String())
		}
		_ = d.RefreshMIG()
	}
}

// Prepare implements deviceplugin.MIGDevices: the MIG device of each
// grant, created now for a dynamic grant (or found, when it exists from
// an earlier answer or before an agent restart).
func (a *Agent) Prepare(_ context.Context, pod *v1.Pod, container string, grants []api.DeviceGrant) ([]string, error) {
	a.devMu.Lock()
	defer a.devMu.Unlock()
	snap := a.monitor.Snapshot()
	var out []string
	for _, g := range grants {
		d := a.deviceLocked(g.UUID)
		if d == nil {
			return nil, fmt.Errorf("GPU %s of the record is not on this node", g.UUID)
		}
		if s, ok := snap[g.UUID]; ok && !s.Healthy {
			return nil, fmt.Errorf("GPU %s is unhealthy (%s), and with it its MIG devices", g.UUID, s.Reason)
		}
		if g.MIG.Device != "" {
			found := false
			for _, m := range d.MIGDevices {
				found = found || m.UUID == g.MIG.Device
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
			// (pods preempted for this one): destroy those whose
			// processes have exited, then try once more.
			a.collectInstancesLocked()
			u, err = migmgr.Create(d.Handle, d.MIG, in)
		}
		if err != nil {
			_ = d.RefreshMIG()
			return nil, fmt.Errorf("creating MIG instance %s on GPU %s for pod %s container %s: %w", in, g.UUID, kubeobj.Key(pod), container, err)
		}
		if a.created == nil {
			a.created = map[string]owner{}
		}
		a.created[g.UUID+"/"+in.String()] = owner{namespace: pod.Namespace, name: pod.Name, uid: pod.UID, at: time.Now()}
		_ = d.RefreshMIG()
		a.logger.Info("Created a MIG instance", "pod", kubeobj.Key(pod), "container", container, "gpu", g.UUID, "instance", in.String(), "device", u)
		out = append(out, u)
	}
	a.poke() // the inventory lists the new instances
	return out, nil
}

// ownerLives reports whether the pod an instance was created for may
// still need it: it exists, is not finished, and is the same pod.
func (a *Agent) ownerLives(o owner) bool {
	if o.name == "" {
		return false // not created by this agent: kept only if a record holds it
	}
	if a.pods != nil {
		if p, err := a.pods.Pods(o.namespace).Get(o.name); err == nil {
			return p.UID == o.uid && !gone(p)
		}
	}
	if time.Since(o.at) < dynamicGrace {
		return true
	}
	p, err := a.client.CoreV1().Pods(o.namespace).Get(context.Background(), o.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		return true // cannot tell: keep it for now
	}
	return p.UID == o.uid && !gone(p)
}

// gone reports a pod that is finished or being deleted.
func gone(p *v1.Pod) bool {
	return p.DeletionTimestamp != nil || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

func (a *Agent) deviceLocked(uuid string) *discovery.Device {
	for i := range a.devices {
		if a.devices[i].GPU.UUID == uuid {
			return &a.devices[i]
		}
	}
	return nil
}

func existing(d *discovery.Device, in mig.Instance) string {
	_ = d.RefreshMIG()
	for _, m := range d.MIGDevices {
		if m.Profile == in.Profile && m.Start == in.Start {
			return m.UUID
		}
	}
	return ""
}

// reconcileMPS runs the MPS control daemons of a node in mps mode, each
// GPU's servers bounded by the largest share a client of it holds (an
// equal 1/replicas when no pod is there yet), and stops them otherwise.
func (a *Agent) reconcileMPS(ctx context.Context, cfg config.Node, inv *api.NodeInventory) {
	if a.mps == nil {
		return
	}
	var gpus []mps.GPU
	if cfg.Sharing == api.SharingMPS {
		most := map[string]mps.Limits{}
		if a.pods != nil {
			pods, _ := a.pods.List(labels.Everything())
			for _, p := range pods {
				if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
					continue
				}
				rec, err := kubeobj.Record(p)
				if err != nil || rec.Node != a.opts.NodeName {
					continue
				}
				for _, c := range rec.Containers {
					for _, g := range c.Devices {
						l := most[g.UUID]
						l.ThreadPercent = max(l.ThreadPercent, deviceplugin.MPSThreadPercent(g.Cores, 100/max(cfg.SharesPerGPU, 1)))
						l.PinnedMiB = max(l.PinnedMiB, g.MemoryMiB)
						most[g.UUID] = l
					}
				}
			}
		}
		for _, g := range inv.GPUs {
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
	if err := a.mps.Ensure(ctx, gpus); err != nil {
		msg := err.Error()
		if msg != a.mpsErr {
			a.logger.Error(err, "MPS control daemons")
		}
		a.mpsErr = msg
		return
	}
	a.mpsErr = ""
}
