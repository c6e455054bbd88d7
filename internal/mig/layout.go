package mig

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// Instance is a GPU instance on one GPU: its profile and the memory slice
// its placement starts at.
type Instance struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
}

// String is "<profile>@<start>", the form used in messages.
func (i Instance) String() string { return fmt.Sprintf("%s@%d", i.Profile, i.Start) }

// occupancy is what a set of instances holds of one GPU.
type occupancy struct {
	mem     uint32 // bit s: memory slice s is held
	compute int
	media   int
	count   map[string]int
}

func span(start, size int) uint32 { return ((1 << size) - 1) << start }

// occupy checks that the instances can coexist on one GPU of the model and
// returns what they hold. The error names the instance and the rule.
func (m *Model) occupy(insts []Instance) (occupancy, error) {
	o := occupancy{count: map[string]int{}}
	for k, in := range insts {
		p, ok := m.Profile(in.Profile)
		if !ok {
			return o, fmt.Errorf("instance %d (%s): %s has no MIG profile %q (it has %s)", k, in, m.Name, in.Profile, strings.Join(m.ProfileNames(), ", "))
		}
		if !containsInt(p.Starts, in.Start) {
			return o, fmt.Errorf("instance %d (%s): %s cannot start at memory slice %d on %s (possible starts %v)", k, in, p.Name, in.Start, m.Name, p.Starts)
		}
		s := span(in.Start, p.MemorySlices)
		if o.mem&s != 0 {
			return o, fmt.Errorf("instance %d (%s): memory slices %d-%d overlap another instance", k, in, in.Start, in.Start+p.MemorySlices-1)
		}
		o.mem |= s
		o.compute += p.Compute
		o.count[p.Name]++
		if p.Media {
			o.media++
		}
		switch {
		case o.compute > m.ComputeSlices:
			return o, fmt.Errorf("instance %d (%s): %d compute slices in use, %s has %d", k, in, o.compute, m.Name, m.ComputeSlices)
		case o.count[p.Name] > p.MaxInstances:
			return o, fmt.Errorf("instance %d (%s): %d instances of %s, at most %d on %s", k, in, o.count[p.Name], p.Name, p.MaxInstances, m.Name)
		case o.media > 1:
			return o, fmt.Errorf("instance %d (%s): a second instance with media extensions (+me), at most one per GPU", k, in)
		}
	}
	return o, nil
}

// Validate checks that the instances can coexist on one GPU of the model.
func (m *Model) Validate(insts []Instance) error {
	_, err := m.occupy(insts)
	return err
}

// fits reports whether one more instance of p can start at s.
func (m *Model) fits(o occupancy, p *Profile, s int) bool {
	return o.mem&span(s, p.MemorySlices) == 0 &&
		o.compute+p.Compute <= m.ComputeSlices &&
		o.count[p.Name] < p.MaxInstances &&
		(!p.Media || o.media == 0)
}

// FreeStarts returns the starts at which an instance of p could be created
// beside insts (which must be valid), lowest first.
func (m *Model) FreeStarts(insts []Instance, p *Profile) []int {
	o, err := m.occupy(insts)
	if err != nil {
		return nil
	}
	var out []int
	for _, s := range p.Starts {
		if m.fits(o, p, s) {
			out = append(out, s)
		}
	}
	return out
}

// Need is what a container asks of one GPU that dynamic MIG must satisfy
// with one instance.
type Need struct {
	// MemoryMiB is the least memory the instance must have (0: any).
	MemoryMiB int64
	// Cores is the least compute, in percent of the whole GPU's SMs (0: any).
	Cores int
}

// Satisfies reports whether an instance of p gives at least need.
func (m *Model) Satisfies(p *Profile, need Need) bool {
	return p.MemoryMiB >= need.MemoryMiB && p.SMs*100 >= need.Cores*m.SMs
}

// Choice is a new instance: its profile and start.
type Choice struct {
	Profile *Profile
	Start   int
}

// Instance returns the choice as an Instance.
func (c Choice) Instance() Instance { return Instance{Profile: c.Profile.Name, Start: c.Start} }

