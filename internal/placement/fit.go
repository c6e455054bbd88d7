package placement

import (
	"math"
	"math/bits"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Grant is one container's share of one GPU in a Placement.
type Grant struct {
	GPU       int // position in Node.GPUs
	MemoryMiB int64
	// CeilingMiB is the memory ceiling above MemoryMiB (0: none).
	CeilingMiB int64
	Cores      int
	Exclusive  bool
	// MIG is set for a MIG device or instance (see MIGState).
	MIG *api.MIGGrant
}

// Placement is where a pod goes on one node: for each container of the
// compiled request that needs GPUs, the GPUs and shares it gets.
type Placement struct {
	Node *Node
	// grants of compiled container k are grants[offs[k]:offs[k+1]].
	grants []Grant
	offs   []int
	// Charge is what the pod adds to each GPU of the node, by position;
	// only the first len(Node.GPUs) entries are meaningful.
	charge [api.MaxGPUsPerNode]Usage
}

// Charge returns what the placement adds to GPU i of its node.
func (p *Placement) Charge(i int) Usage { return p.charge[i] }

// Grants returns the grants of the compiled request's k-th GPU container.
func (p *Placement) Grants(k int) []Grant { return p.grants[p.offs[k]:p.offs[k+1]] }

// CopyFrom makes p an independent copy of q (reusing p's buffers).
func (p *Placement) CopyFrom(q *Placement) {
	p.Node = q.Node
	p.grants = append(p.grants[:0], q.grants...)
	p.offs = append(p.offs[:0], q.offs...)
	p.charge = q.charge
}

func (p *Placement) reset(n *Node) {
	p.Node = n
	p.grants = p.grants[:0]
	p.offs = append(p.offs[:0], 0)
	if n != nil {
		clear(p.charge[:len(n.GPUs)])
	}
}

// Record renders the placement as the pod's allocation record: GPU
// containers in spec order, init containers first.
func (p *Placement) Record(cr *Compiled) *api.PodAllocation {
	rec := &api.PodAllocation{
		APIVersion: api.AllocationAPIVersion,
		Kind:       api.AllocationKind,
		Node:       p.Node.Name,
		Containers: []api.ContainerAllocation{},
	}
	emit := func(init bool, specs []Container) {
		for pos := range specs {
			for k, cc := range cr.gpu {
				if cc.init != init || cc.specPos != pos {
					continue
				}
				ca := api.ContainerAllocation{Name: cc.c.Name, Init: init}
				for _, g := range p.Grants(k) {
					ca.Devices = append(ca.Devices, api.DeviceGrant{
						UUID:       p.Node.GPUs[g.GPU].UUID,
						MemoryMiB:  g.MemoryMiB,
						CeilingMiB: g.CeilingMiB,
						Cores:      g.Cores,
						Exclusive:  g.Exclusive,
						MIG:        g.MIG,
					})
				}
				rec.Containers = append(rec.Containers, ca)
			}
		}
	}
	emit(true, cr.Req.InitContainers)
	emit(false, cr.Req.Containers)
	return rec
}

// GPURanker is implemented by policies that choose GPUs within a node
// themselves (fragmentation-aware ones). RankGPU scores giving one GPU's
// worth of a container's demand to GPU i of n, for the pod cr, where
// pending is what the pod already charges to that GPU. Higher is better.
type GPURanker interface {
	RankGPU(cr *Compiled, n *Node, i int, pending, demand Usage) float64
}

// GPUsRanker is a GPURanker that ranks all the candidate GPUs of a node
// for one container in one call, as RankGPU would one at a time: for each
// i in cand, rank[i] = RankGPU(cr, n, i, pending[i], demand[i]). Fit calls
// it once per container and node instead of RankGPU once per GPU, which
// saves a call per GPU and lets the ranker decide what depends only on
// the pod, or find what it keeps for the node, once.
type GPUsRanker interface {
	GPURanker
	RankGPUs(cr *Compiled, n *Node, cand []int, pending, demand []Usage, rank []float64)
}

// Scratch holds the working state of fit checks so they allocate nothing.
// One Scratch serves one goroutine at a time.
type Scratch struct {
	// pod[i] is what the containers placed so far charge GPU i; bit i of
	// held is set once they charge it anything (so the GPUs they do not
	// touch, most of them, are passed over without reading pod[i]).
	pod       [api.MaxGPUsPerNode]gpushare.Pod
	held      uint64
	eligible  [api.MaxGPUsPerNode]bool
	cand      [api.MaxGPUsPerNode]int
	rank      [api.MaxGPUsPerNode]float64
	set, best [api.MaxGPUsPerNode]int
	// For a GPUsRanker: the candidates it ranks and their pending charge
	// and demand, by GPU position.
	ranked    [api.MaxGPUsPerNode]int
	pend, dem [api.MaxGPUsPerNode]Usage
	// mig is the MIG working state, made on the first node with MIG GPUs
	// (so fit checks of other nodes keep a small Scratch).
	mig *migScratch
}

// migScratch is what the pod chose per GPU so far, and each candidate's
// choice for the container being placed.
type migScratch struct {
	pend [api.MaxGPUsPerNode]migPending
	ch   [api.MaxGPUsPerNode]migChoice
	ok   [api.MaxGPUsPerNode]bool
}

// Fit checks whether the compiled request fits node n and, if it does,
// fills p with the GPUs chosen by the request's GPU policy (or by ranker,
// if not nil). It allocates nothing once p and s have grown to size.
func (cr *Compiled) Fit(n *Node, ranker GPURanker, s *Scratch, p *Placement) Reason {
	r := cr.Req
	if free := n.FreeCPU(); r.CPUMilli > free {
		return Reason{Kind: ReasonCPU, Need: r.CPUMilli, Have: free}
	}
	if free := n.FreeMem(); r.MemoryMiB > free {
		return Reason{Kind: ReasonMemory, Need: r.MemoryMiB, Have: free}
	}
	p.reset(n)
	if !cr.needsGPU {
		return Reason{}
	}
	if len(n.GPUs) == 0 {
		return Reason{Kind: ReasonNoGPUs}
	}
	if reason := cr.markEligible(n, s); !reason.OK() {
		return reason
	}
	clear(s.pod[:len(n.GPUs)])
	s.held = 0
	if n.hasMIG {
		if s.mig == nil {
			s.mig = &migScratch{}
		}
		clear(s.mig.pend[:len(n.GPUs)])
	}
	for k := range cr.gpu {
		if reason := cr.placeContainer(n, k, ranker, s, p); !reason.OK() {
			return reason
		}
		p.offs = append(p.offs, len(p.grants))
	}
	for held := s.held; held != 0; held &= held - 1 {
		i := bits.TrailingZeros64(held)
		p.charge[i] = Usage(s.pod[i].Charge()) // (p.reset cleared the others)
	}
	return Reason{}
}

// markEligible marks the GPUs the pod may use at all (healthy, selected by
// model and UUID) and explains an empty set.
func (cr *Compiled) markEligible(n *Node, s *Scratch) Reason {
	r := cr.Req
	var unhealthy, excluded, notIncluded, uuid int
	var model string
	count := 0
	for i := range n.GPUs {
		g := &n.GPUs[i]
		s.eligible[i] = false
		if !g.Healthy {
			unhealthy++
			continue
		}
		if cr.selects {
			switch cr.modelVerdict(g) {
			case modelExcluded:
				excluded++
				model = g.Model
				continue
			case modelNotIncluded:
				notIncluded++
				model = g.Model
				continue
			}
			if cr.uuidIn != nil && !has(cr.uuidIn, g.UUID) || cr.uuidOut != nil && has(cr.uuidOut, g.UUID) {
				uuid++
				continue
			}
		}
		s.eligible[i] = true
		count++
	}
	if count > 0 {
		return Reason{}
	}
	switch {
	case excluded > 0:
		return Reason{Kind: ReasonModelExcluded, GPU: model, Detail: joinSelectors(r.ExcludeModels)}
	case notIncluded > 0:
		return Reason{Kind: ReasonModelNotIncluded, GPU: model, Detail: joinSelectors(r.IncludeModels)}
	case uuid > 0:
		return Reason{Kind: ReasonUUID}
	}
	return Reason{Kind: ReasonUnhealthy, Total: unhealthy}
}

func has(m map[string]struct{}, k string) bool { _, ok := m[k]; return ok }

// joinSelectors returns the selector list as written; a single selector
// (the common case) is returned without allocating.
func joinSelectors(xs []string) string {
	if len(xs) == 1 {
		return xs[0]
	}
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += ","
		}
		s += x
	}
	return s
}

