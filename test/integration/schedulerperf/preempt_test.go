//go:build integration

package schedulerperf

// After every workload: the allocation records of the bound pods hold no
// GPU over its memory, cores or share slots (the placement core's
// invariant checker over what the API server holds). The preemption cases
// (performance-config.yaml) end with preemptors bound in their victims'
// room.

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// prepare is the hook run before each workload: it arranges for the DRA
// claims (dra_test.go) and the allocation records to be checked after it.
func prepare(tCtx ktesting.TContext) error {
	if err := prepareDRA(tCtx); err != nil {
		return err
	}
	tCtx.CleanupCtx(func(tCtx ktesting.TContext) {
		n, err := checkRecords(tCtx)
		if err != nil {
			tCtx.Error(err)
			return
		}
		if n > 0 {
			klog.Background().Info("Allocation records checked: no GPU over its memory, cores or share slots", "boundPodsWithRecords", n)
		}
	})
	return nil
}

// checkRecords runs placement.CheckRecords over the nodes' inventories
// and the bound pods' records; it returns how many records it checked.
func checkRecords(tCtx ktesting.TContext) (int, error) {
	nodes, err := tCtx.Client().CoreV1().Nodes().List(tCtx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	invs := map[string]*api.NodeInventory{}
	for i := range nodes.Items {
		inv, err := kubeobj.Inventory(&nodes.Items[i])
		if err != nil {
			return 0, fmt.Errorf("node %s: %w", nodes.Items[i].Name, err)
		}
		if inv != nil {
			invs[nodes.Items[i].Name] = inv
		}
	}
	pods, err := tCtx.Client().CoreV1().Pods(metav1.NamespaceAll).List(tCtx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	recs := map[string]*api.PodAllocation{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
			continue
		}
		if _, ok := p.Annotations[api.AnnotationAllocation]; !ok {
			continue
		}
		rec, err := kubeobj.Record(p)
		if err != nil {
			return 0, fmt.Errorf("pod %s: %w", kubeobj.Key(p), err)
		}
		recs[kubeobj.Key(p)] = rec
	}
	if len(recs) == 0 {
		return 0, nil
	}
	if err := placement.CheckRecords(invs, recs); err != nil {
		return 0, fmt.Errorf("over %d records: %w", len(recs), err)
	}
	return len(recs), nil
}
