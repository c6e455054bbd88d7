package policies

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// FGD is fragmentation gradient descent (Weng et al., ATC '23): it places a
// pod where the node's expected fragmentation against the target workload
// grows least, and a share on the GPU of that node where it grows least.
// As in the original the score is int(100·sigmoid(−Δ/1000)) with Δ in
// thousandths of a GPU and ties between GPUs go to the lowest index; ties
// between nodes go to the first node (Search.Best), which is what
// reproduces the published results.
//
// Scoring takes no lock, so kube-scheduler may score many nodes at once:
// what the policy learned is an immutable snapshot (the target workload's
// model) published with an atomic pointer by Observe; per-pod work (the
// pod's shape) is done once by ForPod; per-node values are cached in a
// lock-free table (nodeCache) until the node or the snapshot changes.
type FGD struct {
	name string
	snap atomic.Pointer[snapshot]
	// learnMu serialises Observe's learning; scoring never takes it.
	learnMu sync.Mutex
	learn   *learner // nil once a target was set
	// newModel builds the fragmentation model of a workload's tasks,
	// learned from observed pods or given by SetTarget.
	newModel func(tasks []Shape, learned bool) *fragModel
	// scoring turns fragmentation changes into scores.
	scoring scoring
	// tables caches per pod shape each node's values (shapeTables);
	// replaced by an empty set when a new snapshot is published or when
	// it is full, so its memory stays bounded however many shapes come.
	tables atomic.Pointer[shapeTables]
	// last is the pod Observe prepared last (normally the one being
	// placed), so a caller that scores through the FGD itself rather than
	// through ForPod does not prepare the pod again for every node.
	last atomic.Pointer[podScorer]
}

// snapshot is what the policy has learned, immutable once published.
type snapshot struct {
	gen   uint64
	model *fragModel
}

// scoring is how a policy of the FGD family scores: node turns a node's
// fragmentation change (Δ, thousandths of a GPU) into its score, gpu ranks
// a share's GPUs by the change there. With priced set (tessera), a share's
// node score also pays for the packing loss of the GPU it goes to.
type scoring struct {
	node, gpu func(delta float64) float64
	// perGPU also caches, for a share, the node's score with the share
	// on each GPU (tessera), so the node is scored at the GPU Fit chose
	// (and its packing loss added) rather than at the best by gpu.
	perGPU bool
	// lossWeight is what a share's node score loses per GPU of packing
	// loss (pricing.loss) on the GPU it goes to; 0 disables.
	lossWeight float64
	// multiCPUFit breaks ties for a multi-GPU task towards the node it
	// leaves the least CPU on.
	multiCPUFit bool
	// rankByLoss ranks a share's GPUs within a node by packing loss,
	// then best fit, instead of by gpu (tessera with pricing).
	rankByLoss bool
}

// fgdEntry is what the cache keeps for a pod shape on a node state: the
// node's score and, for a share, the rank of each GPU (−Inf where the
// share does not fit) and, with scoring.perGPU, the node's score with the
// share on each GPU.
type fgdEntry struct {
	node   float64
	gpu    []float64
	nodeAt []float64
	// rank and priced, for a share the policy prices (tessera): per GPU
	// the share's rank by packing loss (rankGPU's rankByLoss rank) and the
	// node's score with the share there less its packing loss (scoreNode),
	// which depend only on the node's state, the shape and the model, so
	// ranking a node's GPUs and scoring it read them instead of computing
	// every GPU's free share (a division each) for every pod.
	rank, priced []float64
	// small holds gpu, nodeAt, rank and priced for nodes of up to
	// smallGPUs GPUs, so an entry is one allocation (one cache miss fewer
	// per lookup).
	small [4 * smallGPUs]float64
}

const smallGPUs = 8

// fgdQuantised is the original's integer score.
func fgdQuantised(delta float64) float64 {
	return float64(int64(sigmoid(-delta/1000) * 100))
}