// demandOn is one GPU's worth of the container's demand on g, as charged.
// (Kept within the inlining budget: callers turn a whole GPU into one
// replica on replicated GPUs, see replicaSlot. It reads the container's
// facts decided at compile time rather than copying its Container: this
// runs for every GPU of every node.)
func (cc *compiledContainer) demandOn(g *GPU) gpushare.Usage {
	if cc.excl {
		return gpushare.Whole(g.MemoryCap)
	}
	return gpushare.Share(cc.memoryOn(g), cc.c.Cores)
}

// memoryOn is the memory the container is granted on g (Container.memoryOn).
func (cc *compiledContainer) memoryOn(g *GPU) int64 { return cc.c.ask().MemoryOn(g.MemoryMiB) }

// slotted reports whether a container that asks no share of its own gets
// one equal slot (a replica) rather than the whole GPU: on GPUs shared by
// time-slicing or MPS, as NVIDIA's plugin gives every container one
// replica of 1/replicas.
func (cc *compiledContainer) slotted(g *GPU) bool { return cc.excl && replicated(g) }

// replicaSlot is one replica of g: an equal slot of its memory and cores
// (NVIDIA's 1/N).
func replicaSlot(g *GPU) gpushare.Usage { return gpushare.ReplicaSlot(g.MemoryMiB, g.MaxShares) }

