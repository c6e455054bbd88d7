package placement

import (
	"fmt"
	"strings"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// MIGState is the MIG side of a GPU whose sharing is "mig" (a static
// layout: its MIG devices are served whole, one container each) or
// "mig-dynamic" (instances created per pod, sized to the request). A MIG
// device is neither shareable nor a whole GPU: a container gets one MIG
// device (static) or one new instance (dynamic), and the GPU's memory and
// cores are not charged; its memory slices are, through the instances.
type MIGState struct {
	// Dynamic: instances are created for pods (mig-dynamic).
	Dynamic bool
	// Strategy is the node's MIG strategy (static): single serves MIG
	// devices for the GPU resource, mixed only for their profiles'
	// resources.
	Strategy api.MIGStrategy
	// Model is the GPU's MIG geometry, with the node's profile memory
	// sizes; nil when Tessera has no table for the model (then only a
	// static layout's devices can be placed).
	Model *mig.Model
	// Devices are the MIG devices that exist on the GPU, as the
	// inventory lists them: a static layout's, or in dynamic mode the
	// instances created so far (held by pods or not yet destroyed).
	Devices []api.MIGDevice
	// held are the instances the allocation records hold.
	held []heldMIG
	// gone are instances a NodeView took off with their pods: the node
	// agent destroys an instance once its pod is gone, so the view does
	// not count it even while the inventory still lists it. Nil but in
	// views.
	gone map[mig.Instance]int
}

type heldMIG struct {
	inst   mig.Instance
	device string // MIG device UUID when the record names one
	pod    string
}

func (m *MIGState) clone() *MIGState {
	if m == nil {
		return nil
	}
	c := *m
	c.held = append([]heldMIG(nil), m.held...)
	if m.gone != nil {
		c.gone = make(map[mig.Instance]int, len(m.gone))
		for k, v := range m.gone {
			c.gone[k] = v
		}
	}
	return &c
}

// newMIGState builds a GPU's MIG state from its inventory entry; nil for
// a GPU not in a MIG sharing mode.
func newMIGState(g api.GPU, strategy api.MIGStrategy) *MIGState {
	if g.Sharing != api.SharingMIG && g.Sharing != api.SharingMIGDynamic {
		return nil
	}
	s := &MIGState{Dynamic: g.Sharing == api.SharingMIGDynamic, Strategy: strategy, Devices: g.MIG.Devices}
	if m, ok := mig.ModelFor(g.Model, g.MemoryMiB); ok {
		s.Model = m.WithMemory(g.MIG.ProfileMemoryMiB)
	}
	return s
}

// Instances are the GPU instances that occupy the GPU: those the records
// hold and those the inventory lists, once each.
func (m *MIGState) Instances() []mig.Instance {
	out := make([]mig.Instance, 0, len(m.held)+len(m.Devices))
	seen := map[mig.Instance]bool{}
	for _, h := range m.held {
		if !seen[h.inst] {
			seen[h.inst] = true
			out = append(out, h.inst)
		}
	}
	for _, d := range m.Devices {
		in := mig.Instance{Profile: d.Profile, Start: d.Start}
		if m.gone[in] > 0 {
			continue // its pod is off the view (and no record holds it)
		}
		if !seen[in] {
			seen[in] = true
			out = append(out, in)
		}
	}
	return out
}

// heldDevice reports whether a record holds the static MIG device.
func (m *MIGState) heldDevice(d api.MIGDevice) bool {
	for _, h := range m.held {
		if h.device == d.UUID || h.device == "" && h.inst.Profile == d.Profile && h.inst.Start == d.Start {
			return true
		}
	}
	return false
}

// migPending is what the pod being placed has chosen on one GPU so far.
type migPending struct {
	n    int
	inst [api.MaxMIGDevicesPerGPU]mig.Instance
	dev  [api.MaxMIGDevicesPerGPU]string
}

func (p *migPending) has(dev string, in mig.Instance) bool {
	for k := 0; k < p.n; k++ {
		if dev != "" && p.dev[k] == dev || dev == "" && p.inst[k] == in {
			return true
		}
	}
	return false
}

// migChoice is where a container's MIG grant goes on one GPU.
type migChoice struct {
	profile   *mig.Profile // nil for a static device of an unknown model
	inst      mig.Instance
	device    string
	memoryMiB int64
	cores     int
}

// migFit decides whether container c can get a MIG device or instance on
// GPU g, and which; why not is for migReason.
func (cr *Compiled) migFit(g *GPU, c Container, pend *migPending) (migChoice, bool) {
	m := g.MIG
	if m == nil || c.CeilingMiB > 0 {
		// A MIG instance's memory is fixed: nothing to burst into.
		return migChoice{}, false
	}
	if m.Dynamic {
		if m.Model == nil {
			return migChoice{}, false
		}
		insts := m.Instances()
		for k := 0; k < pend.n; k++ {
			insts = append(insts, pend.inst[k])
		}
		var ch mig.Choice
		switch {
		case c.MIGProfile != "":
			p, ok := m.Model.Profile(c.MIGProfile)
			if !ok {
				return migChoice{}, false
			}
			s, ok := m.Model.Place(insts, p)
			if !ok {
				return migChoice{}, false
			}
			ch = mig.Choice{Profile: p, Start: s}
		case c.Exclusive():
			p := m.Model.Full()
			s, ok := m.Model.Place(insts, p)
			if !ok {
				return migChoice{}, false
			}
			ch = mig.Choice{Profile: p, Start: s}
		default:
			var ok bool
			if ch, ok = m.Model.Choose(insts, cr.migNeed(g, c)); !ok {
				return migChoice{}, false
			}
		}
		return migChoice{profile: ch.Profile, inst: ch.Instance(), memoryMiB: ch.Profile.MemoryMiB, cores: m.Model.CorePercent(ch.Profile)}, true
	}
	// Static: a free, healthy MIG device of the layout. Under mixed only
	// a container naming the profile may have it; under single any
	// container whose memory and cores it satisfies (smallest first).
	if c.MIGProfile == "" && m.Strategy != api.MIGStrategySingle {
		return migChoice{}, false
	}
	need := cr.migNeed(g, c)
	best := -1
	for k, d := range m.Devices {
		in := mig.Instance{Profile: d.Profile, Start: d.Start}
		if d.Health != api.Healthy || m.heldDevice(d) || pend.has(d.UUID, in) {
			continue
		}
		if c.MIGProfile != "" && d.Profile != c.MIGProfile {
			continue
		}
		if c.MIGProfile == "" && !c.Exclusive() && (d.MemoryMiB < need.MemoryMiB || g.SMs > 0 && d.SMCount*100 < need.Cores*g.SMs) {
			continue
		}
		if best < 0 || d.MemoryMiB < m.Devices[best].MemoryMiB {
			best = k
		}
	}
	if best < 0 {
		return migChoice{}, false
	}
	d := m.Devices[best]
	cores := 0
	if g.SMs > 0 {
		cores = min(100, d.SMCount*100/g.SMs)
	}
	return migChoice{inst: mig.Instance{Profile: d.Profile, Start: d.Start}, device: d.UUID, memoryMiB: d.MemoryMiB, cores: cores}, true
}

// migNeed is what a share request asks of one MIG instance.
func (cr *Compiled) migNeed(g *GPU, c Container) mig.Need {
	if c.Exclusive() {
		return mig.Need{}
	}
	return mig.Need{MemoryMiB: c.memoryOn(g), Cores: c.Cores}
}

// migReason explains why no eligible GPU of n can give container c a MIG
// device or instance.
func (cr *Compiled) migReason(n *Node, c Container, s *Scratch) Reason {
	var parts []string
	seen := map[string]bool{}
	add := func(t string) {
		if !seen[t] {
			seen[t] = true
			parts = append(parts, t)
		}
	}
	for i := range n.GPUs {
		if !s.eligible[i] {
			continue
		}
		g := &n.GPUs[i]
		m := g.MIG
		switch {
		case m == nil:
			add(fmt.Sprintf("GPU %s is not in a MIG mode (%s)", shortUUID(g.UUID), g.Sharing))
		case c.CeilingMiB > 0:
			add(fmt.Sprintf("GPU %s is in MIG mode, whose instances' memory is fixed: a memory ceiling (%d MiB) cannot be granted there; drop the ceiling or use a GPU that is not in MIG mode", shortUUID(g.UUID), c.CeilingMiB))
		case m.Dynamic && m.Model == nil:
			add(fmt.Sprintf("GPU %s: no MIG geometry for %s", shortUUID(g.UUID), g.Model))
		case m.Dynamic:
			insts := m.Instances()
			if c.MIGProfile != "" {
				p, ok := m.Model.Profile(c.MIGProfile)
				if !ok {
					add(fmt.Sprintf("%s has no MIG profile %s (it has %s)", m.Model.Name, c.MIGProfile, strings.Join(m.Model.ProfileNames(), ", ")))
					continue
				}
				add(fmt.Sprintf("GPU %s: %s", shortUUID(g.UUID), m.Model.Explain(insts, mig.Need{MemoryMiB: p.MemoryMiB, Cores: m.Model.CorePercent(p)})))
				continue
			}
			need := cr.migNeed(g, c)
			if c.Exclusive() {
				need = mig.Need{MemoryMiB: m.Model.Full().MemoryMiB}
			}
			add(fmt.Sprintf("GPU %s: %s", shortUUID(g.UUID), m.Model.Explain(insts, need)))
		case c.MIGProfile == "" && m.Strategy != api.MIGStrategySingle:
			add("GPUs are split into MIG devices (mixed strategy): ask for a MIG profile's resource, e.g. " + api.DefaultResourceNames.MIG("1g.5gb"))
		default:
			held, total := 0, 0
			for _, d := range m.Devices {
				if c.MIGProfile == "" || d.Profile == c.MIGProfile {
					total++
					if m.heldDevice(d) || d.Health != api.Healthy {
						held++
					}
				}
			}
			what := "MIG device"
			if c.MIGProfile != "" {
				what = c.MIGProfile + " MIG device"
			}
			add(fmt.Sprintf("no free %s (%d of %d held or unhealthy)", what, held, total))
		}
	}
	return Reason{Kind: ReasonMIG, Container: c.Name, Detail: strings.Join(parts, "; ")}
}

// migHold applies (sign +1) or removes (-1) the MIG instances a record
// holds on node n.
func migHold(n *Node, pod string, rec *api.PodAllocation, add bool) {
	for _, ca := range rec.Containers {
		for _, d := range ca.Devices {
			if d.MIG == nil {
				continue
			}
			i := n.GPUByUUID(d.UUID)
			if i < 0 || n.GPUs[i].MIG == nil {
				continue
			}
			m := n.GPUs[i].MIG
			h := heldMIG{inst: mig.Instance{Profile: d.MIG.Profile, Start: d.MIG.Start}, device: d.MIG.Device, pod: pod}
			if add {
				m.held = append(m.held, h)
				continue
			}
			for k := range m.held {
				if m.held[k] == h {
					m.held = append(m.held[:k], m.held[k+1:]...)
					break
				}
			}
		}
	}
}

// migGone marks (add) or unmarks the dynamic MIG instances a record
// holds on a view's node as gone with their pod (MIGState.gone).
func migGone(n *Node, rec *api.PodAllocation, add bool) {
	for _, ca := range rec.Containers {
		for _, d := range ca.Devices {
			if d.MIG == nil || d.MIG.Device != "" {
				continue
			}
			i := n.GPUByUUID(d.UUID)
			if i < 0 || n.GPUs[i].MIG == nil || !n.GPUs[i].MIG.Dynamic {
				continue
			}
			m := n.GPUs[i].MIG
			in := mig.Instance{Profile: d.MIG.Profile, Start: d.MIG.Start}
			if add {
				if m.gone == nil {
					m.gone = map[mig.Instance]int{}
				}
				m.gone[in]++
			} else if m.gone[in]--; m.gone[in] <= 0 {
				delete(m.gone, in)
			}
		}
	}
}

// checkMIG reports MIG instances held twice or placed where the geometry
// forbids.
func checkMIG(node string, g *GPU) []error {
	m := g.MIG
	if m == nil {
		return nil
	}
	var errs []error
	seen := map[mig.Instance]string{}
	for _, h := range m.held {
		if p, dup := seen[h.inst]; dup {
			errs = append(errs, fmt.Errorf("node %s GPU %s: MIG instance %s held by %s and %s", node, g.UUID, h.inst, p, h.pod))
		}
		seen[h.inst] = h.pod
	}
	if m.Model != nil {
		if err := m.Model.Validate(m.Instances()); err != nil {
			errs = append(errs, fmt.Errorf("node %s GPU %s: MIG instances: %w", node, g.UUID, err))
		}
	}
	return errs
}

// migCharge is what a MIG grant charges its GPU: one share slot.
var migCharge = gpushare.Usage{Shares: 1}

// MIGShareMiB is the memory of the MIG device a share is given on GPU g
// (of a node whose MIG strategy is strategy): in mig-dynamic mode the
// instance sized to the share (mig.Model.ShareProfile; Choose never gives
// more), with the single strategy the largest device of the layout that
// satisfies it (a layout under single has one profile). The share asks
// memMiB, or memPercent of g's memory when memMiB is 0, and cores
// percent of its compute. ok is false when g gives shares no MIG device
// (not in a MIG mode, mixed strategy, no table for its model) or none
// satisfies the share. The webhook charges a namespace's GPU memory
// quota at least this much, so a small memory ask with a large core
// share cannot hold a large instance charged as small.
func MIGShareMiB(g api.GPU, strategy api.MIGStrategy, memMiB, memPercent int64, cores int) (int64, bool) {
	st := newMIGState(g, strategy)
	if st == nil {
		return 0, false
	}
	need := mig.Need{MemoryMiB: gpushare.Ask{MemoryMiB: memMiB, MemoryPercent: int(memPercent)}.MemoryOn(g.MemoryMiB), Cores: cores}
	if st.Dynamic {
		if st.Model == nil {
			return 0, false
		}
		p, ok := st.Model.ShareProfile(need)
		if !ok {
			return 0, false
		}
		return p.MemoryMiB, true
	}
	if strategy != api.MIGStrategySingle {
		return 0, false
	}
	var best int64
	found := false
	for _, d := range st.Devices {
		if d.MemoryMiB < need.MemoryMiB || g.SMCount > 0 && d.SMCount*100 < need.Cores*g.SMCount {
			continue
		}
		best, found = max(best, d.MemoryMiB), true
	}
	return best, found
}
