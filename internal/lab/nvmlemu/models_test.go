package nvmlemu

import (
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
)

func TestNewModel(t *testing.T) {
	for _, name := range ModelNames() {
		n, err := NewModel(name, 4, "node-a")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res, err := discovery.Discover(n, discovery.Options{})
		if err != nil {
			t.Fatalf("%s: discovery: %v", name, err)
		}
		if len(res.Devices) != 4 || len(res.Skipped) != 0 {
			t.Fatalf("%s: discovered %d GPUs, skipped %v; want 4", name, len(res.Devices), res.Skipped)
		}
		again, _ := NewModel(strings.ToLower(name), 4, "node-a")
		other, _ := NewModel(name, 4, "node-b")
		for i := range 4 {
			if again.Device(i).UUID != n.Device(i).UUID {
				t.Errorf("%s GPU %d: UUID %s then %s for the same node", name, i, n.Device(i).UUID, again.Device(i).UUID)
			}
			if other.Device(i).UUID == n.Device(i).UUID {
				t.Errorf("%s GPU %d: two nodes share UUID %s", name, i, n.Device(i).UUID)
			}
		}
	}
	if _, err := NewModel("V100", 8, "x"); err == nil || !strings.Contains(err.Error(), `unknown GPU model "V100"`) {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := NewModel("H100-80GB", 0, "x"); err == nil || !strings.Contains(err.Error(), "0 GPUs per node") {
		t.Errorf("zero GPUs: %v", err)
	}
}
