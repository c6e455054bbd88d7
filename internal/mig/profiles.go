// Package mig is the pure geometry of NVIDIA Multi-Instance GPU (MIG): the
// GPU-instance profiles each GPU model offers, where an instance of each may
// be placed (NVML's "possible placements", counted in memory slices), and
// the decisions built on them: which profile serves a request for memory
// and compute, where a new instance goes so that the largest profiles stay
// placeable, which instances block a profile, and how a mig-parted layout
// ("1g.5gb: 7") is arranged on a GPU.
//
// It imports nothing but the standard library, so the placement core (the
// scheduler and the simulator), the node agent (applying layouts, creating
// instances for pods) and the NVML mocks all use the same rules. The tables
// are NVIDIA's documented ones (MIG user guide, "Supported MIG Profiles",
// and `nvidia-smi mig -lgipp`); the tests check them against those tables.
package mig

import (
	"sort"
	"strings"
)

// NVML GPU-instance profile constants (nvml.GPU_INSTANCE_PROFILE_*), the
// argument of nvmlDeviceGetGpuInstanceProfileInfo. Repeated here, with
// their documented values, so that this package needs no cgo.
const (
	NVMLProfile1Slice     = 0
	NVMLProfile2Slice     = 1
	NVMLProfile3Slice     = 2
	NVMLProfile4Slice     = 3
	NVMLProfile7Slice     = 4
	NVMLProfile1SliceRev1 = 7 // 1g with media extensions (+me)
	NVMLProfile2SliceRev1 = 8 // 2g with media extensions (+me, A30)
	NVMLProfile1SliceRev2 = 9 // 1g with two memory slices (1g.10gb on A100-40GB)
)

// Profile is one GPU-instance profile of a model. Every instance Tessera
// creates holds one compute instance spanning the whole GPU instance, as
// mig-parted and NVIDIA's device plugin do; compute-instance sub-profiles
// (e.g. "1c.3g.20gb") are not offered.
type Profile struct {
	// Name as NVIDIA writes it: "<compute>g.<memory>gb", "+me" for the
	// variant with media extensions.
	Name string
	// NVMLProfile is the nvml.GPU_INSTANCE_PROFILE_* constant.
	NVMLProfile int
	// ID is the profile ID NVML reports for it (GpuInstanceProfileInfo.Id,
	// the first column of `nvidia-smi mig -lgip`).
	ID int
	// Compute is the number of compute slices (the "g" count).
	Compute int
	// MemorySlices is the number of memory slices an instance occupies:
	// the size of each of its placements.
	MemorySlices int
	// Starts are the memory slices an instance may start at.
	Starts []int
	// MaxInstances is the most instances of this profile one GPU holds.
	MaxInstances int
	// SMs is the number of streaming multiprocessors of an instance.
	SMs int
	// MemoryMiB is the instance's memory as NVML reports it on the
	// model's reference driver. A node agent publishes what its own NVML
	// reports, which takes precedence (see Model.WithMemory).
	MemoryMiB int64
	// Media reports the "+me" variant (decoders, JPEG, OFA); at most one
	// per GPU.
	Media bool
}

// Model is the MIG geometry of one GPU model.
type Model struct {
	// Name is the canonical name used in messages and tests.
	Name string
	// Family and MemoryGB identify the model from NVML's product name and
	// total memory (see ModelFor).
	Family   string
	MemoryGB int
	// MemorySlices and ComputeSlices are the GPU's slice counts.
	MemorySlices  int
	ComputeSlices int
	// SMs is the whole GPU's SM count (gpucores are a percentage of it).
	SMs      int
	Profiles []Profile
}

// the placements NVIDIA documents for every 8-memory-slice, 7-compute-slice
// GPU (A100, H100, H200).
var (
	starts1g   = []int{0, 1, 2, 3, 4, 5, 6}
	starts1g2m = []int{0, 2, 4, 6}
	starts2g   = []int{0, 2, 4}
	starts3g   = []int{0, 4}
	starts0    = []int{0}
)

