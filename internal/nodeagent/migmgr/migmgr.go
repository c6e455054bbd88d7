// Package migmgr changes a GPU's MIG state through NVML: it applies
// mig-parted layouts (MIG mode, GPU instances, one compute instance per
// GPU instance) and, for dynamic MIG, creates and destroys single
// instances. The geometry (which placements coexist, how a layout is
// arranged) is internal/mig's; this package only talks to NVML and says,
// per GPU, what it did or why it could not.
package migmgr

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmlmig"
)

// Report says what Apply did to one GPU, or why it did nothing.
type Report struct {
	UUID  string
	Index int
	// Changed reports that the GPU's MIG state was changed.
	Changed bool
	// Message is what was done or found, in words.
	Message string
	// Err is set when the layout could not be applied.
	Err error
}

func (r Report) String() string {
	if r.Err != nil {
		return fmt.Sprintf("GPU %d (%s): %v", r.Index, r.UUID, r.Err)
	}
	return fmt.Sprintf("GPU %d (%s): %s", r.Index, r.UUID, r.Message)
}

// Errors Apply reports.
var (
	ErrResetRequired = errors.New("the MIG mode change is pending a GPU reset")
	ErrBusy          = errors.New("a MIG device is busy")
)

// Apply brings GPU d to the layout's entry for it (config.Layout.For):
// MIG mode first, then, with MIG on, the layout's instances. A GPU whose
// instances already match the layout is left alone; a GPU with a MIG
// device running processes is not changed (ErrBusy); a mode change that
// needs a GPU reset is requested and reported (ErrResetRequired). d's MIG
// state is re-read afterwards.
func Apply(d *discovery.Device, l *config.Layout) Report {
	r := Report{UUID: d.GPU.UUID, Index: d.GPU.Index}
	defer func() { _ = d.RefreshMIG() }()
	if !d.GPU.MIG.Capable {
		if e, ok := l.For(d.GPU.Index, d.PCIDeviceID); ok && e.MIGEnabled {
			r.Err = fmt.Errorf("layout %s enables MIG, but %s is not MIG capable", l.Name, d.GPU.Model)
		} else {
			r.Message = "not MIG capable; left as it is"
		}
		return r
	}
	e, ok := l.For(d.GPU.Index, d.PCIDeviceID)
	if !ok {
		r.Message = fmt.Sprintf("no entry of layout %s applies (index %d, PCI device 0x%08X); left as it is", l.Name, d.GPU.Index, d.PCIDeviceID)
		return r
	}
	if err := d.RefreshMIG(); err != nil {
		r.Err = err
		return r
	}
	if d.GPU.MIG.Enabled != e.MIGEnabled || d.MIGPending {
		if d.GPU.MIG.Enabled && !e.MIGEnabled {
			if err := destroyAll(d); err != nil {
				r.Err = err
				return r
			}
		}
		if err := setMode(d.Handle, e.MIGEnabled); err != nil {
			r.Err, r.Changed = err, true
			return r
		}
		r.Changed = true
		if !e.MIGEnabled {
			r.Message = fmt.Sprintf("layout %s: MIG mode turned off", l.Name)
			return r
		}
	}
	if !e.MIGEnabled {
		r.Message = fmt.Sprintf("layout %s: MIG mode off, as it is", l.Name)
		return r
	}
	if d.MIG == nil {
		r.Err = fmt.Errorf("layout %s: Tessera has no MIG geometry for %s (%d MiB), so it cannot arrange instances on it", l.Name, d.GPU.Model, d.GPU.MemoryMiB)
		return r
	}
	want, err := d.MIG.WithMemory(d.GPU.MIG.ProfileMemoryMiB).Arrange(e.Counts)
	if err != nil {
		r.Err = fmt.Errorf("layout %s: %w", l.Name, err)
		return r
	}
	gis, err := listGIs(d.Handle, d.MIG)
	if err != nil {
		r.Err = err
		return r
	}
	have := map[string]int{}
	complete := true
	for _, g := range gis {
		have[g.profile.Name]++
		complete = complete && g.hasCI
	}
	if complete && maps.Equal(have, e.Counts) {
		if !r.Changed {
			r.Message = fmt.Sprintf("layout %s (%s) already applied", l.Name, describe(e.Counts))
		} else {
			r.Message = fmt.Sprintf("layout %s (%s) applied", l.Name, describe(e.Counts))
		}
		return r
	}
	if err := destroyAll(d); err != nil {
		r.Err = err
		return r
	}
	r.Changed = true
	var made []string
	for _, in := range want {
		if _, err := Create(d.Handle, d.MIG, in); err != nil {
			r.Err = fmt.Errorf("layout %s: created %v, then %s: %w", l.Name, made, in, err)
			return r
		}
		made = append(made, in.String())
	}
	r.Message = fmt.Sprintf("layout %s applied: %s", l.Name, strings.Join(made, ", "))
	return r
}

