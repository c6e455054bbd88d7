package scheduler

import (
	"strings"
	"testing"

	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
)

func TestMetricsRegistered(t *testing.T) {
	registerMetrics()
	registerMetrics() // once per process, however many plugins
	ts := newTestScheduler(t, nil, a100Node("m", 1))
	if node, msg := ts.schedule(fixtures.MakePod().Name("metrics").Container("main", map[string]string{"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "20"}).Obj()); node != "m" {
		t.Fatal(msg)
	}
	if node, _ := ts.schedule(fixtures.MakePod().Name("nofit").Container("main", map[string]string{"nvidia.com/gpumem": "40000"}).Obj()); node != "" {
		t.Fatalf("40000 MiB placed on %s beside 1000 MiB of a 40960 MiB GPU", node)
	}
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "tessera_scheduler_") {
			got[f.GetName()] = f.String()
		}
	}
	for _, want := range []string{
		"tessera_scheduler_placements_total",
		"tessera_scheduler_failures_total",
		"tessera_scheduler_gpu_allocated_memory_mib",
		"tessera_scheduler_gpu_allocated_cores_percent",
		"tessera_scheduler_gpu_allocated_shares",
		"tessera_scheduler_plugin_duration_seconds",
	} {
		if _, ok := got[want]; !ok {
			t.Errorf("metric %s not exported (have %v)", want, keys(got))
		}
	}
	if s := got["tessera_scheduler_failures_total"]; !strings.Contains(s, "InsufficientGPUMemory") {
		t.Errorf("failures_total has no InsufficientGPUMemory reason: %s", s)
	}
	if s := got["tessera_scheduler_gpu_allocated_memory_mib"]; !strings.Contains(s, "value:1000") {
		t.Errorf("allocated memory gauge: %s", s)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
