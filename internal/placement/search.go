package placement

// Search finds the best node for one pod at a time over a whole cluster:
// the loop the simulator, the tools and the benchmarks run. (The scheduler
// plugin runs the same fit check and score over every node in PreFilter,
// through the same Memo.) A Search reuses its buffers, so a steady stream
// of pods allocates nothing per node, and remembers each node's verdict
// and score per request shape (Memo), so only the nodes that changed since
// the last pod of the shape are fit and scored again. It serves one
// goroutine.
type Search struct {
	c        *Cluster
	memo     *Memo
	s        Scratch
	cur      Placement
	best     Placement
	reasons  []Reason
	feasible int
}

// NewSearch returns a Search over c.
func NewSearch(c *Cluster) *Search { return &Search{c: c, memo: NewMemo()} }

// RankerFor returns the GPU ranker for a request under policy pol: none if
// the pod names its own GPU policy, else pol's own if it has one.
func RankerFor(cr *Compiled, pol Policy) GPURanker {
	if cr.Req.GPUPolicy != "" {
		return nil
	}
	r, _ := pol.(GPURanker)
	return r
}

// Best returns the highest-scoring placement of the request under def (or
// the pod's own node policy, Prepared for the pod), or nil if no node
// fits; Explain then says why. Ties go to the node added first. The
// placement is valid until the next call.
func (sr *Search) Best(cr *Compiled, def Policy) *Placement {
	pol := Prepare(cr, PolicyFor(cr, def))
	ranker := RankerFor(cr, pol)
	sr.reasons = sr.reasons[:0]
	sr.feasible = 0
	scan := sr.memo.Begin(cr, pol, ranker, len(sr.c.nodes))
	defer scan.End()
	var best *Node
	var bestScore float64
	for _, n := range sr.c.nodes {
		reason, score := scan.Eval(n, &sr.s, &sr.cur)
		if !reason.OK() {
			sr.reasons = append(sr.reasons, reason)
			continue
		}
		sr.feasible++
		if best == nil || score > bestScore {
			best, bestScore = n, score
		}
	}
	if best == nil {
		return nil
	}
	// The winner's placement: the scan may have remembered its score
	// without placing the pod there. Fit depends only on the node's
	// state, so it fits as it did.
	if r := cr.Fit(best, ranker, &sr.s, &sr.best); !r.OK() {
		return nil
	}
	return &sr.best
}

// Feasible is the number of nodes that fit the last request.
func (sr *Search) Feasible() int { return sr.feasible }

// Explain summarises why the last request fit no node.
func (sr *Search) Explain() string { return Summarize(len(sr.c.nodes), sr.reasons) }
