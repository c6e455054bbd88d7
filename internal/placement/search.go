package placement

// Search finds the best node for one pod at a time over a whole cluster:
// the loop the simulator, the tools and the benchmarks run. (The scheduler
// plugin runs the same Fit and ScoreNode per node from kube-scheduler's
// Filter and Score instead.) A Search reuses its buffers, so a steady
// stream of pods allocates nothing per node; it serves one goroutine.
type Search struct {
	c         *Cluster
	s         Scratch
	cur, best Placement
	reasons   []Reason
	feasible  int
}

// NewSearch returns a Search over c.
func NewSearch(c *Cluster) *Search { return &Search{c: c} }

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
// fits; Explain then says why. Ties go to the node added first. The placement is valid until the
// next call.
func (sr *Search) Best(cr *Compiled, def Policy) *Placement {
	pol := Prepare(cr, PolicyFor(cr, def))
	ranker := RankerFor(cr, pol)
	sr.reasons = sr.reasons[:0]
	sr.feasible = 0
	var bestScore float64
	found := false
	for _, n := range sr.c.nodes {
		if reason := cr.Fit(n, ranker, &sr.s, &sr.cur); !reason.OK() {
			sr.reasons = append(sr.reasons, reason)
			continue
		}
		sr.feasible++
		score := pol.ScoreNode(cr, &sr.cur)
		if !found || score > bestScore {
			found, bestScore = true, score
			sr.best.CopyFrom(&sr.cur)
		}
	}
	if !found {
		return nil
	}
	return &sr.best
}

// Feasible is the number of nodes that fit the last request.
func (sr *Search) Feasible() int { return sr.feasible }

// Explain summarises why the last request fit no node.
func (sr *Search) Explain() string { return Summarize(len(sr.c.nodes), sr.reasons) }
