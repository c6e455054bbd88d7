package labdir

import (
	"os"
	"testing"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
)

// TestContainerRecords: a record written is read back by node and by pod
// name; removing a container that a later one of the same name replaced
// keeps the later one's record.
func TestContainerRecords(t *testing.T) {
	d := Dir(t.TempDir())
	n := d.Node("n1")
	if err := os.MkdirAll(n.Containers(), 0o755); err != nil {
		t.Fatal(err)
	}
	first := hollowkubelet.Container{ID: "c1", Namespace: "default", Pod: "p", Name: "main", PID: 7}
	if err := n.WriteContainer(first); err != nil {
		t.Fatal(err)
	}
	second := first
	second.ID, second.PID = "c2", 8
	if err := n.WriteContainer(second); err != nil {
		t.Fatal(err)
	}
	if c, err := n.Container("default", "p", "main"); err != nil || c.ID != "c2" || c.PID != 8 {
		t.Fatalf("Container: %+v, %v; want the later container", c, err)
	}
	n.RemoveContainer(first)
	if c, err := d.ContainerOf("p", "main"); err != nil || c.ID != "c2" {
		t.Fatalf("after removing the replaced container: %+v, %v; want c2 kept", c, err)
	}
	n.RemoveContainer(second)
	if c, err := n.Container("default", "p", "main"); err == nil {
		t.Errorf("removed container still recorded: %+v", c)
	}
	if _, err := d.ContainerOf("p", "main"); err == nil {
		t.Error("ContainerOf found a removed container")
	}
}
