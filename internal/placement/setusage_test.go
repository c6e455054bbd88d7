package placement

import "testing"

// SetUsage sets a node's GPU usage where no records charge it (DRA
// claims): a fit check sees it, the node's version changes only when the
// usage does, and a usage for the wrong number of GPUs is refused.
func TestSetUsage(t *testing.T) {
	c := NewCluster()
	c.UpsertNode(mustNode(t, "n", inventory(2, "A100", 40960, 4)))
	n := c.Node("n")
	if c.SetUsage("n", []Usage{{}}) || c.SetUsage("missing", nil) {
		t.Fatal("SetUsage accepted a usage for one GPU of two, or an unknown node")
	}
	half := []Usage{{MemoryMiB: 30720, Cores: 50, Shares: 1}, {}}
	v := n.Version
	if !c.SetUsage("n", half) || n.Version == v || n.GPUs[0].Used != half[0] {
		t.Fatalf("usage %+v, version %d (was %d) after SetUsage", n.GPUs[0].Used, n.Version, v)
	}
	if got, want := n.Utilisation(), (30720.0/40960+0.5)/4; got != want {
		t.Errorf("utilisation %v, want %v", got, want)
	}
	v = n.Version
	if c.SetUsage("n", half); n.Version != v {
		t.Error("version changed by the same usage")
	}
	cr, err := c.Compile(&Request{Pod: "ns/p", Containers: []Container{{Name: "c", GPUs: 2, MemoryMiB: 20480}}})
	if err != nil {
		t.Fatal(err)
	}
	var sc Scratch
	var p Placement
	if r := cr.Fit(n, RankerFor(cr, Binpack{}), &sc, &p); r.OK() {
		t.Fatal("two GPUs with 20 GiB each fit although GPU 0 has 10 GiB left")
	}
	c.SetUsage("n", make([]Usage, 2))
	if r := cr.Fit(n, RankerFor(cr, Binpack{}), &sc, &p); !r.OK() {
		t.Fatalf("does not fit the idle node: %v", r)
	}
}
