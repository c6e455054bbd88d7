package nodeagent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
)

// firstList is how many devices the first list of a new ListAndWatch
// stream on the agent's socket for res names, as a kubelet shim
// (re)connecting gets it.
func firstList(t *testing.T, dir, res string) int {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, kubeletshim.AgentSocketName(res)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("%s: ListAndWatch: %v", res, err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("%s: no device list from the agent: %v", res, err)
	}
	return len(resp.Devices)
}

const shimGPU, shimMIG = "nvidia.com/gpu", "nvidia.com/mig-1g.5gb"

var shimGPUs = []deviceplugin.GPU{{UUID: "GPU-a", Healthy: true, Slots: 2}, {UUID: "GPU-b", Healthy: true, Slots: 2}}

// shimAgent is an agent serving its plugins for a kubelet shim in dir,
// without running its loops (the test calls syncPlugins); stop stops its
// plugins as Run's end does.
func shimAgent(t *testing.T, dir string) (*Agent, func()) {
	t.Helper()
	a, err := New(nvmltest.DGXA100(), fake.NewClientset(), Options{
		NodeName: "n1", Resource: shimGPU,
		Health:          health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: time.Second, WaitTimeout: 5 * time.Millisecond},
		Paths:           deviceplugin.Paths{StateRoot: t.TempDir()},
		PluginSocketDir: dir,
	}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.runCtx = ctx
	var once sync.Once
	return a, func() { once.Do(func() { cancel(); a.stopPlugins(); a.wg.Wait() }) }
}

// TestWithdrawnResourceKeepsServingTheShim: behind the kubelet shim, a
// resource no longer offered (a MIG layout changed by its node label) is
// served with an empty list, so a shim whose stream was down when the
// resource went still learns it has no devices (a stopped plugin left the
// shim reporting the old devices to the kubelet until its StaleAfter: a
// CI failure, lab-mig still allocatable mig-1g.5gb = 7 two minutes after
// the relabel). Offered again, the resource gets its devices back.
func TestWithdrawnResourceKeepsServingTheShim(t *testing.T) {
	dir := t.TempDir()
	a, stop := shimAgent(t, dir)
	defer stop()
	a.syncPlugins(config.Node{}, Offer{shimGPU: shimGPUs, shimMIG: shimGPUs}, true)
	if n := firstList(t, dir, shimMIG); n != 4 {
		t.Fatalf("offered: %s lists %d devices, want 4", shimMIG, n)
	}

	a.syncPlugins(config.Node{}, Offer{shimGPU: shimGPUs}, true)
	if n := firstList(t, dir, shimMIG); n != 0 {
		t.Errorf("withdrawn: %s lists %d devices to a reconnecting shim, want 0", shimMIG, n)
	}
	if got := a.Resources(); slices.Contains(got, shimMIG) || !slices.Contains(got, shimGPU) {
		t.Errorf("withdrawn: the agent serves %v, want %s and not %s", got, shimGPU, shimMIG)
	}
	if a.PluginFor(shimMIG) != nil {
		t.Errorf("withdrawn: PluginFor(%s) is not nil", shimMIG)
	}

	a.syncPlugins(config.Node{}, Offer{shimGPU: shimGPUs, shimMIG: shimGPUs[:1]}, true)
	if n := firstList(t, dir, shimMIG); n != 2 {
		t.Errorf("offered again: %s lists %d devices, want 2", shimMIG, n)
	}
	if a.PluginFor(shimMIG) == nil {
		t.Errorf("offered again: no plugin for %s", shimMIG)
	}
}

