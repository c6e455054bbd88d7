package scheduler

// Tessera's DRA GPUs in the placement core (docs/dra.md, "Placing
// claims"). The GPUs of gpu.tessera.io's ResourceSlices are nodes of a
// placement cluster of their own, with the memory, cores and shares that
// allocated claims (and claims being allocated) consume on each GPU; the
// plugin ranks DRA nodes for claims with the node policy on that model
// and narrows the pods whose claims it understands (draclaims.go) to the
// best few nodes. The ranking is advisory: kube-scheduler's
// DynamicResources runs the structured allocator on those nodes and stays
// the authority on what fits.

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draModel is the placement core's view of the GPUs Tessera's driver
// publishes in ResourceSlices.
type draModel struct {
	mu      sync.Mutex
	cluster *placement.Cluster
	memo    *placement.Memo
	// slices are gpu.tessera.io's node-local slices by name.
	slices map[string]*resourceapi.ResourceSlice
	// pools maps a pool (the node's name, as the driver names it) to its
	// node and the position of each device among the node's GPUs.
	pools map[string]draPool
	// used are the usages last set, by node (nodes with any usage).
	used map[string][]placement.Usage
	// synced reports whether the slices' informer has synced (nil: no
	// informer, as in unit tests).
	synced cache.InformerSynced
}

type draPool struct {
	node    string
	devices map[string]int
}

func newDRAModel(gpuPolicy api.GPUPolicy) *draModel {
	c := placement.NewCluster()
	c.DefaultGPUPolicy = gpuPolicy
	return &draModel{cluster: c, memo: placement.NewMemo(), slices: map[string]*resourceapi.ResourceSlice{},
		pools: map[string]draPool{}, used: map[string][]placement.Usage{}}
}

// onSlice applies a ResourceSlice added or updated (deleted: nil) under
// the name; slices of other drivers and without a node are ignored.
func (m *draModel) onSlice(logger klog.Logger, name string, s *resourceapi.ResourceSlice) {
	if s != nil && (s.Spec.Driver != api.DRADriverName || s.Spec.NodeName == nil) {
		s = nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.slices[name]
	if s == nil && old == nil {
		return
	}
	if s != nil {
		m.slices[name] = s
	} else {
		delete(m.slices, name)
	}
	if old != nil && (s == nil || *old.Spec.NodeName != *s.Spec.NodeName) {
		m.rebuild(logger, *old.Spec.NodeName)
	}
	if s != nil {
		m.rebuild(logger, *s.Spec.NodeName)
	}
}

// rebuild makes the node's GPUs from its slices again; the caller holds
// m.mu. The usage is set again at the next refresh.
func (m *draModel) rebuild(logger klog.Logger, node string) {
	for pool, p := range m.pools {
		if p.node == node {
			delete(m.pools, pool)
		}
	}
	delete(m.used, node)
	var devs []draDevice
	for _, name := range slices.Sorted(maps.Keys(m.slices)) {
		s := m.slices[name]
		if *s.Spec.NodeName != node {
			continue
		}
		for i := range s.Spec.Devices {
			d, err := draDeviceOf(s.Spec.Pool.Name, &s.Spec.Devices[i])
			if err != nil {
				logger.Error(err, "Device of a Tessera ResourceSlice left out of the placement model", "slice", name)
				continue
			}
			devs = append(devs, d)
		}
	}
	if len(devs) == 0 {
		m.cluster.RemoveNode(node)
		return
	}
	inv := &api.NodeInventory{MemoryOvercommit: 1, Mode: api.ModeDRA}
	for _, d := range devs {
		inv.GPUs = append(inv.GPUs, d.gpu)
	}
	n, err := placement.NewNode(node, placement.Unlimited, placement.Unlimited, inv)
	if err != nil {
		logger.Error(err, "Tessera ResourceSlices of a node left out of the placement model", "node", node)
		m.cluster.RemoveNode(node)
		return
	}
	for i, d := range devs {
		p, ok := m.pools[d.pool]
		if !ok {
			p = draPool{node: node, devices: map[string]int{}}
			m.pools[d.pool] = p
		}
		p.devices[d.name] = i
	}
	m.cluster.UpsertNode(n)
}

// draDevice is one device of a Tessera slice as a GPU of the model.
type draDevice struct {
	pool, name string
	gpu        api.GPU
}

// draDeviceOf reads a device of Tessera's driver (internal/nodeagent/dra
// publishes them): its UUID, index and product name, its memory and, on a
// shared GPU (allowMultipleAllocations), its shares. A device tainted
// NoSchedule or NoExecute (an unhealthy GPU) is unhealthy in the model.
func draDeviceOf(pool string, d *resourceapi.Device) (draDevice, error) {
	out := draDevice{pool: pool, name: d.Name, gpu: api.GPU{NUMANode: -1, Health: api.Healthy, Sharing: api.SharingExclusive, MaxShares: 1}}
	str := func(name string) string {
		if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return ""
	}
	out.gpu.UUID, out.gpu.Model = str(api.AttrUUID), str(api.AttrProductName)
	if out.gpu.UUID == "" {
		return out, fmt.Errorf("device %s has no attribute %s", d.Name, api.AttrUUID)
	}
	if a, ok := d.Attributes[api.AttrIndex]; ok && a.IntValue != nil {
		out.gpu.Index = int(*a.IntValue)
	}
	if a, ok := d.Attributes[api.AttrNUMANode]; ok && a.IntValue != nil {
		out.gpu.NUMANode = int(*a.IntValue)
	}
	mem, ok := d.Capacity[api.CapacityMemory]
	if !ok || mem.Value.Sign() <= 0 {
		return out, fmt.Errorf("device %s has no positive capacity %s", d.Name, api.CapacityMemory)
	}
	out.gpu.MemoryMiB = mem.Value.Value() >> 20
	if out.gpu.MemoryMiB <= 0 {
		return out, fmt.Errorf("device %s: capacity %s %s is less than 1Mi", d.Name, api.CapacityMemory, mem.Value.String())
	}
	if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
		out.gpu.Sharing = api.SharingShared
		out.gpu.MaxShares = api.MaxSharesLimit
		if s, ok := d.Capacity[api.CapacityShares]; ok {
			out.gpu.MaxShares = int(min(s.Value.Value(), api.MaxSharesLimit))
		}
	}
	for _, t := range d.Taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			out.gpu.Health = api.Unhealthy
		}
	}
	return out, nil
}