// eightSlice builds the table of an 8-memory-slice GPU from its profile
// names and SM counts (1g, 1g+me, 1g with two memory slices, 2g, 3g, 4g,
// 7g) and memories in MiB.
func eightSlice(name, family string, memGB, sms int, names [7]string, smsOf [7]int, mib [7]int64) Model {
	m := Model{
		Name: name, Family: family, MemoryGB: memGB, MemorySlices: 8, ComputeSlices: 7, SMs: sms,
		Profiles: []Profile{
			{Name: names[0], NVMLProfile: NVMLProfile1Slice, Compute: 1, MemorySlices: 1, Starts: starts1g, MaxInstances: 7, SMs: smsOf[0], MemoryMiB: mib[0]},
			{Name: names[1], NVMLProfile: NVMLProfile1SliceRev1, Compute: 1, MemorySlices: 1, Starts: starts1g, MaxInstances: 1, SMs: smsOf[1], MemoryMiB: mib[1], Media: true},
			{Name: names[2], NVMLProfile: NVMLProfile1SliceRev2, Compute: 1, MemorySlices: 2, Starts: starts1g2m, MaxInstances: 4, SMs: smsOf[2], MemoryMiB: mib[2]},
			{Name: names[3], NVMLProfile: NVMLProfile2Slice, Compute: 2, MemorySlices: 2, Starts: starts2g, MaxInstances: 3, SMs: smsOf[3], MemoryMiB: mib[3]},
			{Name: names[4], NVMLProfile: NVMLProfile3Slice, Compute: 3, MemorySlices: 4, Starts: starts3g, MaxInstances: 2, SMs: smsOf[4], MemoryMiB: mib[4]},
			{Name: names[5], NVMLProfile: NVMLProfile4Slice, Compute: 4, MemorySlices: 4, Starts: starts0, MaxInstances: 1, SMs: smsOf[5], MemoryMiB: mib[5]},
			{Name: names[6], NVMLProfile: NVMLProfile7Slice, Compute: 7, MemorySlices: 8, Starts: starts0, MaxInstances: 1, SMs: smsOf[6], MemoryMiB: mib[6]},
		},
	}
	for i, id := range [7]int{19, 20, 15, 14, 9, 5, 0} {
		m.Profiles[i].ID = id
	}
	return m
}

// Models are the GPU models whose MIG geometry Tessera knows. A GPU of
// another model can still run a static layout the agent reads back from
// NVML, but dynamic MIG needs its geometry here.
var Models = []Model{
	eightSlice("A100-40GB", "A100", 40, 108,
		[7]string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
		[7]int{14, 14, 14, 28, 42, 56, 98},
		[7]int64{4864, 4864, 9856, 9856, 19968, 19968, 40192}),
	eightSlice("A100-80GB", "A100", 80, 108,
		[7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		[7]int{14, 14, 14, 28, 42, 56, 98},
		[7]int64{9728, 9728, 19968, 19968, 40192, 40192, 80896}),
	eightSlice("H100-80GB", "H100", 80, 132,
		[7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		[7]int{16, 16, 26, 32, 60, 64, 132},
		[7]int64{9984, 9984, 20096, 20096, 40448, 40448, 81152}),
	eightSlice("H200-141GB", "H200", 141, 132,
		[7]string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
		[7]int{16, 16, 26, 32, 60, 64, 132},
		// Estimates (the H100's sizes scaled by 141/80, rounded down to
		// 128 MiB) until measured on the reference driver; a node agent's
		// NVML values replace them.
		[7]int64{17536, 17536, 35328, 35328, 71168, 71168, 142976}),
	// A30 memory sizes are those of go-nvml's A30 mock (unverified on
	// hardware); a node agent's NVML values replace them.
	{
		Name: "A30-24GB", Family: "A30", MemoryGB: 24, MemorySlices: 4, ComputeSlices: 4, SMs: 56,
		Profiles: []Profile{
			{Name: "1g.6gb", ID: 14, NVMLProfile: NVMLProfile1Slice, Compute: 1, MemorySlices: 1, Starts: []int{0, 1, 2, 3}, MaxInstances: 4, SMs: 14, MemoryMiB: 5836},
			{Name: "1g.6gb+me", ID: 21, NVMLProfile: NVMLProfile1SliceRev1, Compute: 1, MemorySlices: 1, Starts: []int{0, 1, 2, 3}, MaxInstances: 1, SMs: 14, MemoryMiB: 5836, Media: true},
			{Name: "2g.12gb", ID: 5, NVMLProfile: NVMLProfile2Slice, Compute: 2, MemorySlices: 2, Starts: []int{0, 2}, MaxInstances: 2, SMs: 28, MemoryMiB: 11672},
			{Name: "2g.12gb+me", ID: 6, NVMLProfile: NVMLProfile2SliceRev1, Compute: 2, MemorySlices: 2, Starts: []int{0, 2}, MaxInstances: 1, SMs: 28, MemoryMiB: 11672, Media: true},
			{Name: "4g.24gb", ID: 0, NVMLProfile: NVMLProfile4Slice, Compute: 4, MemorySlices: 4, Starts: []int{0}, MaxInstances: 1, SMs: 56, MemoryMiB: 23344},
		},
	},
}

// ModelFor returns the geometry of a GPU from NVML's product name (e.g.
// "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3") and total memory in
// MiB: the family is read from the name, the memory size picks the
// variant (the nearest documented size). It returns false for a GPU whose
// geometry is not known.
func ModelFor(product string, memoryMiB int64) (*Model, bool) {
	upper := strings.ToUpper(product)
	gb := float64(memoryMiB) / 1024
	var best *Model
	bestDiff := 0.0
	for i := range Models {
		m := &Models[i]
		if !containsWord(upper, m.Family) {
			continue
		}
		diff := gb - float64(m.MemoryGB)
		if diff < 0 {
			diff = -diff
		}
		if best == nil || diff < bestDiff {
			best, bestDiff = m, diff
		}
	}
	// Within 12% of the documented size: "80GB" parts report 79-81 GiB,
	// 141 GB parts about 140 GiB; an unknown variant (e.g. H100 NVL 94GB)
	// is left out rather than given another model's geometry.
	if best == nil || bestDiff > 0.12*float64(best.MemoryGB) {
		return nil, false
	}
	return best, true
}

// containsWord reports whether s contains w delimited by non-alphanumerics.
func containsWord(s, w string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], w)
		if j < 0 {
			return false
		}
		j += i
		before := j == 0 || !isAlnum(s[j-1])
		after := j+len(w) == len(s) || !isAlnum(s[j+len(w)])
		if before && after {
			return true
		}
		i = j + 1
	}
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
}