// replicated reports a GPU shared by replicas (time-slicing, MPS).
func replicated(g *GPU) bool { return gpushare.Replicated(g.Sharing) }

// failures are the rules a share of one GPU breaks. rules decides them
// once: Fit takes a GPU that breaks none, and explain turns what the
// eligible GPUs break into the reason a user reads, so a rule added there
// is enforced and explained alike.
type failures uint16

const (
	// heldWhole: another pod holds the GPU whole.
	heldWhole failures = 1 << iota
	// notIdle: a whole-GPU request needs a GPU that no other pod, and no
	// other app container of this pod, holds a share of.
	notIdle
	// sharingMode: the GPU is in exclusive mode and takes whole-GPU
	// requests only.
	sharingMode
	// ownWhole: an app container of this pod holds the GPU whole. (Such a
	// GPU also breaks the memory, core or share rule, which explain names.)
	ownWhole
	// tooSmall: the share asks more memory than the GPU physically has.
	tooSmall
	// noMemory, noCores, noShares: the GPU's usage with the share would
	// exceed its memory (with overcommit), 100 % of its cores, or its
	// share slots: gpushare.Capacity.Exceeded's limits, in their order.
	noMemory
	noCores
	noShares
	// overcommitted: the share has a memory ceiling, and the GPU's memory
	// is overcommitted (its node's memoryOvercommit is above 1): its
	// guarantee would not be one.
	overcommitted
)

// overShift moves gpushare's limit bits onto noMemory, noCores, noShares.
const overShift = 5

// A compile-time check that the shift lines the bits up: the index is 0
// only if it does.
var _ = [1]struct{}{}[noMemory-failures(gpushare.LimitMemory)<<overShift+
	noCores-failures(gpushare.LimitCores)<<overShift+
	noShares-failures(gpushare.LimitShares)<<overShift]

