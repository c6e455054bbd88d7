package lp

// Network is a flow network for minimum cuts (Dinic's algorithm) with
// integer capacities. Build it with AddArc, then set the capacities of
// the arcs that change between solves with SetCap and call MaxFlow again:
// the network keeps its arcs and resets its flows.
type Network struct {
	n     int
	head  []int32 // first arc out of each node (-1: none)
	next  []int32 // next arc out of the same node
	to    []int32
	cap   []int64 // capacity as set
	res   []int64 // residual capacity in the current solve
	level []int32
	iter  []int32
	queue []int32
}

// Infinite is a capacity no cut can pay.
const Infinite int64 = 1 << 60

// NewNetwork returns a network of n nodes and no arcs.
func NewNetwork(n int) *Network {
	g := &Network{n: n, head: make([]int32, n), level: make([]int32, n), iter: make([]int32, n)}
	for i := range g.head {
		g.head[i] = -1
	}
	return g
}

// AddArc adds an arc and returns its index (for SetCap). Each arc comes
// with its reverse of capacity 0.
func (g *Network) AddArc(from, to int, capacity int64) int {
	a := len(g.to)
	g.to = append(g.to, int32(to), int32(from))
	g.cap = append(g.cap, capacity, 0)
	g.next = append(g.next, g.head[from], g.head[to])
	g.head[from], g.head[to] = int32(a), int32(a+1)
	return a
}

// SetCap sets the capacity of arc a for the next MaxFlow.
func (g *Network) SetCap(a int, capacity int64) { g.cap[a] = capacity }

// MaxFlow returns the value of a maximum flow from s to t.
func (g *Network) MaxFlow(s, t int) int64 {
	g.res = append(g.res[:0], g.cap...)
	var flow int64
	for g.bfs(s, t) {
		copy(g.iter, g.head)
		for {
			f := g.dfs(int32(s), int32(t), Infinite)
			if f == 0 {
				break
			}
			flow += f
		}
	}
	return flow
}

// SourceSide reports, after MaxFlow, the nodes on the source's side of a
// minimum cut: those reachable from s in the residual network.
func (g *Network) SourceSide(s int) []bool {
	seen := make([]bool, g.n)
	seen[s] = true
	stack := []int32{int32(s)}
	for len(stack) > 0 {
		u := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for a := g.head[u]; a >= 0; a = g.next[a] {
			if v := g.to[a]; g.res[a] > 0 && !seen[v] {
				seen[v] = true
				stack = append(stack, v)
			}
		}
	}
	return seen
}

func (g *Network) bfs(s, t int) bool {
	for i := range g.level {
		g.level[i] = -1
	}
	g.level[s] = 0
	g.queue = append(g.queue[:0], int32(s))
	for k := 0; k < len(g.queue); k++ {
		u := g.queue[k]
		for a := g.head[u]; a >= 0; a = g.next[a] {
			if v := g.to[a]; g.res[a] > 0 && g.level[v] < 0 {
				g.level[v] = g.level[u] + 1
				g.queue = append(g.queue, v)
			}
		}
	}
	return g.level[t] >= 0
}

// dfs pushes up to f units along a shortest augmenting path, iteratively
// (paths may be thousands of arcs long).
func (g *Network) dfs(s, t int32, f int64) int64 {
	type frame struct {
		u int32
		a int32 // arc taken out of u
	}
	path := []frame{{u: s, a: -1}}
	for len(path) > 0 {
		top := &path[len(path)-1]
		u := top.u
		if u == t {
			push := f
			for _, fr := range path[:len(path)-1] {
				push = min(push, g.res[fr.a])
			}
			for _, fr := range path[:len(path)-1] {
				g.res[fr.a] -= push
				g.res[fr.a^1] += push
			}
			return push
		}
		advanced := false
		for ; g.iter[u] >= 0; g.iter[u] = g.next[g.iter[u]] {
			a := g.iter[u]
			if v := g.to[a]; g.res[a] > 0 && g.level[v] == g.level[u]+1 {
				top.a = a
				path = append(path, frame{u: v, a: -1})
				advanced = true
				break
			}
		}
		if !advanced {
			g.level[u] = -1 // dead end for this phase
			path = path[:len(path)-1]
			if len(path) > 0 {
				p := path[len(path)-1].u
				g.iter[p] = g.next[g.iter[p]]
			}
		}
	}
	return 0
}