// NewFGD returns an FGD policy that learns its target workload from the
// pods it observes until SetTarget gives it one. It makes no random
// choices, so it takes no seed.
func NewFGD() *FGD {
	return newFGD(NameFGD, scoring{node: fgdQuantised, gpu: fgdQuantised},
		func(t []Shape, _ bool) *fragModel { return newFragModel(PopularShapes(t, 0.95), false) })
}

func newFGD(name string, sc scoring, newModel func(tasks []Shape, learned bool) *fragModel) *FGD {
	f := &FGD{name: name, learn: newLearner(), newModel: newModel, scoring: sc}
	f.snap.Store(&snapshot{})
	f.tables.Store(new(shapeTables))
	return f
}

func (f *FGD) Name() string { return f.name }

// SetTarget fixes the target workload: the popular shapes of tasks.
func (f *FGD) SetTarget(tasks []Shape) {
	f.learnMu.Lock()
	defer f.learnMu.Unlock()
	f.learn = nil
	f.publish(f.newModel(tasks, false))
}

// publish makes a model the one scoring uses. Called with learnMu held.
func (f *FGD) publish(m *fragModel) {
	f.snap.Store(&snapshot{gen: f.snap.Load().gen + 1, model: m})
	// Values cached under the old model are never read again.
	f.tables.Store(new(shapeTables))
	f.last.Store(nil)
}

// Observe notes the pod about to be placed and, without a fixed target,
// learns the workload; a new model is built and published at 1, 2, 4, …
// observations and then every 1024 (see learner), not while scoring.
func (f *FGD) Observe(cr *placement.Compiled) {
	s := ShapeOf(cr)
	f.learnMu.Lock()
	if f.learn != nil && f.learn.add(s) {
		f.publish(f.newModel(f.learn.seen, true))
	}
	f.learnMu.Unlock()
	f.last.Store(f.prepare(cr, s))
}

// ForPod returns the scorer of one pod (placement.PodPolicy): its shape
// and the current snapshot, fixed for the pod's scheduling cycle, safe for
// concurrent use.
func (f *FGD) ForPod(cr *placement.Compiled) placement.Policy { return f.scorer(cr) }

func (f *FGD) prepare(cr *placement.Compiled, s Shape) *podScorer {
	key := keyShape(s)
	ps := &podScorer{f: f, cr: cr, snap: f.snap.Load(), shape: key, table: f.shapeTable(key)}
	if pr := ps.snap.model.pricedBy(f.scoring); pr != nil && key.Share() {
		// The share's packing loss on a GPU with g% free, for every g.
		ps.pct = sharePercent(key.GPUMilli)
		ps.loss = new([101]float64)
		for g := ps.pct; g <= 100; g++ {
			ps.loss[g] = pr.loss(g, ps.pct)
		}
		ps.rankByLoss = f.scoring.rankByLoss
	}
	ps.perGPU = f.scoring.perGPU && key.Share()
	gpuContainers := 0
	for _, c := range cr.Req.InitContainers {
		if c.GPUs > 0 {
			gpuContainers++
		}
	}
	for _, c := range cr.Req.Containers {
		if c.GPUs > 0 {
			gpuContainers++
		}
	}
	ps.single = gpuContainers == 1
	return ps
}

// scorer is the prepared scorer of cr: the one Observe made if it is for
// cr, else a fresh one.
func (f *FGD) scorer(cr *placement.Compiled) *podScorer {
	if ps := f.last.Load(); ps != nil && ps.cr == cr && ps.snap == f.snap.Load() {
		return ps
	}
	return f.prepare(cr, ShapeOf(cr))
}

func (f *FGD) ScoreNode(cr *placement.Compiled, p *placement.Placement) float64 {
	return f.scorer(cr).ScoreNode(cr, p)
}

func (f *FGD) RankGPU(cr *placement.Compiled, n *placement.Node, i int, pending, demand placement.Usage) float64 {
	return f.scorer(cr).RankGPU(cr, n, i, pending, demand)
}

