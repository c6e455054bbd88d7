package nvmlemu

import (
	"fmt"
	"sort"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"

	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmlmig"
)

// MIG emulation. go-nvml's mock servers create GPU and compute instances
// anywhere (no placement rules, no instance limits), have no MIG device
// handles, and their tables differ from NVIDIA's documentation in places
// (A100 2g.10gb placements, H100 SM counts). The emulation below answers
// NVML's MIG calls from internal/mig's documented tables instead:
//
//   - GetMigMode / SetMigMode, with an optional pending state that only a
//     GPU reset (Node.ResetGPU) applies, as on GPUs that need one;
//   - GetGpuInstanceProfileInfo (by nvml.GPU_INSTANCE_PROFILE_*), the
//     possible placements, the remaining capacity;
//   - CreateGpuInstance[WithPlacement] refusing overlaps, too many
//     instances, compute slices beyond the GPU's and a second +me
//     instance (ERROR_INSUFFICIENT_RESOURCES), and any instance while MIG
//     mode is off (ERROR_NOT_SUPPORTED);
//   - one compute instance per GPU instance, spanning it (the shape
//     mig-parted and Tessera create), and the MIG device it makes: UUID,
//     memory, SMs, parent, instance IDs, running processes;
//   - Destroy refusing a GPU instance that still has a compute instance,
//     or a compute instance with processes (ERROR_IN_USE), and SetMigMode
//     refusing to turn MIG off while instances exist.
type migGPU struct {
	mu      sync.Mutex
	parent  *server.Device
	model   *mig.Model
	current int
	pending int
	// needReset makes mode changes pend until ResetGPU.
	needReset bool
	nextGI    uint32
	gis       map[uint32]*migGI
	busy      map[string]bool // MIG device UUID → has processes
}

type migGI struct {
	id      uint32
	profile *mig.Profile
	start   int
	handle  *mock.GpuInstance
	ci      *mock.ComputeInstance // nil until created
	dev     *mock.Device          // the MIG device, with ci
	devUUID string
}

// migOf returns the emulation of GPU i, nil for a model internal/mig does
// not know (its MIG calls stay go-nvml's).
func (n *Node) migOf(i int) *migGPU {
	n.migMu.Lock()
	defer n.migMu.Unlock()
	return n.mig[i]
}

// SetResetRequired makes MIG mode changes on every GPU pend until the GPU
// is reset (ResetGPU), as on GPUs whose mode change needs a reset.
func (n *Node) SetResetRequired(v bool) {
	for i := range n.Devices {
		if g := n.migOf(i); g != nil {
			g.mu.Lock()
			g.needReset = v
			g.mu.Unlock()
		}
	}
}

// ResetGPU applies GPU i's pending MIG mode, as a GPU reset does.
func (n *Node) ResetGPU(i int) {
	if g := n.migOf(i); g != nil {
		g.mu.Lock()
		g.current = g.pending
		g.mu.Unlock()
	}
}

// SetBusy marks a MIG device as running processes (or not): its compute
// instance cannot be destroyed while it is.
func (n *Node) SetBusy(migUUID string, busy bool) {
	for i := range n.Devices {
		if g := n.migOf(i); g != nil {
			g.mu.Lock()
			g.busy[migUUID] = busy
			g.mu.Unlock()
		}
	}
}

// MIGInstances lists GPU i's GPU instances as "<profile>@<start>", sorted.
func (n *Node) MIGInstances(i int) []string {
	g := n.migOf(i)
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, gi := range g.gis {
		out = append(out, fmt.Sprintf("%s@%d", gi.profile.Name, gi.start))
	}
	sort.Strings(out)
	return out
}

// emulateMIG installs the emulation on every GPU of a model internal/mig
// knows.
func (n *Node) emulateMIG() {
	n.mig = map[int]*migGPU{}
	for i, d := range n.Devices {
		dev := d.(*server.Device)
		m, ok := mig.ModelFor(dev.Config.Name, int64(dev.Config.MemoryMB))
		if !ok {
			continue
		}
		g := &migGPU{parent: dev, model: m, gis: map[uint32]*migGI{}, busy: map[string]bool{}}
		n.mig[i] = g
		g.install()
	}
}

