//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/webhook"
)

// quota creates a ResourceQuota of hard GPU memory in ns, with the status
// the quota controller would write (this control plane runs no
// controller manager; ResourceQuota admission refuses pods while a
// quota's status is unknown).
func (e *env) quota(ns, name, hard string) {
	e.t.Helper()
	ctx := context.Background()
	c := e.cp.Client.CoreV1()
	if _, err := c.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	rn := corev1.ResourceName("requests." + webhook.QuotaMemoryResource)
	q, err := c.ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{rn: resource.MustParse(hard)}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{rn: resource.MustParse("0")}}
	if _, err := c.ResourceQuotas(ns).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestGPUMemoryQuota: a namespace with a 40 GiB GPU memory quota runs two
// 20 GiB pods and refuses a third at admission with Kubernetes' message
// naming the quota, the used and the asked amounts; the admitted pods are
// placed (the charge does not stand in the scheduler's or kubelet's way).
// Every request form is charged: a 0.5 GPU fraction of the cluster's
// largest GPU (40 GiB here) is 20 GiB.
func TestGPUMemoryQuota(t *testing.T) {
	e := newEnv(t)
	e.addNodes("a100", 2, 2, "NVIDIA A100-SXM4-40GB", 40960)
	testenv.WaitFor(t, "webhook to see the inventories", 30*time.Second, func() bool {
		_, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name("probe40").Container("main", map[string]string{names.Memory: "40960"}).Obj())
		return err == nil
	})
	stop := e.startScheduler()
	defer stop()
	e.quota("team-a", "gpu-memory", "40Gi")
	pods := []*corev1.Pod{
		fixtures.MakePod().Namespace("team-a").Name("one").Container("main", map[string]string{names.Memory: "20480"}).Obj(),
		fixtures.MakePod().Namespace("team-a").Name("two").Container("main", map[string]string{names.GPU: "0.5"}).Obj(),
	}
	for _, p := range pods {
		got, err := e.create(p)
		if err != nil {
			t.Fatalf("creating %s: %v", p.Name, err)
		}
		q := got.Spec.Containers[0].Resources.Requests[webhook.QuotaMemoryResource]
		if q.Value() != 20<<30 {
			t.Errorf("%s charged %s, want 20Gi", p.Name, q.String())
		}
	}
	_, err := e.create(fixtures.MakePod().Namespace("team-a").Name("three").Container("main", map[string]string{names.MemoryPercentage: "50"}).Obj())
	if err == nil {
		t.Fatal("a third 20 GiB pod was admitted over the 40 GiB quota")
	}
	for _, want := range []string{"exceeded quota: gpu-memory", "requested: requests.tessera.io/gpu-memory=20Gi", "used: requests.tessera.io/gpu-memory=40Gi", "limited: requests.tessera.io/gpu-memory=40Gi"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err.Error(), want)
		}
	}
	// The admitted pods are placed: the charge is not a node resource.
	for _, p := range pods {
		testenv.WaitFor(t, p.Name+" bound", 60*time.Second, func() bool {
			got, err := e.cp.Client.CoreV1().Pods("team-a").Get(context.Background(), p.Name, metav1.GetOptions{})
			return err == nil && got.Spec.NodeName != ""
		})
	}
}

// TestGPUMemoryQuotaConcurrent: 50 pods of 3 GiB created at once in a
// namespace with a 40 GiB quota: exactly 13 are admitted (39 GiB), never
// more, and the quota's recorded usage equals what the admitted pods ask.
func TestGPUMemoryQuotaConcurrent(t *testing.T) {
	e := newEnv(t)
	e.addNodes("a100", 1, 8, "NVIDIA A100-SXM4-40GB", 40960)
	e.quota("team-b", "gpu-memory", "40Gi")
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, refused := 0, 0
	var other []error
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.create(fixtures.MakePod().Namespace("team-b").Name(fmt.Sprintf("p%02d", i)).Container("main", map[string]string{names.Memory: "3072"}).Obj())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case strings.Contains(err.Error(), "exceeded quota"):
				refused++
			default:
				other = append(other, err)
			}
		}()
	}
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("unexpected errors: %v", other)
	}
	if admitted != 13 || refused != 37 {
		t.Errorf("admitted %d, refused %d; want 13 and 37 (40 GiB / 3 GiB)", admitted, refused)
	}
	list, err := e.cp.Client.CoreV1().Pods("team-b").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sum resource.Quantity
	for _, p := range list.Items {
		sum.Add(p.Spec.Containers[0].Resources.Requests[webhook.QuotaMemoryResource])
	}
	if sum.Cmp(resource.MustParse("40Gi")) > 0 {
		t.Errorf("admitted pods ask %s, over the 40Gi quota", sum.String())
	}
	q, err := e.cp.Client.CoreV1().ResourceQuotas("team-b").Get(context.Background(), "gpu-memory", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := q.Status.Used[corev1.ResourceName("requests."+webhook.QuotaMemoryResource)]
	if used.Cmp(sum) != 0 {
		t.Errorf("quota used %s, pods ask %s", used.String(), sum.String())
	}
	t.Logf("50 concurrent creations: %d admitted (%s of 40Gi), %d refused", admitted, sum.String(), refused)
}