func (f *FGD) RankGPUs(cr *placement.Compiled, n *placement.Node, cand []int, pending, demand []placement.Usage, rank []float64) {
	f.scorer(cr).RankGPUs(cr, n, cand, pending, demand, rank)
}

// shapeTable returns the node table of a pod shape, starting an empty set
// of tables when the current one holds maxCachedShapes shapes.
func (f *FGD) shapeTable(key Shape) *NodeTable[fgdEntry] {
	for range 2 {
		st := f.tables.Load()
		if t := st.table(key); t != nil {
			return t
		}
		f.tables.CompareAndSwap(st, new(shapeTables))
	}
	// Filled again by other goroutines meanwhile: a table of its own,
	// which caches for this pod only.
	return new(NodeTable[fgdEntry])
}

// keyShape drops what FGD ignores (memory) so cache keys collide.
func keyShape(s Shape) Shape { s.MemMiB = 0; return s }

// podScorer scores one pod against one snapshot of an FGD-family policy.
type podScorer struct {
	f     *FGD
	cr    *placement.Compiled
	snap  *snapshot
	shape Shape // keyShape of the pod's shape
	table *NodeTable[fgdEntry]
	// loss[g] is a share's packing loss on a GPU with g% free (pct ≤ g),
	// when the policy prices shares; nil otherwise.
	loss *[101]float64
	pct  int
	// rankByLoss: rank the share's GPUs by loss (scoring.rankByLoss,
	// priced); perGPU: score the node at the GPU Fit chose; single: the
	// pod has one GPU container, so Fit's one grant names that GPU.
	rankByLoss, perGPU, single bool
}

func (ps *podScorer) Name() string { return ps.f.name }

// Generation: a scorer's scores depend only on its pod's request, the
// node's state and the snapshot it holds (placement.Memoizable), so a
// search may remember them until the policy publishes a new snapshot.
func (ps *podScorer) Generation() (any, uint64) { return ps.f, ps.snap.gen }

// own returns ps if it serves cr, else a scorer for cr (a caller that
// passes another pod than the one prepared).
func (ps *podScorer) own(cr *placement.Compiled) *podScorer {
	if cr == ps.cr {
		return ps
	}
	return ps.f.prepare(cr, ShapeOf(cr))
}

// entry returns the cached scores of the pod's shape on n.
func (ps *podScorer) entry(n *placement.Node) *fgdEntry {
	m := ps.snap.model
	if m == nil {
		return nil
	}
	return ps.table.Get(n, ps.snap.gen, func(e *fgdEntry) {
		fragScores(m, n, ps.shape, ps.f.scoring, e)
		if ps.loss != nil && e.nodeAt != nil {
			ps.priceGPUs(n, e)
		}
	})
}

// priceGPUs fills e.rank and e.priced, for a priced share, from the
// node's state (see fgdEntry): exactly what rankGPU and scoreNode would
// compute for each GPU.
func (ps *podScorer) priceGPUs(n *placement.Node, e *fgdEntry) {
	k := len(n.GPUs)
	vals := e.small[:2*smallGPUs] // first: the values every pod reads
	if k > smallGPUs {
		vals = make([]float64, 2*k)
	}
	e.rank, e.priced = vals[:k:k], vals[k:2*k:2*k]
	for i := range n.GPUs {
		free := FreeMilli(&n.GPUs[i])
		g := freePercent(free)
		if g < ps.pct {
			e.rank[i] = -float64(free) // BestGPU's rank of a share
		} else {
			e.rank[i] = -(lossRank*ps.loss[g] + float64(g-ps.pct))
		}
		if math.IsInf(e.gpu[i], 0) {
			e.priced[i] = e.node // scoreNode's score where the share does not fit
		} else {
			e.priced[i] = ps.pricedAt(e, i, g)
		}
	}
}

