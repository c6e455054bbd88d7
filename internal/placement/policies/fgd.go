package policies

import (
	"math"
	"sync"

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
type FGD struct {
	base
	mu    sync.Mutex
	model *fragModel
	gen   int
	learn *learner // nil once a target was set
	// cur is the shape of the pod observed last (normally the one being
	// placed), curID its number: a cache of ShapeOf(curCR).
	cur   Shape
	curID int
	curCR *placement.Compiled
	ids   map[Shape]int
	nodes map[*placement.Node]*fgdNode
	// scores turns a node's fragmentation change into its score,
	// gpuScores ranks a share's GPUs within the node (nil: scores).
	scores    fgdScorer
	gpuScores fgdScorer
	// newModel builds the fragmentation model for a workload's tasks.
	newModel func([]Shape) *fragModel
	// last is the entry looked up last: Fit ranks a node's GPUs and then
	// ScoreNode scores it, all for the same node and shape.
	last     *fgdEntry
	lastNode *placement.Node
	lastVer  uint64
	lastID   int
}

// maxCachedNodes bounds the node cache: nodes replaced by UpsertNode or
// removed leave stale entries, so a long-running scheduler starts afresh.
const maxCachedNodes = 1 << 16

// fgdNode caches a node's scores per pod shape (by shape number) until the
// node changes.
type fgdNode struct {
	version uint64
	gen     int
	byShape []*fgdEntry
}

type fgdEntry struct {
	node float64
	gpu  [api.MaxGPUsPerNode]float64
}

// fgdScorer turns a fragmentation change into a score.
type fgdScorer func(delta float64) float64

// fgdQuantised is the original's integer score.
func fgdQuantised(delta float64) float64 {
	return float64(int64(sigmoid(-delta/1000) * 100))
}

// NewFGD returns an FGD policy that learns its target workload from the
// pods it observes until SetTarget gives it one.
func NewFGD(seed int64) *FGD {
	return &FGD{base: base{seed: seed}, learn: newLearner(), scores: fgdQuantised,
		ids: map[Shape]int{}, nodes: map[*placement.Node]*fgdNode{},
		newModel: func(t []Shape) *fragModel { return newFragModel(PopularShapes(t, 0.95), false) }}
}

func (*FGD) Name() string { return NameFGD }

// SetTarget fixes the target workload: the popular shapes of tasks.
func (f *FGD) SetTarget(tasks []Shape) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.learn = nil
	f.model = f.newModel(tasks)
	f.gen++
	f.last = nil
}

// Observe notes the pod about to be placed (caching its shape) and,
// without a fixed target, learns the workload.
func (f *FGD) Observe(cr *placement.Compiled) {
	f.base.Observe(cr)
	s := ShapeOf(cr)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur, f.curCR = keyShape(s), cr
	f.curID = f.shapeID(f.cur)
	f.last = nil
	if f.learn != nil && f.learn.add(s) {
		f.model = f.newModel(f.learn.seen)
		f.gen++
	}
}

// keyShape drops what FGD ignores (memory) so cache keys collide.
func keyShape(s Shape) Shape { s.MemMiB = 0; return s }

// shapeID numbers shapes for the per-node caches. Called with mu held.
func (f *FGD) shapeID(s Shape) int {
	id, ok := f.ids[s]
	if !ok {
		id = len(f.ids)
		f.ids[s] = id
	}
	return id
}

func (f *FGD) ScoreNode(cr *placement.Compiled, p *placement.Placement) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, id := f.shapeFor(cr)
	if e := f.entry(p.Node, id, s); e != nil {
		return e.node
	}
	return 0
}

func (f *FGD) RankGPU(cr *placement.Compiled, n *placement.Node, i int, pending, demand placement.Usage) float64 {
	if demand.Exclusive > 0 || pending != (placement.Usage{}) {
		return bestGPU(n, i, demand)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, id := f.shapeFor(cr)
	// The per-GPU scores are for a single-share pod; a pod with several
	// sharing containers is ranked best-fit.
	if !s.Share() || int64(demand.Cores)*10 != s.GPUMilli {
		return bestGPU(n, i, demand)
	}
	if e := f.entry(n, id, s); e != nil {
		return e.gpu[i]
	}
	return bestGPU(n, i, demand)
}

// shapeFor returns the cache key and number of cr's shape, without
// recomputing it for the pod last observed. Called with mu held.
func (f *FGD) shapeFor(cr *placement.Compiled) (Shape, int) {
	if cr == f.curCR {
		return f.cur, f.curID
	}
	s := keyShape(ShapeOf(cr))
	return s, f.shapeID(s)
}

// entry returns the cached scores of placing shape s (number id) on n.
// Called with mu held.
func (f *FGD) entry(n *placement.Node, id int, s Shape) *fgdEntry {
	if f.model == nil {
		return nil
	}
	if f.last != nil && f.lastNode == n && f.lastVer == n.Version && f.lastID == id {
		return f.last
	}
	c := f.nodes[n]
	if c == nil {
		if len(f.nodes) >= maxCachedNodes {
			clear(f.nodes)
		}
		c = &fgdNode{}
		f.nodes[n] = c
	}
	if c.version != n.Version || c.gen != f.gen {
		c.version, c.gen = n.Version, f.gen
		clear(c.byShape)
	}
	if id >= len(c.byShape) {
		c.byShape = append(c.byShape, make([]*fgdEntry, id+1-len(c.byShape))...)
	}
	e := c.byShape[id]
	if e == nil {
		e = &fgdEntry{}
		gs := f.gpuScores
		if gs == nil {
			gs = f.scores
		}
		fragScores(f.model, n, s, f.scores, gs, e)
		c.byShape[id] = e
	}
	f.last, f.lastNode, f.lastVer, f.lastID = e, n, n.Version, id
	return e
}

// fragScores fills e with the scores of placing s on n: per GPU for a
// share (gpuScore; −Inf where it does not fit) and for the node (score; for
// a share, that of its best GPU).
func fragScores(m *fragModel, n *placement.Node, s Shape, score, gpuScore fgdScorer, e *fgdEntry) {
	var buf [api.MaxGPUsPerNode]int64
	free := nodeFree(n, &buf)
	access := m.accessFor(nodeModel(n))
	before := m.frag(access, n.FreeCPU(), n.FreeMem(), free)
	cpu, mem := n.FreeCPU()-s.CPUMilli, n.FreeMem()-s.MemMiB
	switch {
	case s.Share():
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
			e.gpu[i] = gpuScore(d)
			if e.gpu[i] > best {
				best, e.node = e.gpu[i], score(d)
			}
		}
	case s.NumGPU > 0:
		need := s.NumGPU
		for i := range free {
			if need > 0 && free[i] == milli {
				free[i] = 0
				need--
			}
		}
		e.node = score(m.frag(access, cpu, mem, free) - before)
	default:
		e.node = score(m.frag(access, cpu, mem, free) - before)
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
