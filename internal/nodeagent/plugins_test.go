package nodeagent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/nodeagent/parts"
)

// TestRecordReadOnceConfigured: a restarted agent whose node configuration
// cannot be applied (its ConfigMap missing) offers from its defaults and
// tells its parts so (an offer from the defaults withdraws nothing of the
// previous agent's record of served resources: parts' tests); once the
// ConfigMap is there, what the record lists and the configuration does
// not offer is withdrawn (served with an empty list).
func TestRecordReadOnceConfigured(t *testing.T) {
	const gpuRes, migRes = "nvidia.com/gpu", "nvidia.com/mig-1g.5gb"
	dir, root := t.TempDir(), t.TempDir()
	record := gpuRes + "\n" + migRes + "\n"
	if err := os.WriteFile(filepath.Join(dir, parts.OfferedFile), []byte(record), 0o644); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	a, err := New(nvmltest.DGXA100(), client, Options{
		NodeName: "n1", Resource: gpuRes,
		ConfigMapNamespace: "tessera-system", ConfigMapName: "node-agent",
		Health:          health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: time.Second, WaitTimeout: 5 * time.Millisecond},
		Paths:           deviceplugin.Paths{StateRoot: filepath.Join(root, "state"), PreloadHost: filepath.Join(root, "ld.so.preload")},
		Resync:          20 * time.Millisecond,
		PluginSocketDir: dir,
	}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	pr := addProbe(a)
	ctx, stop := runAgent(t, a)
	defer stop()
	eventually(t, "the agent serving its GPU resource from its defaults", func() bool {
		return a.PluginFor(gpuRes) != nil && a.ConfigError() != ""
	})
	pr.reconciles(t, 3)
	for k, n := range pr.seen() {
		if n.Configured {
			t.Fatalf("reconcile %d without the ConfigMap told the parts the Node's configuration applied", k)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, parts.OfferedFile)); err != nil || string(b) != record {
		t.Errorf("without its configuration the agent rewrote the record: %q (%v)", b, err)
	}

	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera-system", Name: "node-agent"}, Data: map[string]string{"default": "sharesPerGPU: 4"}}
	if _, err := client.CoreV1().ConfigMaps("tessera-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	migSock := filepath.Join(dir, kubeletshim.AgentSocketName(migRes))
	eventually(t, "the configuration applied and "+migRes+" withdrawn", func() bool {
		_, err := os.Stat(migSock)
		return a.ConfigError() == "" && err == nil
	})
	if got := a.Resources(); slices.Contains(got, migRes) || !slices.Contains(got, gpuRes) {
		t.Errorf("configured: the agent offers %v, want %s and not %s", got, gpuRes, migRes)
	}
	if s := pr.seen(); !s[len(s)-1].Configured {
		t.Error("the ConfigMap applied, and the parts were told the configuration is the defaults")
	}
}
