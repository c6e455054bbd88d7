package nodeagent

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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

// TestWithdrawnResourceKeepsServingTheShim: behind the kubelet shim, a
// resource no longer offered (a MIG layout changed by its node label) is
// served with an empty list, so a shim whose stream was down when the
// resource went still learns it has no devices (a stopped plugin left the
// shim reporting the old devices to the kubelet until its StaleAfter: a
// CI failure, lab-mig still allocatable mig-1g.5gb = 7 two minutes after
// the relabel). Offered again, the resource gets its devices back.
func TestWithdrawnResourceKeepsServingTheShim(t *testing.T) {
	dir := t.TempDir()
	a, err := New(nvmltest.DGXA100(), fake.NewClientset(), Options{
		NodeName: "n1", Resource: "nvidia.com/gpu",
		Health:          health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: time.Second, WaitTimeout: 5 * time.Millisecond},
		Paths:           deviceplugin.Paths{StateRoot: t.TempDir()},
		PluginSocketDir: dir,
	}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.runCtx = ctx
	defer func() { cancel(); a.stopPlugins(); a.wg.Wait() }()

	const gpu, mig = "nvidia.com/gpu", "nvidia.com/mig-1g.5gb"
	gpus := []deviceplugin.GPU{{UUID: "GPU-a", Healthy: true, Slots: 2}, {UUID: "GPU-b", Healthy: true, Slots: 2}}
	a.syncPlugins(config.Node{}, Offer{gpu: gpus, mig: gpus})
	if n := firstList(t, dir, mig); n != 4 {
		t.Fatalf("offered: %s lists %d devices, want 4", mig, n)
	}

	a.syncPlugins(config.Node{}, Offer{gpu: gpus})
	if n := firstList(t, dir, mig); n != 0 {
		t.Errorf("withdrawn: %s lists %d devices to a reconnecting shim, want 0", mig, n)
	}
	if got := a.Resources(); slices.Contains(got, mig) || !slices.Contains(got, gpu) {
		t.Errorf("withdrawn: the agent serves %v, want %s and not %s", got, gpu, mig)
	}
	if a.PluginFor(mig) != nil {
		t.Errorf("withdrawn: PluginFor(%s) is not nil", mig)
	}

	a.syncPlugins(config.Node{}, Offer{gpu: gpus, mig: gpus[:1]})
	if n := firstList(t, dir, mig); n != 2 {
		t.Errorf("offered again: %s lists %d devices, want 2", mig, n)
	}
	if a.PluginFor(mig) == nil {
		t.Errorf("offered again: no plugin for %s", mig)
	}
}