// Choose picks the instance to create for need beside insts: the smallest
// profile (fewest memory slices, then compute slices, then memory) that
// satisfies need and has a free placement, at the start that leaves the
// most room for the largest profiles (see headroom). It never picks a
// profile with more memory than ShareProfile's (the smallest that
// satisfies need on an empty GPU): a container is given the memory it is
// charged for (the webhook charges a namespace's GPU memory quota that
// much), not a larger instance because a smaller one has no room.
// Profiles with media extensions are chosen only by name (Place). ok is
// false when no such profile both satisfies need and fits; Explain then
// says why.
func (m *Model) Choose(insts []Instance, need Need) (Choice, bool) {
	o, err := m.occupy(insts)
	if err != nil {
		return Choice{}, false
	}
	share, ok := m.ShareProfile(need)
	if !ok {
		return Choice{}, false
	}
	for _, p := range m.bySize() {
		if p.Media || !m.Satisfies(p, need) || p.MemoryMiB > share.MemoryMiB {
			continue
		}
		if s, ok := m.bestStart(o, p); ok {
			return Choice{Profile: p, Start: s}, true
		}
	}
	return Choice{}, false
}

// ShareProfile is the profile a share asking need is sized to: the
// smallest (as Choose orders them) without media extensions that
// satisfies it. Its memory is the most Choose gives for need.
func (m *Model) ShareProfile(need Need) (*Profile, bool) {
	for _, p := range m.bySize() {
		if !p.Media && m.Satisfies(p, need) {
			return p, true
		}
	}
	return nil, false
}

// Place picks the start for a new instance of the named profile beside
// insts, as Choose does.
func (m *Model) Place(insts []Instance, p *Profile) (int, bool) {
	o, err := m.occupy(insts)
	if err != nil {
		return 0, false
	}
	return m.bestStart(o, p)
}

func (m *Model) bestStart(o occupancy, p *Profile) (int, bool) {
	best, found := 0, false
	var bestRoom []int
	for _, s := range p.Starts {
		if !m.fits(o, p, s) {
			continue
		}
		next := o
		next.mem |= span(s, p.MemorySlices)
		next.compute += p.Compute
		room := m.headroom(next, p)
		if !found || lexGreater(room, bestRoom) {
			best, bestRoom, found = s, room, true
		}
	}
	return best, found
}

// headroom scores a GPU's occupancy by how many more instances of each
// profile could still be created, the largest profiles first, so that
// comparing two scores lexicographically prefers the layout that keeps
// big profiles placeable. (The counts are per profile, each on its own:
// what could still be created if only that profile were asked for.)
// added is the profile just placed (counted in o.count only for the check
// of MaxInstances).
func (m *Model) headroom(o occupancy, added *Profile) []int {
	ps := m.bySize()
	out := make([]int, 0, len(ps))
	for i := len(ps) - 1; i >= 0; i-- {
		p := ps[i]
		if p.Media {
			continue
		}
		used := o.count[p.Name]
		if p == added {
			used++
		}
		n, mem, compute := 0, o.mem, o.compute
		for _, s := range p.Starts {
			if used+n >= p.MaxInstances || compute+p.Compute > m.ComputeSlices {
				break
			}
			if mem&span(s, p.MemorySlices) == 0 {
				mem |= span(s, p.MemorySlices)
				compute += p.Compute
				n++
			}
		}
		out = append(out, n)
	}
	return out
}

func lexGreater(a, b []int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return false
}

// Blocking returns the existing instances that stand where an instance of
// p could start: for every possible placement of p, the instances whose
// memory slices overlap it, without duplicates, in insts order. When p
// cannot be placed and Blocking is empty, the limit is the compute slices
// or p's instance count (Explain says which).
func (m *Model) Blocking(insts []Instance, p *Profile) []Instance {
	var out []Instance
	seen := map[int]bool{}
	for _, s := range p.Starts {
		want := span(s, p.MemorySlices)
		for k, in := range insts {
			q, ok := m.Profile(in.Profile)
			if !ok || seen[k] {
				continue
			}
			if span(in.Start, q.MemorySlices)&want != 0 {
				seen[k] = true
				out = append(out, in)
			}
		}
	}
	return out
}