func setMode(h nvml.Device, on bool) error {
	mode := nvml.DEVICE_MIG_DISABLE
	if on {
		mode = nvml.DEVICE_MIG_ENABLE
	}
	act, ret := h.SetMigMode(mode)
	switch {
	case ret != nvml.SUCCESS:
		return fmt.Errorf("SetMigMode(%v): %v", on, ret)
	case act == nvml.ERROR_RESET_REQUIRED:
		return fmt.Errorf("%w (MIG mode %s requested; reset the GPU, e.g. nvidia-smi --gpu-reset, with no processes on it)", ErrResetRequired, map[bool]string{true: "on", false: "off"}[on])
	case act != nvml.SUCCESS:
		return fmt.Errorf("SetMigMode(%v): activation %v", on, act)
	}
	if cur, pend, ret := h.GetMigMode(); ret == nvml.SUCCESS && cur != pend {
		return ErrResetRequired
	}
	return nil
}

// gi is one GPU instance found through NVML.
type gi struct {
	handle  nvml.GpuInstance
	id      int
	profile *mig.Profile
	start   int
	hasCI   bool
}

func listGIs(h nvml.Device, m *mig.Model) ([]gi, error) {
	var out []gi
	for i := range m.Profiles {
		p := &m.Profiles[i]
		info, ret := h.GetGpuInstanceProfileInfo(p.NVMLProfile)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := h.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GetGpuInstances(%s): %v", p.Name, ret)
		}
		for _, g := range gis {
			gInfo, ret := g.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("GPU instance info: %v", ret)
			}
			cis, err := computeInstances(g, p)
			if err != nil {
				return nil, err
			}
			out = append(out, gi{handle: g, id: int(gInfo.Id), profile: p, start: int(gInfo.Placement.Start), hasCI: len(cis) > 0})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out, nil
}

func computeInstances(g nvml.GpuInstance, p *mig.Profile) ([]nvml.ComputeInstance, error) {
	info, ret := g.GetComputeInstanceProfileInfo(nvmlmig.ComputeInstanceProfile(p.Compute), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("compute-instance profile of %s: %v", p.Name, ret)
	}
	cis, ret := g.GetComputeInstances(&info)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetComputeInstances(%s): %v", p.Name, ret)
	}
	return cis, nil
}

// busy names the MIG devices of d that run processes.
func busy(d *discovery.Device) []string {
	var out []string
	for _, m := range d.MIGDevices {
		if ps, ret := m.Handle.GetComputeRunningProcesses(); ret == nvml.SUCCESS && len(ps) > 0 {
			out = append(out, fmt.Sprintf("%s (%s@%d, %d processes)", m.UUID, m.Profile, m.Start, len(ps)))
		}
	}
	return out
}

// destroyAll removes every compute and GPU instance of d, unless a MIG
// device is busy.
func destroyAll(d *discovery.Device) error {
	if b := busy(d); len(b) > 0 {
		return fmt.Errorf("%w: %s; nothing changed", ErrBusy, strings.Join(b, ", "))
	}
	if d.MIG == nil {
		return fmt.Errorf("no MIG geometry for %s: cannot list its instances", d.GPU.Model)
	}
	gis, err := listGIs(d.Handle, d.MIG)
	if err != nil {
		return err
	}
	for _, g := range gis {
		if err := destroy(g); err != nil {
			return err
		}
	}
	return nil
}

func destroy(g gi) error {
	cis, err := computeInstances(g.handle, g.profile)
	if err != nil {
		return err
	}
	for _, ci := range cis {
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			if ret == nvml.ERROR_IN_USE {
				return fmt.Errorf("%w: compute instance of %s@%d", ErrBusy, g.profile.Name, g.start)
			}
			return fmt.Errorf("destroying the compute instance of %s@%d: %v", g.profile.Name, g.start, ret)
		}
	}
	if ret := g.handle.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("destroying GPU instance %s@%d: %v", g.profile.Name, g.start, ret)
	}
	return nil
}