// pricedAt is the node's score with the share on GPU i, whose free share
// is g%, less the share's packing loss there.
func (ps *podScorer) pricedAt(e *fgdEntry, i, g int) float64 {
	score := e.nodeAt[i]
	if g >= ps.pct {
		score -= ps.f.scoring.lossWeight * ps.loss[g]
	}
	return score
}

func (ps *podScorer) ScoreNode(cr *placement.Compiled, p *placement.Placement) float64 {
	ps = ps.own(cr)
	v := ps.scoreNode(p)
	if ps.f.scoring.multiCPUFit && ps.shape.NumGPU > 1 {
		// Less than one point of the integer score: it only breaks ties.
		// Nodes whose CPU is not counted (placement.Unlimited) all tie.
		left := min(max(0, p.Node.FreeCPU()-ps.shape.CPUMilli), cpuTieCap)
		v -= 1e-4 * float64(left) / cpuTieCap
	}
	return v
}

// cpuTieCap bounds the CPU (millicores) multiCPUFit tells apart.
const cpuTieCap = 1 << 20

func (ps *podScorer) scoreNode(p *placement.Placement) float64 {
	e := ps.entry(p.Node)
	if e == nil {
		return 0
	}
	if !ps.perGPU {
		return e.node
	}
	// Tessera: the score of the GPU Fit chose, less its packing loss.
	gi := -1
	if ps.single {
		if g := p.Grants(0); len(g) == 1 {
			gi = g[0].GPU
		}
	} else {
		for i := range p.Node.GPUs {
			if p.Charge(i) != (placement.Usage{}) {
				if gi >= 0 {
					return e.node // several GPUs (several containers): unpriced
				}
				gi = i
			}
		}
	}
	switch {
	case gi < 0:
		return e.node
	case e.priced != nil:
		return e.priced[gi] // e.node where the share does not fit
	case math.IsInf(e.gpu[gi], 0):
		return e.node
	case ps.loss != nil:
		return ps.pricedAt(e, gi, freePercent(FreeMilli(&p.Node.GPUs[gi])))
	}
	return e.nodeAt[gi]
}

func (ps *podScorer) RankGPU(cr *placement.Compiled, n *placement.Node, i int, pending, demand placement.Usage) float64 {
	if demand.Exclusive > 0 || pending != (placement.Usage{}) {
		return BestGPU(n, i, demand)
	}
	var e *fgdEntry
	return ps.own(cr).rankGPU(n, i, pending, demand, &e)
}

// RankGPUs ranks a container's candidate GPUs on n in one call
// (placement.GPUsRanker), as RankGPU does one at a time: the pod is
// checked once and the node's cache entry looked up at most once.
func (ps *podScorer) RankGPUs(cr *placement.Compiled, n *placement.Node, cand []int, pending, demand []placement.Usage, rank []float64) {
	ps = ps.own(cr)
	var e *fgdEntry
	if ps.rankByLoss && ps.shape.Share() {
		// Tessera's common case, with rankGPU's checks that depend only
		// on the pod made once: each GPU's rank is read from the entry.
		if e = ps.entry(n); e != nil && e.rank != nil {
			for _, i := range cand {
				if d := demand[i]; d.Exclusive > 0 || pending[i] != (placement.Usage{}) || int64(d.Cores)*10 != ps.shape.GPUMilli {
					rank[i] = BestGPU(n, i, d)
				} else {
					rank[i] = e.rank[i]
				}
			}
			return
		}
	}
	for _, i := range cand {
		rank[i] = ps.rankGPU(n, i, pending[i], demand[i], &e)
	}
}

