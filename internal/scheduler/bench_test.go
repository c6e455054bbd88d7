package scheduler

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// BenchmarkCycle measures one pod's PreFilter, Filter and Score over 500
// nodes and its Reserve, the plugin's share of a scheduling cycle.
func BenchmarkCycle(b *testing.B) {
	registerMetrics()
	p, err := newPlugin(api.ClusterConfig{})
	if err != nil {
		b.Fatal(err)
	}
	var infos []fwk.NodeInfo
	for i := range 500 {
		name := fmt.Sprintf("n%03d", i)
		n := fixtures.Node(name, fixtures.Inventory(name, 8, "NVIDIA A100-SXM4-80GB", 81920, 100), names)
		p.st.upsertNode(klog.Background(), n)
		ni := framework.NewNodeInfo()
		ni.SetNode(n)
		infos = append(infos, ni)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("p%d", i)
		pod := fixtures.MakePod().Namespace("default").Name(name).UID(name).SchedulerName(SchedulerName).
			Container("main", map[string]string{"nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "1"}).Obj()
		cs := framework.NewCycleState()
		if _, st := p.PreFilter(ctx, cs, pod, infos); !st.IsSuccess() {
			b.Fatal(st)
		}
		for _, ni := range infos {
			if st := p.Filter(ctx, cs, pod, ni); !st.IsSuccess() {
				b.Fatal(st)
			}
			p.Score(ctx, cs, pod, ni)
		}
		if st := p.Reserve(ctx, cs, pod, infos[i%len(infos)].Node().Name); !st.IsSuccess() {
			b.Fatal(st)
		}
		if i%4000 == 3999 { // keep the nodes from filling up
			b.StopTimer()
			for j := i - 3999; j <= i; j++ {
				p.st.release("default/p"+fmt.Sprint(j), types.UID("p"+fmt.Sprint(j)))
			}
			b.StartTimer()
		}
	}
}