func (g *migGPU) install() {
	d := g.parent
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.current, g.pending, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
			return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
		}
		if mode == nvml.DEVICE_MIG_DISABLE && len(g.gis) > 0 {
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		}
		g.pending = mode
		if g.needReset && g.current != mode {
			return nvml.ERROR_RESET_REQUIRED, nvml.SUCCESS
		}
		g.current = mode
		return nvml.SUCCESS, nvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return g.model.MaxInstances(), nvml.SUCCESS }
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	d.GetGpuInstanceProfileInfoFunc = func(c int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		p, ok := g.model.ProfileByNVML(c)
		if !ok {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return profileInfo(p), nvml.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		p, ok := g.model.ProfileByID(int(info.Id))
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		out := make([]nvml.GpuInstancePlacement, len(p.Starts))
		for i, s := range p.Starts {
			out[i] = nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.MemorySlices)}
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
		p, ok := g.model.ProfileByID(int(info.Id))
		if !ok {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		insts := g.instances()
		n := 0
		for {
			s, ok := g.model.Place(insts, p)
			if !ok {
				return n, nvml.SUCCESS
			}
			insts = append(insts, mig.Instance{Profile: p.Name, Start: s})
			n++
		}
	}
	d.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		p, ok := g.model.ProfileByID(int(info.Id))
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		s, ok := g.model.Place(g.instances(), p)
		if !ok {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		return g.create(p, s)
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		p, ok := g.model.ProfileByID(int(info.Id))
		if !ok || int(pl.Size) != p.MemorySlices {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.model.Validate(append(g.instances(), mig.Instance{Profile: p.Name, Start: int(pl.Start)})) != nil {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		return g.create(p, int(pl.Start))
	}
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.current != nvml.DEVICE_MIG_ENABLE {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		var out []nvml.GpuInstance
		for _, gi := range g.sorted() {
			if gi.profile.ID == int(info.Id) {
				out = append(out, gi.handle)
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if gi, ok := g.gis[uint32(id)]; ok {
			return gi.handle, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		k := 0
		for _, gi := range g.sorted() {
			if gi.dev == nil {
				continue
			}
			if k == i {
				return gi.dev, nvml.SUCCESS
			}
			k++
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// instances are the GPU's instances, for the geometry (under g.mu).
func (g *migGPU) instances() []mig.Instance {
	var out []mig.Instance
	for _, gi := range g.sorted() {
		out = append(out, mig.Instance{Profile: gi.profile.Name, Start: gi.start})
	}
	return out
}

func (g *migGPU) sorted() []*migGI {
	out := make([]*migGI, 0, len(g.gis))
	for _, gi := range g.gis {
		out = append(out, gi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func profileInfo(p *mig.Profile) nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id: uint32(p.ID), IsP2pSupported: 1, SliceCount: uint32(p.Compute), InstanceCount: uint32(p.MaxInstances),
		MultiprocessorCount: uint32(p.SMs), CopyEngineCount: uint32(p.Compute), MemorySizeMB: uint64(p.MemoryMiB),
	}
}

// create makes a GPU instance (under g.mu).
func (g *migGPU) create(p *mig.Profile, start int) (nvml.GpuInstance, nvml.Return) {
	if g.current != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	gi := &migGI{id: g.nextGI, profile: p, start: start}
	g.nextGI++
	h := &mock.GpuInstance{}
	gi.handle = h
	info := nvml.GpuInstanceInfo{Device: g.parent, Id: gi.id, ProfileId: uint32(p.ID), Placement: nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.MemorySlices)}}
	h.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) { return info, nvml.SUCCESS }
	ciInfo := nvml.ComputeInstanceProfileInfo{
		Id: uint32(nvmlmig.ComputeInstanceProfile(p.Compute)), SliceCount: uint32(p.Compute), InstanceCount: 1, MultiprocessorCount: uint32(p.SMs),
	}
	h.GetComputeInstanceProfileInfoFunc = func(c, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED || c != nvmlmig.ComputeInstanceProfile(p.Compute) {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return ciInfo, nvml.SUCCESS
	}
	h.CreateComputeInstanceFunc = func(ci *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if ci.Id != ciInfo.Id {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if gi.ci != nil {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		g.makeCI(gi, ciInfo)
		return gi.ci, nvml.SUCCESS
	}
	h.GetComputeInstancesFunc = func(ci *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if gi.ci == nil || ci.Id != ciInfo.Id {
			return nil, nvml.SUCCESS
		}
		return []nvml.ComputeInstance{gi.ci}, nvml.SUCCESS
	}
	h.DestroyFunc = func() nvml.Return {
		g.mu.Lock()
		defer g.mu.Unlock()
		if _, ok := g.gis[gi.id]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		if gi.ci != nil {
			return nvml.ERROR_IN_USE
		}
		delete(g.gis, gi.id)
		return nvml.SUCCESS
	}
	g.gis[gi.id] = gi
	return h, nvml.SUCCESS
}

// makeCI creates the compute instance and the MIG device (under g.mu).
func (g *migGPU) makeCI(gi *migGI, ciInfo nvml.ComputeInstanceProfileInfo) {
	parent := g.parent
	gi.devUUID = "MIG-" + uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s/%d/%s@%d", parent.UUID, gi.id, gi.profile.Name, gi.start)).String()
	ci := &mock.ComputeInstance{}
	info := nvml.ComputeInstanceInfo{Device: parent, GpuInstance: gi.handle, Id: 0, ProfileId: ciInfo.Id}
	ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) { return info, nvml.SUCCESS }
	ci.DestroyFunc = func() nvml.Return {
		g.mu.Lock()
		defer g.mu.Unlock()
		if gi.ci == nil {
			return nvml.ERROR_NOT_FOUND
		}
		if g.busy[gi.devUUID] {
			return nvml.ERROR_IN_USE
		}
		gi.ci, gi.dev = nil, nil
		return nvml.SUCCESS
	}
	p := gi.profile
	dev := &mock.Device{}
	uuidStr := gi.devUUID
	dev.GetUUIDFunc = func() (string, nvml.Return) { return uuidStr, nvml.SUCCESS }
	dev.GetNameFunc = func() (string, nvml.Return) {
		return fmt.Sprintf("%s MIG %s", parent.Config.Name, p.Name), nvml.SUCCESS
	}
	dev.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	dev.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS }
	dev.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(gi.id), nvml.SUCCESS }
	dev.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: uint64(p.MemoryMiB) << 20, Free: uint64(p.MemoryMiB) << 20}, nvml.SUCCESS
	}
	dev.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount: uint32(p.SMs), GpuInstanceSliceCount: uint32(p.Compute), ComputeInstanceSliceCount: uint32(p.Compute),
			MemorySizeMB: uint64(p.MemoryMiB),
		}, nvml.SUCCESS
	}
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.busy[uuidStr] {
			return []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 1 << 30, GpuInstanceId: gi.id}}, nvml.SUCCESS
		}
		return nil, nvml.SUCCESS
	}
	gi.ci, gi.dev = ci, dev
}