// Create makes a GPU instance of in's profile at its start, with one
// compute instance spanning it, and returns the MIG device's UUID. If the
// compute instance cannot be made, the GPU instance is removed again.
func Create(h nvml.Device, m *mig.Model, in mig.Instance) (string, error) {
	p, ok := m.Profile(in.Profile)
	if !ok {
		return "", fmt.Errorf("%s has no MIG profile %q", m.Name, in.Profile)
	}
	info, ret := h.GetGpuInstanceProfileInfo(p.NVMLProfile)
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("profile %s: %v", p.Name, ret)
	}
	g, ret := h.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(in.Start), Size: uint32(p.MemorySlices)})
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("creating GPU instance %s: %v", in, ret)
	}
	ciInfo, ret := g.GetComputeInstanceProfileInfo(nvmlmig.ComputeInstanceProfile(p.Compute), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret == nvml.SUCCESS {
		_, ret = g.CreateComputeInstance(&ciInfo)
	}
	if ret != nvml.SUCCESS {
		_ = g.Destroy()
		return "", fmt.Errorf("creating the compute instance of %s: %v", in, ret)
	}
	gInfo, _ := g.GetInfo()
	return migUUID(h, int(gInfo.Id))
}

// migUUID finds the UUID of the MIG device of GPU instance id.
func migUUID(h nvml.Device, id int) (string, error) {
	n, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("GetMaxMigDeviceCount: %v", ret)
	}
	for i := 0; i < n; i++ {
		md, ret := h.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		if g, ret := md.GetGpuInstanceId(); ret == nvml.SUCCESS && g == id {
			u, ret := md.GetUUID()
			if ret != nvml.SUCCESS {
				return "", fmt.Errorf("GetUUID: %v", ret)
			}
			return u, nil
		}
	}
	return "", fmt.Errorf("no MIG device for GPU instance %d", id)
}

// Destroy removes the instance at in (profile and start) from GPU d, with
// its compute instance. A busy MIG device is not destroyed (ErrBusy).
func Destroy(d *discovery.Device, in mig.Instance) error {
	if d.MIG == nil {
		return fmt.Errorf("no MIG geometry for %s", d.GPU.Model)
	}
	gis, err := listGIs(d.Handle, d.MIG)
	if err != nil {
		return err
	}
	for _, g := range gis {
		if g.profile.Name == in.Profile && g.start == in.Start {
			for _, m := range d.MIGDevices {
				if m.GPUInstanceID == g.id {
					if ps, ret := m.Handle.GetComputeRunningProcesses(); ret == nvml.SUCCESS && len(ps) > 0 {
						return fmt.Errorf("%w: %s (%s) runs %d processes", ErrBusy, m.UUID, in, len(ps))
					}
				}
			}
			return destroy(g)
		}
	}
	return fmt.Errorf("no GPU instance %s", in)
}

// Instances returns the GPU instances of d as internal/mig's instances.
func Instances(d *discovery.Device) ([]mig.Instance, error) {
	if d.MIG == nil {
		return nil, nil
	}
	gis, err := listGIs(d.Handle, d.MIG)
	if err != nil {
		return nil, err
	}
	out := make([]mig.Instance, len(gis))
	for i, g := range gis {
		out[i] = mig.Instance{Profile: g.profile.Name, Start: g.start}
	}
	return out, nil
}

func describe(c map[string]int) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		out = append(out, fmt.Sprintf("%d×%s", c[k], k))
	}
	return strings.Join(out, ", ")
}

// EnableMIG turns MIG mode on (dynamic MIG), leaving instances alone.
func EnableMIG(d *discovery.Device) Report {
	r := Report{UUID: d.GPU.UUID, Index: d.GPU.Index}
	defer func() { _ = d.RefreshMIG() }()
	if err := d.RefreshMIG(); err != nil {
		r.Err = err
		return r
	}
	if d.MIG == nil {
		r.Err = fmt.Errorf("dynamic MIG: Tessera has no MIG geometry for %s (%d MiB); the GPU is served whole", d.GPU.Model, d.GPU.MemoryMiB)
		return r
	}
	if d.GPU.MIG.Enabled && !d.MIGPending {
		r.Message = "dynamic MIG: MIG mode on"
		return r
	}
	if err := setMode(d.Handle, true); err != nil {
		r.Err, r.Changed = err, true
		return r
	}
	r.Changed, r.Message = true, "dynamic MIG: MIG mode turned on"
	return r
}
