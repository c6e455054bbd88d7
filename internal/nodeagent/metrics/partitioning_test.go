package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
)

func TestPartitioningGauge(t *testing.T) {
	g := Partitioning("node-1", map[string]memlimits.Support{"GPU-a": {OK: true}, "GPU-b": {Reason: "driver 580 is older than r615"}})
	want := `
# HELP tessera_node_agent_gpu_driver_memory_partitioning 1 when the GPU's driver can partition its memory per cgroup (NVIDIA r615 or later, cgroup v2, MIG off; found at the agent's start), 0 otherwise. Where it can and the node agent runs the memory-limits hook, the driver holds the containers' GPU memory (docs/isolation.md).
# TYPE tessera_node_agent_gpu_driver_memory_partitioning gauge
tessera_node_agent_gpu_driver_memory_partitioning{Hostname="node-1",UUID="GPU-a"} 1
tessera_node_agent_gpu_driver_memory_partitioning{Hostname="node-1",UUID="GPU-b"} 0
`
	if err := testutil.CollectAndCompare(g, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