// refresh sets each GPU's usage from the claim tracker's allocated state
// (allocated claims and those being allocated); the caller holds m.mu. A
// device allocated exclusively is used whole; on a shared one the
// claims' consumed memory (rounded up to a MiB, as the node agent limits
// it), cores and shares add up.
func (m *draModel) refresh(alloc *structured.AllocatedState) {
	next := make(map[string][]placement.Usage, len(m.used))
	// at is the usage of the device's GPU in next, and the GPU.
	at := func(id structured.DeviceID) (*placement.Usage, *placement.GPU) {
		if id.Driver.String() != api.DRADriverName {
			return nil, nil
		}
		p, ok := m.pools[id.Pool.String()]
		if !ok {
			return nil, nil
		}
		i, ok := p.devices[id.Device.String()]
		n := m.cluster.Node(p.node)
		if !ok || n == nil || i >= len(n.GPUs) {
			return nil, nil
		}
		u := next[p.node]
		if u == nil {
			u = make([]placement.Usage, len(n.GPUs))
			next[p.node] = u
		}
		return &u[i], &n.GPUs[i]
	}
	for id := range alloc.AllocatedDevices {
		if u, g := at(id); u != nil {
			*u = placement.Usage{MemoryMiB: g.MemoryCap, Cores: api.MaxCores, Shares: 1, Exclusive: 1}
		}
	}
	for id, c := range alloc.AggregatedCapacity {
		u, _ := at(id)
		if u == nil {
			continue
		}
		if q := c[api.CapacityMemory]; q != nil {
			u.MemoryMiB += mib(q)
		}
		if q := c[api.CapacityCores]; q != nil {
			u.Cores += int(q.Value())
		}
		if q := c[api.CapacityShares]; q != nil {
			u.Shares += int(q.Value())
		}
	}
	for node := range m.used {
		if _, ok := next[node]; !ok {
			if n := m.cluster.Node(node); n != nil {
				m.cluster.SetUsage(node, make([]placement.Usage, len(n.GPUs)))
			}
		}
	}
	for node, u := range next {
		m.cluster.SetUsage(node, u)
	}
	m.used = next
}

