package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPartitioningGauge: the gauge is what the agent answers at each
// scrape (a GPU put in MIG mode after the start drops to 0).
func TestPartitioningGauge(t *testing.T) {
	now := map[string]bool{"GPU-a": true, "GPU-b": false}
	g := Partitioning("node-1", func() map[string]bool { return now })
	const head = `
# HELP tessera_node_agent_gpu_driver_memory_partitioning 1 when the GPU's driver can partition its memory per cgroup (NVIDIA r615 or later, cgroup v2, MIG off; found at the agent's start, 0 once the GPU is in MIG mode), 0 otherwise. Where it can and the node agent runs the memory-limits hook, the driver holds the containers' GPU memory (docs/isolation.md).
# TYPE tessera_node_agent_gpu_driver_memory_partitioning gauge
`
	want := head + `tessera_node_agent_gpu_driver_memory_partitioning{Hostname="node-1",UUID="GPU-a"} 1
tessera_node_agent_gpu_driver_memory_partitioning{Hostname="node-1",UUID="GPU-b"} 0
`
	if err := testutil.CollectAndCompare(g, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	now = map[string]bool{"GPU-a": false, "GPU-b": false}
	want = head + `tessera_node_agent_gpu_driver_memory_partitioning{Hostname="node-1",UUID="GPU-a"} 0
tessera_node_agent_gpu_driver_memory_partitioning{Hostname="node-1",UUID="GPU-b"} 0
`
	if err := testutil.CollectAndCompare(g, strings.NewReader(want)); err != nil {
		t.Errorf("after GPU-a went into MIG mode: %v", err)
	}
}