// rankGPU is RankGPU for the pod ps serves; *e is n's cache entry once
// looked up (nil before).
func (ps *podScorer) rankGPU(n *placement.Node, i int, pending, demand placement.Usage, e **fgdEntry) float64 {
	// The per-GPU values are for a single-share pod; a pod with several
	// sharing containers is ranked best-fit.
	if demand.Exclusive > 0 || pending != (placement.Usage{}) ||
		!ps.shape.Share() || int64(demand.Cores)*10 != ps.shape.GPUMilli {
		return BestGPU(n, i, demand)
	}
	if *e == nil {
		*e = ps.entry(n)
	}
	if ps.rankByLoss {
		// Tessera: the GPU where the share loses least, then the one it
		// fills best (lowest index on ties): cached with the node's
		// entry (priceGPUs), else computed here.
		if *e != nil && (*e).rank != nil {
			return (*e).rank[i]
		}
		g := freePercent(FreeMilli(&n.GPUs[i]))
		if g < ps.pct {
			return BestGPU(n, i, demand)
		}
		return -(lossRank*ps.loss[g] + float64(g-ps.pct))
	}
	if *e == nil {
		return BestGPU(n, i, demand)
	}
	return (*e).gpu[i]
}

// lossRank puts any packing loss (at least about 1e-3 of a GPU) before
// the room left (at most 100%) in a share's GPU rank.
const lossRank = 1e6

// pricedBy returns the prices a share's placement pays for under sc, or
// nil.
func (m *fragModel) pricedBy(sc scoring) *pricing {
	if m == nil || sc.lossWeight <= 0 {
		return nil
	}
	return m.prices
}

// fragScores computes the cache entry of placing s on n: for a share, per
// GPU its rank by sc.gpu (−Inf where it does not fit) and with sc.perGPU
// the node's score with the share there; and the node's score (for a
// share, with it on its best GPU by sc.gpu).
func fragScores(m *fragModel, n *placement.Node, s Shape, sc scoring, e *fgdEntry) {
	var buf [api.MaxGPUsPerNode]int64
	free := NodeFree(n, &buf)
	access := m.accessFor(nodeModel(n))
	before := m.frag(access, n.FreeCPU(), n.FreeMem(), free)
	cpu, mem := n.FreeCPU()-s.CPUMilli, n.FreeMem()-s.MemMiB
	switch {
	case s.Share():
		vals := e.small[2*smallGPUs:]
		if len(free) > smallGPUs {
			vals = make([]float64, 2*len(free))
		}
		e.gpu = vals[:len(free):len(free)]
		if sc.perGPU {
			e.nodeAt = vals[len(free) : 2*len(free)]
		}
		e.node = math.Inf(-1)
		best := math.Inf(-1)
		for i := range free {
			e.gpu[i] = math.Inf(-1)
			if free[i] < s.GPUMilli {
				continue
			}
			free[i] -= s.GPUMilli
			d := m.frag(access, cpu, mem, free) - before
			free[i] += s.GPUMilli
			g := sc.gpu(d)
			e.gpu[i] = g
			if sc.perGPU {
				e.nodeAt[i] = sc.node(d)
			}
			if g > best {
				best, e.node = g, sc.node(d)
			}
		}
	case s.NumGPU > 0:
		need := s.NumGPU
		for i := range free {
			if need > 0 && free[i] == Milli {
				free[i] = 0
				need--
			}
		}
		e.node = sc.node(m.frag(access, cpu, mem, free) - before)
	default:
		e.node = sc.node(m.frag(access, cpu, mem, free) - before)
	}
}

// learner keeps the shapes of the last maxSeen observed pods; the target
// is rebuilt from them at 1, 2, 4, … observations and then every 1024.
type learner struct {
	seen  []Shape
	count int
}

const maxSeen = 16384

func newLearner() *learner { return &learner{} }

// add records a shape and reports whether the target should be rebuilt.
func (l *learner) add(s Shape) bool {
	if len(l.seen) < maxSeen {
		l.seen = append(l.seen, s)
	} else {
		l.seen[l.count%maxSeen] = s
	}
	l.count++
	return l.count&(l.count-1) == 0 && l.count <= 1024 || l.count%1024 == 0
}
