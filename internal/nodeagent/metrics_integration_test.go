//go:build integration

package nodeagent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/clusterview"
	"github.com/tessera-gpu/tessera/internal/limiterstate"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nodelabels"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// scrape GETs url and parses Prometheus' text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return fams
}

// series returns the metric of fam whose labels include want, or nil.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return -1
}

// TestMetricsAndLabels runs the agent against a real kube-apiserver over
// go-nvml's mock DGX A100, with running pods holding fractional, whole
// and multi-GPU grants, one of whose containers has a limiter state file:
// its scraped /metrics has a per-container series with DCGM's labels for
// every container of every running GPU pod, the per-GPU allocation the
// records charge, the limiter's usage, and the Node carries GFD's labels.
func TestMetricsAndLabels(t *testing.T) {
	ctx := context.Background()
	cp := testenv.StartControlPlane(t)
	client := cp.Client
	const node = "gpu-metrics"
	if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := nvmltest.DGXA100()
	var uuids []string
	for i := range n.Devices {
		u, _ := n.Device(i).GetUUID()
		uuids = append(uuids, u)
	}
	n.SetUtilization(0, 37, 10)
	n.SetProcessSM(0, 4242, 21)

	// Pods: two fractional ones sharing GPU 0 (the first with two
	// containers), a whole GPU, a two-GPU share, and a finished pod that
	// must not count.
	type podSpec struct {
		name  string
		phase v1.PodPhase
		ctrs  [][]api.DeviceGrant
	}
	specs := []podSpec{
		{"frac-a", v1.PodRunning, [][]api.DeviceGrant{{{UUID: uuids[0], MemoryMiB: 10240, Cores: 30}}, {{UUID: uuids[0], MemoryMiB: 2048, Cores: 10}}}},
		{"frac-b", v1.PodRunning, [][]api.DeviceGrant{{{UUID: uuids[0], MemoryMiB: 5120, Cores: 20}}}},
		{"whole", v1.PodRunning, [][]api.DeviceGrant{{{UUID: uuids[1], MemoryMiB: 40960, Cores: 100, Exclusive: true}}}},
		{"multi", v1.PodRunning, [][]api.DeviceGrant{{{UUID: uuids[2], MemoryMiB: 4096, Cores: 25}, {UUID: uuids[3], MemoryMiB: 4096, Cores: 25}}}},
		{"done", v1.PodSucceeded, [][]api.DeviceGrant{{{UUID: uuids[0], MemoryMiB: 8192, Cores: 50}}}},
	}
	created := map[string]*v1.Pod{}
	for _, s := range specs {
		p := grantedPod("ml", node, s.name, nil, s.ctrs)
		if len(created) == 0 {
			if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := client.CoreV1().Pods("ml").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Status.Phase = s.phase
		if got, err = client.CoreV1().Pods("ml").UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		created[s.name] = got
	}

	// frac-a/app0 has run CUDA: 3 GiB used of its 10 GiB, one process.
	stateRoot := filepath.Join(t.TempDir(), "containers")
	dirs := statedir.Dirs{Root: stateRoot}
	if _, err := dirs.Create(created["frac-a"].UID, "app0"); err != nil {
		t.Fatal(err)
	}
	dir := dirs.StateDir(created["frac-a"].UID, "app0") // the limiter's writable state
	snap := &limiterstate.Snapshot{Seq: 2}
	snap.Devices[0] = limiterstate.Device{Limit: 10240 << 20, Used: 3 << 30, SMLimit: 30, ThrottledNs: 2_500_000_000, RefusedAllocations: 3}
	proc := limiterstate.Process{PID: 12, HostPID: 4242}
	proc.Used[0] = 3 << 30
	snap.Processes = []limiterstate.Process{proc}
	if err := os.WriteFile(filepath.Join(dir, statedir.LimiterStateFile), limiterstate.Encode(snap), 0o644); err != nil {
		t.Fatal(err)
	}
	// frac-b/app0's state file is garbage: counted, and its series stay.
	if _, err := dirs.Create(created["frac-b"].UID, "app0"); err != nil {
		t.Fatal(err)
	}
	dirB := dirs.StateDir(created["frac-b"].UID, "app0")
	if err := os.WriteFile(filepath.Join(dirB, statedir.LimiterStateFile), []byte("not a state file"), 0o644); err != nil {
		t.Fatal(err)
	}

	paths := deviceplugin.DefaultPaths()
	paths.StateRoot = stateRoot
	a, err := New(n, client, Options{
		NodeName: node, Resource: gpuRes,
		Health:         health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, WaitTimeout: 10 * time.Millisecond},
		Paths:          paths,
		NoPlugin:       true,
		MetricsAddress: "127.0.0.1:0",
	}, ktesting.NewLogger(t, ktesting.NewConfig()).WithName("agent"))
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	// An application XID (13) counts and leaves the GPU healthy; XID 79
	// makes GPU 7 unhealthy.
	testenv.WaitFor(t, "the agent's metrics server", 30*time.Second, func() bool { return a.MetricsAddr() != "" })
	n.Events.Inject(n.Device(5), 1<<3 /* nvml.EventTypeXidCriticalError */, 13)
	n.Events.Inject(n.Device(7), 1<<3, 79)
	url := "http://" + a.MetricsAddr() + "/metrics"

	var fams map[string]*dto.MetricFamily
	testenv.WaitFor(t, "per-container series of every running GPU pod, GPU 7 unhealthy", 30*time.Second, func() bool {
		fams = scrape(t, url)
		h := series(fams, "tessera_gpu_healthy", map[string]string{"gpu": "7"})
		x := series(fams, "tessera_gpu_xid_errors_total", map[string]string{"gpu": "5"})
		return series(fams, "tessera_container_memory_limit_bytes", map[string]string{"pod": "multi"}) != nil &&
			h != nil && value(h) == 0 && x != nil && value(x) == 1
	})

	model := a.Devices()[0].GPU.Model // "Mock NVIDIA A100-SXM4-40GB"
	gpu0 := map[string]string{"gpu": "0", "UUID": uuids[0], "device": "nvidia0", "modelName": model, "Hostname": node}
	with := func(base map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		// Per GPU: frac-a's two containers and frac-b on GPU 0, the
		// finished pod not counted.
		{"tessera_gpu_memory_allocated_bytes", gpu0, (10240 + 2048 + 5120) << 20},
		{"tessera_gpu_cores_allocated_percent", gpu0, 60},
		{"tessera_gpu_shares_allocated", gpu0, 3},
		{"tessera_gpu_memory_total_bytes", gpu0, 40960 << 20},
		{"tessera_gpu_utilization_percent", gpu0, 37},
		{"tessera_gpu_healthy", gpu0, 1},
		{"tessera_gpu_memory_allocated_bytes", map[string]string{"gpu": "1"}, 40960 << 20},
		{"tessera_gpu_cores_allocated_percent", map[string]string{"gpu": "1"}, 100},
		{"tessera_gpu_memory_allocated_bytes", map[string]string{"gpu": "3"}, 4096 << 20},
		// Per container.
		{"tessera_container_memory_used_bytes", with(gpu0, "namespace", "ml", "pod", "frac-a", "container", "app0", "claim", ""), 3 << 30},
		{"tessera_container_memory_limit_bytes", with(gpu0, "namespace", "ml", "pod", "frac-a", "container", "app0"), 10240 << 20},
		{"tessera_container_sm_share_percent", with(gpu0, "pod", "frac-a", "container", "app0"), 30},
		{"tessera_container_sm_utilization_percent", with(gpu0, "pod", "frac-a", "container", "app0"), 21},
		{"tessera_container_processes", with(gpu0, "pod", "frac-a", "container", "app0"), 1},
		{"tessera_container_throttled_seconds_total", with(gpu0, "namespace", "ml", "pod", "frac-a", "container", "app0", "claim", ""), 2.5},
		{"tessera_container_allocations_refused_total", with(gpu0, "namespace", "ml", "pod", "frac-a", "container", "app0", "claim", ""), 3},
		{"tessera_container_throttled_seconds_total", with(gpu0, "pod", "frac-a", "container", "app1"), 0},
		{"tessera_container_allocations_refused_total", with(gpu0, "pod", "frac-a", "container", "app1"), 0},
		{"tessera_container_memory_used_bytes", with(gpu0, "pod", "frac-a", "container", "app1"), 0},
		{"tessera_container_memory_limit_bytes", with(gpu0, "pod", "frac-a", "container", "app1"), 2048 << 20},
		{"tessera_container_memory_limit_bytes", with(gpu0, "pod", "frac-b", "container", "app0"), 5120 << 20},
		{"tessera_container_memory_limit_bytes", map[string]string{"gpu": "1", "pod": "whole"}, 40960 << 20},
		{"tessera_container_sm_share_percent", map[string]string{"gpu": "1", "pod": "whole"}, 100},
		{"tessera_container_memory_limit_bytes", map[string]string{"gpu": "2", "UUID": uuids[2], "pod": "multi"}, 4096 << 20},
		{"tessera_container_memory_limit_bytes", map[string]string{"gpu": "3", "UUID": uuids[3], "pod": "multi"}, 4096 << 20},
		{"tessera_node_agent_state_read_errors_total", map[string]string{"Hostname": node}, -2},
		// the mock's driver predates memory partitioning (r615)
		{"tessera_node_agent_gpu_driver_memory_partitioning", map[string]string{"UUID": uuids[0], "Hostname": node}, 0},
	}
	for _, c := range checks {
		m := series(fams, c.name, c.labels)
		if m == nil {
			t.Errorf("no series %s%v", c.name, c.labels)
			continue
		}
		if c.want == -2 {
			if value(m) < 1 {
				t.Errorf("%s = %v, want >= 1 (frac-b's state file is garbage)", c.name, value(m))
			}
			continue
		}
		if value(m) != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, value(m), c.want)
		}
	}
	// frac-b's unreadable file: its counters are unknown, not 0.
	if m := series(fams, "tessera_container_allocations_refused_total", map[string]string{"pod": "frac-b"}); m != nil {
		t.Errorf("counters from an unreadable state file: %v", m)
	}
	if m := series(fams, "tessera_container_memory_limit_bytes", map[string]string{"pod": "done"}); m != nil {
		t.Errorf("a finished pod has a series: %v", m)
	}
	// One series per running container and GPU: frac-a ×2, frac-b,
	// whole, multi ×2 GPUs.
	if got := len(fams["tessera_container_memory_limit_bytes"].GetMetric()); got != 6 {
		t.Errorf("%d tessera_container_memory_limit_bytes series, want 6", got)
	}

	// `kubectl tessera top` reads these series (clusterview.ParseTop).
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := clusterview.ParseTop(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var top strings.Builder
	if err := clusterview.PrintTop(&top, rows, "ml", ""); err != nil {
		t.Fatal(err)
	}
	wantTop := []string{
		"NAMESPACE  POD     CONTAINER  NODE         GPU  MEMORY USED/LIMIT (MiB)  MEMORY %  SM USE/SHARE",
		"ml         frac-a  app0       gpu-metrics  0    3072/10240               30%       21%/30%",
		"ml         frac-a  app1       gpu-metrics  0    0/2048                   0%        0%/10%",
		"ml         frac-b  app0       gpu-metrics  0    0/5120                   0%        0%/20%",
		"ml         multi   app0       gpu-metrics  2    0/4096                   0%        0%/25%",
		"ml         multi   app0       gpu-metrics  3    0/4096                   0%        0%/25%",
		"ml         whole   app0       gpu-metrics  1    0/40960                  0%        0%/100%",
	}
	if got := strings.TrimSpace(top.String()); got != strings.Join(wantTop, "\n") {
		t.Errorf("kubectl tessera top:\n%s\nwant\n%s", got, strings.Join(wantTop, "\n"))
	}

	// GFD labels on the Node.
	var nd *v1.Node
	testenv.WaitFor(t, "GFD labels on the Node", 30*time.Second, func() bool {
		nd, err = client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && nd.Labels[nodelabels.Product] != ""
	})
	want := map[string]string{
		nodelabels.Product: nodelabels.Sanitize(model), nodelabels.Memory: "40960", nodelabels.Count: "8",
		nodelabels.Family: "ampere", nodelabels.ComputeMajor: "8", nodelabels.ComputeMinor: "0",
		nodelabels.MIGCapable: "true", nodelabels.Sharing: "shared", nodelabels.SharingStrategy: "none",
	}
	for k, v := range want {
		if nd.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, nd.Labels[k], v, nd.Labels)
		}
	}
	for _, k := range []string{nodelabels.DriverMajor, nodelabels.RuntimeMajor} {
		if !strings.ContainsAny(nd.Labels[k], "0123456789") {
			t.Errorf("label %s = %q, want a number", k, nd.Labels[k])
		}
	}
	// A label someone removes comes back; a stale managed label goes.
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null,%q:"ampere-old","nvidia.com/gpu.machine":"kept"}}}`, nodelabels.Product, nodelabels.Family)
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "labels restored", 30*time.Second, func() bool {
		nd, err = client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		ok := err == nil && nd.Labels[nodelabels.Product] == nodelabels.Sanitize(model) && nd.Labels[nodelabels.Family] == "ampere"
		if !ok && err == nil {
			t.Logf("labels now %v", nd.Labels)
		}
		return ok
	})
	if nd.Labels["nvidia.com/gpu.machine"] != "kept" {
		t.Errorf("a label the agent does not own was touched: %v", nd.Labels)
	}
}
