package component

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestVisible: NVIDIA_VISIBLE_DEVICES as the NVIDIA container runtime
// reads it, a MIG device being a GPU of its own (its own state file, of
// its memory) whose index is its parent's.
func TestVisible(t *testing.T) {
	n, err := newGPUs(labdir.NodeDir(t.TempDir()), "n1", "A100-40GB", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	const migUUID = "MIG-25e5d32a-b45b-5265-9a3b-51f753203407"
	parent := n.gpus[1].UUID
	n.mig = func(uuid string) (string, fakegpu.GPU, error) {
		if uuid != migUUID {
			return "", fakegpu.GPU{}, errors.New("not in the inventory")
		}
		return parent, fakegpu.GPU{UUID: migUUID, Name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", MemoryBytes: 4864 << 20, SMs: 14}, nil
	}
	uuids := func(v []visibleGPU) (out []string) {
		for _, g := range v {
			out = append(out, g.UUID)
		}
		return out
	}
	for in, want := range map[string][]string{
		"":                 nil,
		"void":             nil,
		"all":              {n.gpus[0].UUID, n.gpus[1].UUID},
		"1,0":              {parent, n.gpus[0].UUID},
		" " + parent + " ": {parent},
		migUUID:            {migUUID},
	} {
		got, err := n.visible(in)
		if err != nil || strings.Join(uuids(got), ",") != strings.Join(want, ",") {
			t.Errorf("visible(%q) = %v, %v; want %v", in, uuids(got), err, want)
		}
	}
	got, err := n.visible(migUUID)
	if err != nil || got[0].index != 1 {
		t.Fatalf("the MIG device's index: %+v, %v; want its parent's, 1", got, err)
	}
	g, procs, err := fakegpu.Read(n.files.File(migUUID))
	if err != nil || g.MemoryBytes != 4864<<20 || g.Name != "NVIDIA A100-SXM4-40GB MIG 1g.5gb" || len(procs) != 0 {
		t.Errorf("the MIG device's state file: %+v %v, %v", g, procs, err)
	}
	for in, msg := range map[string]string{
		"2":                   `no GPU "2"`,
		"0,0":                 "twice",
		"0," + n.gpus[0].UUID: "twice",
		"MIG-00000000-0000-0000-0000-000000000000": "not in the inventory",
		"GPU-nope": `no GPU "GPU-nope"`,
	} {
		if _, err := n.visible(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("visible(%q) = %v, want an error containing %q", in, err, msg)
		}
	}
}

// TestMIGFromAgentList: on a node that publishes no inventory (a volcano
// node), a MIG device is found in its agent's list, as a GPU of its
// profile's memory and SMs; one in neither is waited for, then refused.
func TestMIGFromAgentList(t *testing.T) {
	dir := labdir.NodeDir(t.TempDir())
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	const migUUID = "MIG-25e5d32a-b45b-5265-9a3b-51f753203407"
	list := map[string]LabMIGDevice{migUUID: {Parent: "GPU-p", Model: "Mock NVIDIA A100-SXM4-40GB",
		MIGDevice: api.MIGDevice{UUID: migUUID, Profile: "2g.10gb", MemoryMiB: 9856, SMCount: 28}}}
	b, _ := json.Marshal(list)
	if err := os.WriteFile(dir.MIGDevices(), b, 0o644); err != nil {
		t.Fatal(err)
	}
	find := migFromInventory(client, "n1", dir, 200*time.Millisecond)
	parent, g, err := find(migUUID)
	if err != nil || parent != "GPU-p" || g.Name != "NVIDIA A100-SXM4-40GB MIG 2g.10gb" || g.MemoryBytes != 9856<<20 || g.SMs != 28 {
		t.Errorf("%s: %q %+v %v", migUUID, parent, g, err)
	}
	if _, _, err := find("MIG-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("a MIG device in no list was found")
	}
}
