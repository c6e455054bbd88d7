package scheduler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/parallelize"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// BenchmarkCycle measures one pod's PreFilter, Filter and Score over 500
// nodes and its Reserve, the plugin's share of a scheduling cycle.
func BenchmarkCycle(b *testing.B) {
	registerMetrics()
	p, err := newPlugin(api.ClusterConfig{}, policies.All())
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
		pod := fixtures.MakePod().Namespace("default").Name(name).UID(name).SchedulerName(api.SchedulerName).
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

// benchHandle is the part of kube-scheduler's Handle that PreFilter uses:
// the cycle's snapshot of nodes (nil: none, so the candidates check no
// node rules) and the parallelizer.
type benchHandle struct {
	fwk.Handle
	lister fwk.SharedLister
	par    fwk.Parallelizer
}

func (h benchHandle) SnapshotSharedLister() fwk.SharedLister { return h.lister }
func (h benchHandle) Parallelizer() fwk.Parallelizer         { return h.par }

// BenchmarkPreFilterRules measures PreFilter, the candidates, of one GPU
// pod on 5,000 nodes × 8 GPUs under the shipped tessera policy, with and
// without the pod's node rules (nodeSelector, required affinity,
// tolerations; candidates.go): "off" checks none (the candidates before
// the rules), "on" checks them on an untainted cluster, "tolerated" on a
// cluster whose nodes all carry a NoSchedule taint the pod tolerates,
// "pinned" for a pod whose nodeSelector matches one node in 10.
// "pinned-unnarrowed" is the alternative of not narrowing such a pod: its
// PreFilter, then the plugin's Filter and Score on each of the 500 nodes
// its selector matches (the plugin's share only: kube-scheduler's own
// filters on all 5,000 nodes come on top). Between timed pods (untimed)
// the pod is reserved on a candidate and the one before it released, so
// two nodes change per pod and the memo works as in a running cluster.
//
//	go test -run '^$' -bench PreFilterRules -cpu 1 ./internal/scheduler/
func BenchmarkPreFilterRules(b *testing.B) {
	for _, c := range []struct {
		name string
		m    rulesBench
	}{
		{"off", rulesBench{}},
		{"on", rulesBench{rules: true}},
		{"tolerated", rulesBench{rules: true, taint: true}},
		{"pinned", rulesBench{rules: true, pin: true}},
		{"pinned-unnarrowed", rulesBench{rules: true, pin: true, wide: true}},
	} {
		b.Run(c.name, func(b *testing.B) { benchPreFilterRules(b, c.m) })
	}
}

type rulesBench struct{ rules, taint, pin, wide bool }

func benchPreFilterRules(b *testing.B, m rulesBench) {
	registerMetrics()
	schedmetrics.Register() // the parallelizer's
	p, err := newPlugin(api.ClusterConfig{PlacementPolicy: policies.NameTessera}, policies.All())
	if err != nil {
		b.Fatal(err)
	}
	var nodes []*corev1.Node
	var matching []fwk.NodeInfo // the nodes a pinned pod's selector matches
	for i := range 5000 {
		name := fmt.Sprintf("n%04d", i)
		n := fixtures.Node(name, fixtures.Inventory(name, 8, "NVIDIA A100-SXM4-80GB", 81920, 100), names)
		if i%10 == 0 {
			n.Labels["pool"] = "pinned"
			ni := framework.NewNodeInfo()
			ni.SetNode(n)
			matching = append(matching, ni)
		}
		if m.taint {
			n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}}
		}
		p.st.upsertNode(klog.Background(), n)
		nodes = append(nodes, n)
	}
	h := benchHandle{par: parallelize.NewParallelizer(parallelize.DefaultParallelism)}
	if m.rules {
		h.lister = schedcache.NewSnapshot(nil, nodes)
	}
	p.handle = h
	ctx := context.Background()
	shapes := []map[string]string{
		{names.GPU: "1", names.Memory: "10000"},
		{names.GPU: "1", names.Memory: "20000", names.Cores: "30"},
		{names.GPU: "1"},
		{names.GPU: "2"},
	}
	pod := func(i int) *corev1.Pod {
		name := fmt.Sprintf("p%d", i)
		pod := fixtures.MakePod().Namespace("default").Name(name).UID(name).SchedulerName(api.SchedulerName).
			Container("main", shapes[i%len(shapes)]).Obj()
		pod.Spec.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		if m.pin {
			pod.Spec.NodeSelector = map[string]string{"pool": "pinned"}
		}
		return pod
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// 10,000 pods (names apart from the timed ones) on random nodes, so
	// the policy's scores differ.
	for i := range 10000 {
		pd := pod(1_000_000 + i)
		req, err := podrequest.FromPod(pd, p.names)
		if err != nil {
			b.Fatal(err)
		}
		cr, err := p.st.cluster.Compile(req)
		if err != nil {
			b.Fatal(err)
		}
		if obs, ok := p.policy.(placement.Observer); ok && i < 1100 {
			// Past the learner's early rebuilds (1, 2, 4, … 1024
			// pods), as BenchmarkSchedulePod.
			obs.Observe(cr)
		}
		s := &cycleState{cr: cr, pol: placement.Prepare(cr, placement.PolicyFor(cr, p.policy))}
		s.ranker = placement.RankerFor(cr, s.pol)
		sc := new(scratch)
		if r := p.fit(s, nodes[rng.IntN(len(nodes))].Name, sc); r.OK() {
			if _, err := p.st.cluster.Assign(cr, &sc.p); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	prev := ""
	times := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		pd := pod(i)
		cs := framework.NewCycleState()
		if m.wide {
			p.widen(pd.UID)
		}
		start := time.Now()
		res, st := p.PreFilter(ctx, cs, pd, nil)
		to := ""
		if m.wide {
			var best int64
			for _, ni := range matching {
				if p.Filter(ctx, cs, pd, ni).IsSuccess() {
					if score, _ := p.Score(ctx, cs, pd, ni); to == "" || score > best {
						to, best = ni.Node().Name, score
					}
				}
			}
		}
		times = append(times, time.Since(start))
		if !st.IsSuccess() || res.AllNodes() != m.wide {
			b.Fatalf("PreFilter: %v %v", res, st)
		}
		b.StopTimer()
		if !m.wide {
			to = sets.List(res.NodeNames)[0]
		}
		if st := p.Reserve(ctx, cs, pd, to); !st.IsSuccess() {
			b.Fatal(st)
		}
		p.forget(pd.UID)
		if prev != "" {
			p.st.release("default/"+prev, types.UID(prev))
		}
		prev = pd.Name
		b.StartTimer()
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-median")
}
