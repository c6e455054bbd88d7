package parts

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
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/pkg/api"
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

// shimPlugins is the device plugins part serving a kubelet shim in dir,
// started without the rest of the agent (the test calls Reconcile); stop
// stops its plugins as the agent's end does.
func shimPlugins(t *testing.T, dir string) (*Plugins, func()) {
	t.Helper()
	root := t.TempDir()
	p := NewPlugins(PluginsOptions{
		NodeName: "n1", Names: api.DefaultResourceNames,
		Paths:     deviceplugin.Paths{StateRoot: filepath.Join(root, "state"), PreloadHost: filepath.Join(root, "ld.so.preload")},
		SocketDir: dir,
		Client:    fake.NewClientset(),
		Logger:    ktesting.NewLogger(t, ktesting.NewConfig()),
	})
	ctx, cancel := context.WithCancel(context.Background())
	if err := p.Start(ctx, Cluster{}); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return p, func() { once.Do(func() { cancel(); p.Stop() }) }
}

// offer is a reconcile offering o, made from the Node's configuration or
// (configured false) from the defaults.
func offer(o Offer, configured bool) *Node { return &Node{Offer: o, Configured: configured} }

// TestWithdrawnResourceKeepsServingTheShim: behind the kubelet shim, a
// resource no longer offered (a MIG layout changed by its node label) is
// served with an empty list, so a shim whose stream was down when the
// resource went still learns it has no devices (a stopped plugin left the
// shim reporting the old devices to the kubelet until its StaleAfter: a
// CI failure, lab-mig still allocatable mig-1g.5gb = 7 two minutes after
// the relabel). Offered again, the resource gets its devices back.
func TestWithdrawnResourceKeepsServingTheShim(t *testing.T) {
	dir := t.TempDir()
	p, stop := shimPlugins(t, dir)
	defer stop()
	p.Reconcile(context.Background(), offer(Offer{shimGPU: shimGPUs, shimMIG: shimGPUs}, true))
	if n := firstList(t, dir, shimMIG); n != 4 {
		t.Fatalf("offered: %s lists %d devices, want 4", shimMIG, n)
	}

	p.Reconcile(context.Background(), offer(Offer{shimGPU: shimGPUs}, true))
	if n := firstList(t, dir, shimMIG); n != 0 {
		t.Errorf("withdrawn: %s lists %d devices to a reconnecting shim, want 0", shimMIG, n)
	}
	if got := p.Resources(); slices.Contains(got, shimMIG) || !slices.Contains(got, shimGPU) {
		t.Errorf("withdrawn: the agent serves %v, want %s and not %s", got, shimGPU, shimMIG)
	}
	if p.Plugin(shimMIG) != nil {
		t.Errorf("withdrawn: Plugin(%s) is not nil", shimMIG)
	}

	p.Reconcile(context.Background(), offer(Offer{shimGPU: shimGPUs, shimMIG: shimGPUs[:1]}, true))
	if n := firstList(t, dir, shimMIG); n != 2 {
		t.Errorf("offered again: %s lists %d devices, want 2", shimMIG, n)
	}
	if p.Plugin(shimMIG) == nil {
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
	p, stop := shimPlugins(t, dir)
	p.Reconcile(context.Background(), offer(Offer{shimGPU: shimGPUs, shimMIG: shimGPUs}, true))
	if n := firstList(t, dir, shimMIG); n != 4 {
		t.Fatalf("offered: %s lists %d devices, want 4", shimMIG, n)
	}
	stop()
	f, err := os.OpenFile(filepath.Join(dir, OfferedFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("../../etc/x\nnvidia.com/a/b\nnot a resource\nexample.com/gpu\nnvidia.com/\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()

	b, stop := shimPlugins(t, dir)
	defer stop()
	// An offer from the defaults (the Node not read) withdraws nothing of
	// the record.
	before, err := os.ReadFile(filepath.Join(dir, OfferedFile))
	if err != nil {
		t.Fatal(err)
	}
	b.Reconcile(context.Background(), offer(Offer{shimGPU: shimGPUs}, false))
	b.mu.Lock()
	made := b.withdrawn[shimMIG] != nil || b.plugins[shimMIG] != nil
	b.mu.Unlock()
	if after, err := os.ReadFile(filepath.Join(dir, OfferedFile)); made || err != nil || string(after) != string(before) {
		t.Errorf("an offer made without the Node's configuration: plugin for %s made %v; record %q (%v), was %q", shimMIG, made, after, err, before)
	}
	b.Reconcile(context.Background(), offer(Offer{shimGPU: shimGPUs}, true))
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
	want := []string{kubeletshim.AgentSocketName(shimGPU), kubeletshim.AgentSocketName(shimMIG), OfferedFile}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("socket directory holds %v, want %v (nothing made from the malformed lines)", names, want)
	}
	rec, err := os.ReadFile(filepath.Join(dir, OfferedFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(rec) != shimGPU+"\n"+shimMIG+"\n" {
		t.Errorf("record of served resources %q, want both resources only", rec)
	}
}