// rules returns the rules compiled container cc breaks by taking d, its
// demand, on GPU i given what the pod already placed (0: it fits). With
// all false it may stop at the first rule broken (Fit needs no more);
// explain asks for all of them.
func (s *Scratch) rules(g *GPU, i int, cc *compiledContainer, d gpushare.Usage, all bool) failures {
	base := &g.Used
	pod := &s.pod[i]
	var f failures
	if base.Exclusive > 0 {
		f |= heldWhole
	}
	if d.Exclusive > 0 {
		// A whole GPU: nobody else may hold it, nor another app container
		// of this pod (init containers run at other times).
		if base.Shares > 0 || !cc.init && pod.App.Shares > 0 || g.MaxShares < 1 {
			f |= notIdle
		}
		return f
	}
	if g.Sharing == api.SharingExclusive {
		f |= sharingMode
	}
	if pod.App.Exclusive > 0 && !cc.init {
		f |= ownWhole
	}
	c := g.capacity()
	if !c.Holds(max(d.MemoryMiB, cc.ceiling)) {
		f |= tooSmall
	}
	if cc.ceiling > 0 && c.MemoryCap > c.MemoryMiB {
		f |= overcommitted
	}
	if f != 0 && !all {
		return f
	}
	// What the pod would charge the GPU with the share. (Not with(): this
	// is the hot path, and WithInit and WithApp inline where it does not.)
	var charge gpushare.Usage
	if cc.init {
		charge = pod.WithInit(d)
	} else {
		charge = pod.WithApp(d)
	}
	used := gpushare.Usage(*base)
	if !all && c.WithinAdding(used, charge) {
		return f // Fit's common case, decided at the cheapest
	}
	used.Add(charge)
	over := c.Exceeded(used) & (gpushare.LimitMemory | gpushare.LimitCores | gpushare.LimitShares)
	return f | failures(over)<<overShift
}

// with is what the pod would charge a GPU if container cc took d there.
func with(pod *gpushare.Pod, d gpushare.Usage, init bool) gpushare.Usage {
	if init {
		return pod.WithInit(d)
	}
	return pod.WithApp(d)
}

// placeContainer chooses the GPUs of the k-th compiled container and adds
// its demand to the pod's working charges.
func (cr *Compiled) placeContainer(n *Node, k int, ranker GPURanker, s *Scratch, p *Placement) Reason {
	cc := &cr.gpu[k]
	c := cc.c
	m := 0
	batch, _ := ranker.(GPUsRanker)
	r := 0 // candidates for batch
	for i := range n.GPUs {
		if !s.eligible[i] {
			continue
		}
		g := &n.GPUs[i]
		if n.hasMIG {
			s.mig.ok[i] = false
		}
		if g.MIG != nil || c.MIGProfile != "" {
			if s.mig == nil {
				continue // a MIG request on a node without MIG GPUs
			}
			ch, ok := cr.migFit(g, c, &s.mig.pend[i])
			if !ok {
				continue
			}
			s.mig.ch[i], s.mig.ok[i] = ch, true
			s.cand[m] = i
			// Binpack: the fuller GPU first; spread: the emptier.
			s.rank[i] = float64(len(g.MIG.Instances()) + s.mig.pend[i].n)
			if cr.gpuPol == api.GPUSpread {
				s.rank[i] = -s.rank[i]
			}
			m++
			continue
		}
		if c.GPUs > 1 && g.Sharing == api.SharingMPS {
			continue // an MPS client connects to one GPU's daemon
		}
		d := cc.demandOn(g)
		if d.Exclusive > 0 && replicated(g) {
			d = replicaSlot(g)
		}
		if s.rules(g, i, cc, d, false) != 0 {
			continue
		}
		s.cand[m] = i
		var pending Usage
		if s.held&(1<<i) != 0 {
			pending = Usage(s.pod[i].Charge())
		}
		switch {
		case batch != nil:
			s.ranked[r], s.pend[i], s.dem[i] = i, pending, Usage(d)
			r++
		case ranker != nil:
			s.rank[i] = ranker.RankGPU(cr, n, i, pending, Usage(d))
		default:
			s.rank[i] = builtinRank(cr.gpuPol, g, pending, Usage(d))
		}
		m++
	}
	if m < c.GPUs {
		if n.hasMIG || c.MIGProfile != "" {
			return cr.migReason(n, c, s)
		}
		return cr.explain(n, cc, s, m)
	}
	if r > 0 {
		batch.RankGPUs(cr, n, s.ranked[:r], s.pend[:], s.dem[:], s.rank[:])
	}
	chosen := s.set[:0]
	if c.GPUs == 1 && !cr.Req.NUMABind {
		best := s.cand[0]
		for _, i := range s.cand[1:m] {
			if s.rank[i] > s.rank[best] {
				best = i
			}
		}
		chosen = append(chosen, best)
	} else {
		var ok bool
		var most int
		chosen, ok, most = cr.chooseSet(n, s, m, c.GPUs)
		if !ok {
			return Reason{Kind: ReasonNUMA, Container: c.Name, Need: int64(c.GPUs), Have: int64(most)}
		}
	}
	for _, i := range chosen {
		g := &n.GPUs[i]
		if n.hasMIG && s.mig.ok[i] {
			ch := s.mig.ch[i]
			s.pod[i].Take(migCharge, cc.init)
			s.held |= 1 << i
			pp := &s.mig.pend[i]
			if pp.n < len(pp.inst) {
				pp.inst[pp.n], pp.dev[pp.n] = ch.inst, ch.device
				pp.n++
			}
			p.grants = append(p.grants, Grant{GPU: i, MemoryMiB: ch.memoryMiB, Cores: ch.cores,
				MIG: &api.MIGGrant{Profile: ch.inst.Profile, Start: ch.inst.Start, Device: ch.device}})
			continue
		}
		d := cc.demandOn(g)
		if d.Exclusive > 0 && replicated(g) {
			d = replicaSlot(g)
		}
		s.pod[i].Take(d, cc.init)
		s.held |= 1 << i
		if cc.slotted(g) {
			p.grants = append(p.grants, Grant{GPU: i, MemoryMiB: d.MemoryMiB, Cores: d.Cores})
			continue
		}
		p.grants = append(p.grants, Grant{GPU: i, MemoryMiB: cc.memoryOn(g), CeilingMiB: cc.ceiling, Cores: cc.cores, Exclusive: d.Exclusive > 0})
	}
	return Reason{}
}

