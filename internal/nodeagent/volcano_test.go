package nodeagent

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestVolcanoMode: a node relabelled to a volcano profile withdraws its
// Tessera inventory (Tessera's scheduler no longer sees its GPUs),
// registers them with Volcano and advertises their memory and cores as
// node capacity; relabelled back, it is Tessera's again and Volcano's
// registration and capacities are gone.
func TestVolcanoMode(t *testing.T) {
	n := nvmltest.DGXA100()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	cm := &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tessera-system", Name: "node-agent"},
		Data:       map[string]string{"default": "sharesPerGPU: 4", "volcano": "mode: volcano\nsharesPerGPU: 10"},
	}
	client := fake.NewClientset(node, cm)
	root := t.TempDir()
	paths := deviceplugin.DefaultPaths()
	paths.StateRoot, paths.PreloadHost = filepath.Join(root, "state"), filepath.Join(root, "preload")
	a, err := New(n, client, Options{
		NodeName: "n1", Resource: "nvidia.com/gpu",
		ConfigMapNamespace: "tessera-system", ConfigMapName: "node-agent",
		Health: health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, WaitTimeout: 5 * time.Millisecond},
		Paths:  paths, PluginDir: filepath.Join(root, "dp"), PodResourcesSocket: filepath.Join(root, "pr.sock"),
		Resync: 20 * time.Millisecond,
	}, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := runAgent(t, a)
	defer stop()
	get := func() *v1.Node {
		nd, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return nd
	}
	eventually(t, "the Tessera inventory", func() bool { return get().Annotations[api.AnnotationInventory] != "" })

	var memory int64
	for _, d := range a.Devices() {
		memory += d.GPU.MemoryMiB
	}
	nd := get()
	nd.Labels = map[string]string{api.LabelNodeConfig: "volcano"}
	if _, err := client.CoreV1().Nodes().Update(ctx, nd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "registered with Volcano, inventory withdrawn", func() bool {
		nd := get()
		reg := nd.Annotations[api.AnnotationVolcanoRegister]
		m, c := nd.Status.Allocatable[api.VolcanoVGPUMemory], nd.Status.Capacity[api.VolcanoVGPUCores]
		return nd.Annotations[api.AnnotationInventory] == "" && strings.Count(reg, ",10,") == 8 && strings.Count(reg, ",true,hami-core:") == 8 &&
			nd.Annotations[api.AnnotationVolcanoHandshake] != "" && m.Value() == memory && c.Value() == 800
	})
	if got := a.Resources(); len(got) != 1 || got[0] != api.VolcanoVGPUNumber {
		t.Errorf("device plugins %v, want %s alone", got, api.VolcanoVGPUNumber)
	}
	if p := a.PluginFor(api.VolcanoVGPUNumber); p == nil {
		t.Error("no device plugin for", api.VolcanoVGPUNumber)
	}

	nd = get()
	nd.Labels = map[string]string{api.LabelNodeConfig: "default"}
	if _, err := client.CoreV1().Nodes().Update(ctx, nd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Tessera's again", func() bool {
		nd := get()
		_, m := nd.Status.Capacity[api.VolcanoVGPUMemory]
		return nd.Annotations[api.AnnotationInventory] != "" && nd.Annotations[api.AnnotationVolcanoRegister] == "" && !m
	})
}