// mib is a memory quantity in MiB, rounded up.
func mib(q *resource.Quantity) int64 {
	return (q.Value() + 1<<20 - 1) >> 20
}

// refreshDRA reads the claim tracker's allocated state into the model;
// the caller holds m.mu. The tracker refuses a state that changed while
// it was read: a few tries, then an error.
func (p *Plugin) refreshDRA() error {
	m := p.handle.SharedDRAManager()
	var alloc *structured.AllocatedState
	var err error
	for range 3 {
		if alloc, err = m.ResourceClaims().GatherAllocatedState(); err == nil {
			p.dra.refresh(alloc)
			return nil
		}
	}
	return err
}

// draReady reports whether the plugin can read claims (kube-scheduler's
// DRA manager) and has read the ResourceSlices.
func (p *Plugin) draReady() bool {
	return p.handle != nil && p.handle.SharedDRAManager() != nil && (p.dra.synced == nil || p.dra.synced())
}

// draStateKey holds a claim pod's DRA ranking for Score.
const draStateKey fwk.StateKey = Name + "/dra"

// draCycle is the DRA ranking of one pod: the score of each node in
// [0, MaxScore] (nodes missing score 0); narrowed: PreFilter handed
// kube-scheduler only the best nodes (draclaims.go).
type draCycle struct {
	scores   map[string]int64
	narrowed bool
}

// Clone shares the scores: they are not changed after they are written.
func (d *draCycle) Clone() fwk.StateData { return d }

func readDRACycle(cs fwk.CycleState) *draCycle {
	if cs == nil {
		return nil
	}
	d, err := cs.Read(draStateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*draCycle)
	return s
}

// draNodePolicy is the node policy for a claim pod: its annotation's,
// else binpack unless the profile's policy is spread. (A placement
// policy that learns the workload, such as tessera, learns the
// device-plugin nodes' pods; on DRA GPUs it packs.)
func (p *Plugin) draNodePolicy(pod *corev1.Pod) placement.Policy {
	if sel, err := api.ParsePodSelectors(pod.Annotations); err == nil && sel.NodePolicy == api.NodeSpread {
		return placement.Spread{}
	} else if err == nil && sel.NodePolicy == api.NodeBinpack {
		return placement.Binpack{}
	}
	if p.policy != nil && p.policy.Name() == string(api.NodeSpread) {
		return placement.Spread{}
	}
	return placement.Binpack{}
}

// draPreScore ranks the feasible nodes in mode dra, by the node policy
// on the model's GPUs as they are now, for a pod with ResourceClaims that
// PreFilter did not narrow (claims the model does not understand, or a
// retry over every node). Skip when there is nothing to rank.
func (p *Plugin) draPreScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	if d := readDRACycle(cs); d != nil {
		return nil // ranked by PreFilter
	}
	if len(pod.Spec.ResourceClaims) == 0 || !p.draReady() {
		return fwk.NewStatus(fwk.Skip)
	}
	want := make([]string, 0, len(nodes))
	p.st.mu.RLock()
	for _, ni := range nodes {
		if name := ni.Node().Name; p.st.isDRA(name) {
			want = append(want, name)
		}
	}
	p.st.mu.RUnlock()
	if len(want) < 2 {
		return fwk.NewStatus(fwk.Skip)
	}
	spread := p.draNodePolicy(pod).Name() == string(api.NodeSpread)
	p.dra.mu.Lock()
	defer p.dra.mu.Unlock()
	if err := p.refreshDRA(); err != nil {
		klog.FromContext(ctx).V(4).Info("No DRA ranking: the claims' allocated state could not be read", "pod", klog.KObj(pod), "err", err)
		return fwk.NewStatus(fwk.Skip)
	}
	scores := make(map[string]int64, len(want))
	for _, name := range want {
		f := 0.0
		if n := p.dra.cluster.Node(name); n != nil {
			f = n.Utilisation()
		}
		if spread {
			f = 1 - f
		}
		scores[name] = int64(math.Round(f * float64(fwk.MaxScore)))
	}
	cs.Write(draStateKey, &draCycle{scores: scores})
	return nil
}