// Explain says, in words a user can act on, why no instance for need can
// be created beside insts.
func (m *Model) Explain(insts []Instance, need Need) string {
	var fit []*Profile
	for _, p := range m.bySize() {
		if !p.Media && m.Satisfies(p, need) {
			fit = append(fit, p)
		}
	}
	if len(fit) == 0 {
		big := m.bySize()[len(m.Profiles)-1]
		return fmt.Sprintf("no %s MIG profile has %d MiB and %d%% of the SMs (the largest, %s, has %d MiB and %d%%)",
			m.Name, need.MemoryMiB, need.Cores, big.Name, big.MemoryMiB, big.SMs*100/m.SMs)
	}
	p := fit[0]
	if b := m.Blocking(insts, p); len(b) > 0 {
		names := make([]string, len(b))
		for i, in := range b {
			names[i] = in.String()
		}
		return fmt.Sprintf("no free placement for %s (the smallest profile with %d MiB and %d%% of the SMs): instances %s hold its memory slices", p.Name, need.MemoryMiB, need.Cores, strings.Join(names, ", "))
	}
	o, _ := m.occupy(insts)
	if o.count[p.Name] >= p.MaxInstances {
		return fmt.Sprintf("%s already holds %d %s instances, the most it can", m.Name, o.count[p.Name], p.Name)
	}
	return fmt.Sprintf("%s needs %d compute slices, %d of %d are free", p.Name, p.Compute, m.ComputeSlices-o.compute, m.ComputeSlices)
}

// Arrange places a mig-parted layout (profile name → instance count) on an
// empty GPU of the model: larger profiles first, each at the lowest start
// that still lets the rest fit (a search over the few possible
// placements). The error names the layout and why it does not fit.
func (m *Model) Arrange(counts map[string]int) ([]Instance, error) {
	var want []*Profile
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := counts[n]
		if c < 0 {
			return nil, fmt.Errorf("MIG layout: %s count %d is negative", n, c)
		}
		if _, _, _, err := api.ParseMIGProfile(n); err != nil {
			return nil, err
		}
		p, ok := m.Profile(n)
		if !ok {
			return nil, fmt.Errorf("MIG layout: %s has no profile %q (it has %s)", m.Name, n, strings.Join(m.ProfileNames(), ", "))
		}
		if c > p.MaxInstances {
			return nil, fmt.Errorf("MIG layout: %d × %s, but %s holds at most %d", c, n, m.Name, p.MaxInstances)
		}
		for range c {
			want = append(want, p)
		}
	}
	sort.SliceStable(want, func(i, j int) bool { return smaller(want[j], want[i]) })
	out := make([]Instance, 0, len(want))
	if m.arrange(occupancy{count: map[string]int{}}, want, &out) {
		return out, nil
	}
	return nil, fmt.Errorf("MIG layout %s does not fit one %s (%d memory slices, %d compute slices)", describeCounts(counts), m.Name, m.MemorySlices, m.ComputeSlices)
}

func (m *Model) arrange(o occupancy, want []*Profile, out *[]Instance) bool {
	if len(want) == 0 {
		return true
	}
	p := want[0]
	for _, s := range p.Starts {
		if !m.fits(o, p, s) {
			continue
		}
		next := occupancy{mem: o.mem | span(s, p.MemorySlices), compute: o.compute + p.Compute, media: o.media, count: map[string]int{}}
		for k, v := range o.count {
			next.count[k] = v
		}
		next.count[p.Name]++
		if p.Media {
			next.media++
		}
		*out = append(*out, Instance{Profile: p.Name, Start: s})
		if m.arrange(next, want[1:], out) {
			return true
		}
		*out = (*out)[:len(*out)-1]
	}
	return false
}

func describeCounts(counts map[string]int) string {
	names := make([]string, 0, len(counts))
	for n, c := range counts {
		if c > 0 {
			names = append(names, fmt.Sprintf("%d×%s", c, n))
		}
	}
	sort.Strings(names)
	return "{" + strings.Join(names, ", ") + "}"
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