// ModelByName returns a model by its canonical name ("A100-40GB").
func ModelByName(name string) (*Model, bool) {
	for i := range Models {
		if strings.EqualFold(Models[i].Name, name) {
			return &Models[i], true
		}
	}
	return nil, false
}

// Profile returns the model's profile of that name.
func (m *Model) Profile(name string) (*Profile, bool) {
	for i := range m.Profiles {
		if m.Profiles[i].Name == name {
			return &m.Profiles[i], true
		}
	}
	return nil, false
}

// ProfileNames lists the model's profile names, smallest first.
func (m *Model) ProfileNames() []string {
	out := make([]string, len(m.Profiles))
	for i, p := range m.bySize() {
		out[i] = p.Name
	}
	return out
}

// bySize returns the profiles ordered from the smallest (fewest memory
// slices, then fewest compute slices, then less memory; plain before +me)
// to the largest.
func (m *Model) bySize() []*Profile {
	out := make([]*Profile, len(m.Profiles))
	for i := range m.Profiles {
		out[i] = &m.Profiles[i]
	}
	sort.SliceStable(out, func(i, j int) bool { return smaller(out[i], out[j]) })
	return out
}

func smaller(a, b *Profile) bool {
	if a.MemorySlices != b.MemorySlices {
		return a.MemorySlices < b.MemorySlices
	}
	if a.Compute != b.Compute {
		return a.Compute < b.Compute
	}
	if a.MemoryMiB != b.MemoryMiB {
		return a.MemoryMiB < b.MemoryMiB
	}
	return !a.Media && b.Media
}

// WithMemory returns a copy of m whose profiles carry the memory sizes a
// node's NVML reports (profile name → MiB); names not in the map keep the
// table's value.
func (m *Model) WithMemory(mib map[string]int64) *Model {
	c := *m
	c.Profiles = append([]Profile(nil), m.Profiles...)
	for i := range c.Profiles {
		if v, ok := mib[c.Profiles[i].Name]; ok && v > 0 {
			c.Profiles[i].MemoryMiB = v
		}
	}
	return &c
}

// ProfileByNVML returns the model's profile for an nvml.GPU_INSTANCE_PROFILE_*
// constant.
func (m *Model) ProfileByNVML(c int) (*Profile, bool) {
	for i := range m.Profiles {
		if m.Profiles[i].NVMLProfile == c {
			return &m.Profiles[i], true
		}
	}
	return nil, false
}

// ProfileByID returns the model's profile with NVML's profile ID id.
func (m *Model) ProfileByID(id int) (*Profile, bool) {
	for i := range m.Profiles {
		if m.Profiles[i].ID == id {
			return &m.Profiles[i], true
		}
	}
	return nil, false
}

// Full returns the profile that spans the whole GPU (7g.40gb on an A100).
func (m *Model) Full() *Profile {
	ps := m.bySize()
	return ps[len(ps)-1]
}

// MaxInstances is the most instances one GPU of the model can hold at once
// (the smallest profile's count).
func (m *Model) MaxInstances() int {
	n := 0
	for _, p := range m.Profiles {
		n = max(n, p.MaxInstances)
	}
	return n
}

// CorePercent is an instance of p's compute as a percentage of the whole
// GPU's SMs, rounded down (what a MIG grant records as its cores).
func (m *Model) CorePercent(p *Profile) int {
	if m.SMs == 0 {
		return 0
	}
	return min(100, p.SMs*100/m.SMs)
}