// TestRestartedAgentWithdrawsWhatItNoLongerOffers: an agent restarted
// with fewer resources (the MIG label changed while it was down) serves
// the ones the previous agent offered and it does not with an empty list,
// so the kubelet shim, which keeps the last list it got, does not offer
// them until its StaleAfter. Malformed lines in the record are skipped;
// an offer made before the Node's configuration was read withdraws
// nothing.
func TestRestartedAgentWithdrawsWhatItNoLongerOffers(t *testing.T) {
	dir := t.TempDir()
	a, stop := shimAgent(t, dir)
	a.syncPlugins(config.Node{}, Offer{shimGPU: shimGPUs, shimMIG: shimGPUs}, true)
	if n := firstList(t, dir, shimMIG); n != 4 {
		t.Fatalf("offered: %s lists %d devices, want 4", shimMIG, n)
	}
	stop()
	f, err := os.OpenFile(filepath.Join(dir, offeredFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("../../etc/x\nnvidia.com/a/b\nnot a resource\nexample.com/gpu\nnvidia.com/\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()

	b, stop := shimAgent(t, dir)
	defer stop()
	// An offer from the defaults (the Node not read) withdraws nothing of
	// the record.
	before, err := os.ReadFile(filepath.Join(dir, offeredFile))
	if err != nil {
		t.Fatal(err)
	}
	b.syncPlugins(config.Node{}, Offer{shimGPU: shimGPUs}, false)
	b.mu.Lock()
	made := b.withdrawn[shimMIG] != nil || b.plugins[shimMIG] != nil
	b.mu.Unlock()
	if after, err := os.ReadFile(filepath.Join(dir, offeredFile)); made || err != nil || string(after) != string(before) {
		t.Errorf("an offer made without the Node's configuration: plugin for %s made %v; record %q (%v), was %q", shimMIG, made, after, err, before)
	}
	b.syncPlugins(config.Node{}, Offer{shimGPU: shimGPUs}, true)
	if n := firstList(t, dir, shimMIG); n != 0 {
		t.Errorf("after the restart: %s lists %d devices to the shim, want 0", shimMIG, n)
	}
	if n := firstList(t, dir, shimGPU); n != 4 {
		t.Errorf("after the restart: %s lists %d devices, want 4", shimGPU, n)
	}
	if got := b.Resources(); !slices.Equal(got, []string{shimGPU}) {
		t.Errorf("after the restart the agent serves %v, want [%s]", got, shimGPU)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{kubeletshim.AgentSocketName(shimGPU), kubeletshim.AgentSocketName(shimMIG), offeredFile}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("socket directory holds %v, want %v (nothing made from the malformed lines)", names, want)
	}
	rec, err := os.ReadFile(filepath.Join(dir, offeredFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(rec) != shimGPU+"\n"+shimMIG+"\n" {
		t.Errorf("record of served resources %q, want both resources only", rec)
	}
}

// TestRecordReadOnceConfigured: a restarted agent whose node configuration
// cannot be applied (its ConfigMap missing) offers from its defaults and
// withdraws nothing of the previous agent's record; once the ConfigMap is
// there, what the record lists and the configuration does not offer is
// withdrawn (served with an empty list).
func TestRecordReadOnceConfigured(t *testing.T) {
	dir, root := t.TempDir(), t.TempDir()
	record := shimGPU + "\n" + shimMIG + "\n"
	if err := os.WriteFile(filepath.Join(dir, offeredFile), []byte(record), 0o644); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	a, err := New(nvmltest.DGXA100(), client, Options{
		NodeName: "n1", Resource: shimGPU,
		ConfigMapNamespace: "tessera-system", ConfigMapName: "node-agent",
		Health:          health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: time.Second, WaitTimeout: 5 * time.Millisecond},
		Paths:           deviceplugin.Paths{StateRoot: filepath.Join(root, "state"), PreloadHost: filepath.Join(root, "ld.so.preload")},
		Resync:          20 * time.Millisecond,
		PluginSocketDir: dir,
	}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := runAgent(t, a)
	defer stop()
	migSock := filepath.Join(dir, kubeletshim.AgentSocketName(shimMIG))
	eventually(t, "the agent serving its GPU resource from its defaults", func() bool {
		_, err := os.Stat(filepath.Join(dir, kubeletshim.AgentSocketName(shimGPU)))
		return err == nil && a.ConfigError() != ""
	})
	time.Sleep(200 * time.Millisecond) // several resyncs
	if _, err := os.Stat(migSock); !os.IsNotExist(err) {
		t.Errorf("without its configuration the agent withdrew %s (socket: %v)", shimMIG, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, offeredFile)); err != nil || string(b) != record {
		t.Errorf("without its configuration the agent rewrote the record: %q (%v)", b, err)
	}

	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera-system", Name: "node-agent"}, Data: map[string]string{"default": "sharesPerGPU: 4"}}
	if _, err := client.CoreV1().ConfigMaps("tessera-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the configuration applied and "+shimMIG+" withdrawn", func() bool {
		_, err := os.Stat(migSock)
		return a.ConfigError() == "" && err == nil
	})
	if n := firstList(t, dir, shimMIG); n != 0 {
		t.Errorf("configured: %s lists %d devices, want 0", shimMIG, n)
	}
}