// builtinRank scores a GPU for the binpack and spread GPU policies: the
// fraction of the GPU in use after the share is added (higher = fuller).
func builtinRank(pol api.GPUPolicy, g *GPU, pending, d Usage) float64 {
	after := float64(g.Used.MemoryMiB+pending.MemoryMiB+d.MemoryMiB)/float64(g.MemoryCap) +
		float64(g.Used.Cores+pending.Cores+d.Cores)/gpushare.FullCores
	if pol == api.GPUSpread {
		return -after
	}
	return after
}

// chooseSet picks count GPUs among the m candidates: within one NUMA node
// when the pod asks for NUMA binding, preferring strongly linked sets. For
// the topology-aware policy links decide first and rank breaks ties; for
// the others rank decides first. It returns the set, whether one was found,
// and (on failure) the most candidates any NUMA node had.
func (cr *Compiled) chooseSet(n *Node, s *Scratch, m, count int) ([]int, bool, int) {
	topo := cr.gpuPol == api.GPUTopologyAware
	bestLink, bestRank := -1, math.Inf(-1)
	bestLen := 0
	most := 0
	for seed := 0; seed < m; seed++ {
		first := s.cand[seed]
		set := s.set[:0]
		set = append(set, first)
		numa := n.GPUs[first].NUMANode
		inGroup := 0
		for j := 0; j < m; j++ {
			if !cr.Req.NUMABind || n.GPUs[s.cand[j]].NUMANode == numa {
				inGroup++
			}
		}
		most = max(most, inGroup)
		if inGroup < count {
			continue
		}
		links, rank := 0, s.rank[first]
		for len(set) < count {
			pick, pickLink, pickRank := -1, -1, math.Inf(-1)
			for j := 0; j < m; j++ {
				x := s.cand[j]
				if cr.Req.NUMABind && n.GPUs[x].NUMANode != numa || contains(set, x) {
					continue
				}
				l := 0
				for _, y := range set {
					l += n.Link(x, y)
				}
				if better(topo, l, s.rank[x], pickLink, pickRank) {
					pick, pickLink, pickRank = x, l, s.rank[x]
				}
			}
			set = append(set, pick)
			links += pickLink
			rank += pickRank
		}
		if better(topo, links, rank, bestLink, bestRank) {
			bestLink, bestRank = links, rank
			bestLen = copy(s.best[:], set)
		}
	}
	if bestLen == 0 {
		return nil, false, most
	}
	return s.best[:bestLen], true, most
}

