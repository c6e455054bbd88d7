package parts

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestDRAClaimsKnown: after a restart of the agent, the claims the
// previous agent prepared are known (what the host-side reconciler holds
// DRA containers to) only once the part reconciled with the Node's own
// configuration and, in mode dra, its driver read them back from the
// checkpoint. Before that the reconciler must act on no container
// (reconcile.Options.Known).
func TestDRAClaimsKnown(t *testing.T) {
	root := t.TempDir()
	claims := filepath.Join(root, "claims")
	checkpoint := `{"version": 1, "claims": {"c1": {"namespace": "a", "name": "share", "uid": "c1",
		"grants": [{"request": "gpu", "device": "gpu-0", "uuid": "GPU-0", "memoryMiB": 10240, "cores": 10}],
		"requests": [{"request": "gpu", "cdiDevice": "k8s.gpu.tessera.io/claim=c1-gpu"}]}}}`
	if err := os.MkdirAll(claims, 0o755); err != nil {
		t.Fatal(err)
	}
	writeCheckpoint := func(s string) {
		if err := os.WriteFile(filepath.Join(claims, "checkpoint.json"), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newPart := func() *DRA {
		d := NewDRA(DRAOptions{
			Driver: dra.Options{NodeName: "n1", Client: fake.NewClientset(), ClaimRoot: claims, CDIDir: filepath.Join(root, "cdi"),
				PluginDataDir: filepath.Join(root, "plugin"), RegistrarDir: filepath.Join(root, "registry")},
			Devices: NewDevices(nil), Logger: ktesting.NewLogger(t, ktesting.NewConfig()),
		})
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); d.Stop() })
		if err := d.Start(ctx, Cluster{}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	node := func(mode api.NodeMode, configured bool) *Node {
		var cfg config.Node
		cfg.Mode = mode
		return &Node{Config: cfg, Configured: configured, Inventory: &api.NodeInventory{}}
	}
	ctx := context.Background()

	// The defaults (the Node not read yet) say nothing of the node's mode.
	d := newPart()
	if d.ClaimsKnown() {
		t.Fatal("claims known before the part reconciled")
	}
	d.Reconcile(ctx, node(api.ModeDevicePlugin, false))
	if d.ClaimsKnown() {
		t.Fatal("claims known from the defaults' configuration")
	}
	// A node in mode dra whose checkpoint the driver cannot read: its
	// claims are not known.
	writeCheckpoint(`{"version": 99, "claims": {}}`)
	d.Reconcile(ctx, node(api.ModeDRA, true))
	if d.ClaimsKnown() || d.Driver() != nil {
		t.Fatalf("claims known (driver %v) with a checkpoint the driver cannot read", d.Driver())
	}
	// Read back: known, and listed.
	writeCheckpoint(checkpoint)
	d.Reconcile(ctx, node(api.ModeDRA, true))
	if !d.ClaimsKnown() {
		t.Fatal("the driver read its checkpoint, and the claims are not known")
	}
	if l := d.Claims(); len(l) != 1 || l[0].Name != "share" || len(l[0].Requests) != 1 || len(l[0].Requests[0].Devices) != 1 ||
		l[0].Requests[0].Devices[0].MemoryMiB != 10240 {
		t.Errorf("claims %+v, want the checkpoint's claim a/share", l)
	}

	// A node configured in another mode prepares no claims.
	d = newPart()
	d.Reconcile(ctx, node(api.ModeDevicePlugin, true))
	if !d.ClaimsKnown() {
		t.Error("a node configured for the device plugin: claims not known")
	}
}