func better(topo bool, link int, rank float64, bestLink int, bestRank float64) bool {
	if topo {
		return link > bestLink || link == bestLink && rank > bestRank
	}
	return rank > bestRank || rank == bestRank && link > bestLink
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// explain says why only m eligible GPUs can take container cc, from the
// rules each of them breaks.
func (cr *Compiled) explain(n *Node, cc *compiledContainer, s *Scratch, m int) Reason {
	c := cc.c
	name := c.Name
	if c.GPUs > 1 {
		mps := 0
		for i := range n.GPUs {
			if s.eligible[i] && n.GPUs[i].Sharing == api.SharingMPS {
				mps++
			}
		}
		if mps > 0 && mps+m >= c.GPUs {
			return Reason{Kind: ReasonMPSOneGPU, Container: name, Need: int64(c.GPUs)}
		}
	}
	slots := false
	for i := range n.GPUs {
		slots = slots || s.eligible[i] && cc.slotted(&n.GPUs[i])
	}
	if cc.excl && !slots {
		idle, total := 0, 0
		for i := range n.GPUs {
			if s.eligible[i] {
				total++
				g := &n.GPUs[i]
				if s.rules(g, i, cc, cc.demandOn(g), true)&notIdle == 0 { // (not slotted: see slots above)
					idle++
				}
			}
		}
		return Reason{Kind: ReasonWholeGPUs, Container: name, Need: int64(c.GPUs), Have: int64(idle), Total: total}
	}
	// Find the first rule that every eligible GPU breaks.
	var need, largest, physical int64
	var memGPU, coreGPU string
	mostCores, memOK, coresOK, sharesOK, modeOK, heldWholeBy, overcommit := -1, 0, 0, 0, 0, 0, 0
	for i := range n.GPUs {
		if !s.eligible[i] {
			continue
		}
		g := &n.GPUs[i]
		physical = max(physical, g.MemoryMiB)
		d := cc.demandOn(g)
		if d.Exclusive > 0 && replicated(g) {
			d = replicaSlot(g)
		}
		f := s.rules(g, i, cc, d, true)
		if f&sharingMode != 0 {
			continue
		}
		if f&heldWhole != 0 {
			heldWholeBy++
			continue
		}
		if f&overcommitted != 0 {
			overcommit++
			continue
		}
		modeOK++
		need = d.MemoryMiB
		// What the GPU has free for this container, beside what the pod
		// itself already holds there.
		nx := with(&s.pod[i], d, cc.init)
		if free := g.MemoryCap - g.Used.MemoryMiB - (nx.MemoryMiB - d.MemoryMiB); free > largest || memGPU == "" {
			largest, memGPU = free, g.UUID
		}
		if free := gpushare.FullCores - g.Used.Cores - (nx.Cores - d.Cores); free > mostCores {
			mostCores, coreGPU = free, g.UUID
		}
		if f&(noMemory|tooSmall) == 0 {
			memOK++
		}
		if f&noCores == 0 {
			coresOK++
		}
		if f&noShares == 0 {
			sharesOK++
		}
	}
	switch {
	case modeOK == 0 && heldWholeBy > 0:
		return Reason{Kind: ReasonHeldWhole, Container: name, Total: heldWholeBy}
	case modeOK == 0 && overcommit > 0:
		return Reason{Kind: ReasonMemoryOvercommitted, Container: name, Need: cc.ceiling, Total: overcommit}
	case modeOK == 0:
		return Reason{Kind: ReasonSharingMode, Container: name}
	case max(need, cc.ceiling) > physical:
		return Reason{Kind: ReasonGPUMemoryPhysical, Container: name, Need: max(need, cc.ceiling), Have: physical}
	case memOK == 0:
		return Reason{Kind: ReasonGPUMemory, Container: name, Need: need, Have: largest, GPU: memGPU}
	case coresOK == 0:
		return Reason{Kind: ReasonGPUCores, Container: name, Need: int64(c.Cores), Have: int64(mostCores), GPU: coreGPU}
	case sharesOK == 0:
		return Reason{Kind: ReasonShares, Container: name, Have: int64(n.GPUs[0].MaxShares)}
	}
	return Reason{Kind: ReasonGPUCount, Container: name, Need: int64(c.GPUs), Have: int64(m)}
}
