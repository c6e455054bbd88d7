//go:build integration

package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestRecordWrite checks both ways the record reaches the pod, on every
// write the API server makes: with the shipped configuration (Tessera
// binds) the record arrives in the same write as spec.nodeName; with a
// profile where DefaultBinder binds, PreBind writes the record first. In
// neither is a pod ever bound without its record.
func TestRecordWrite(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tesseraBind bool
	}{
		{"shipped config: record in the Binding", true},
		{"DefaultBinder binds: record written in PreBind", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if !tc.tesseraBind {
				e.schedConfig = e.withoutTesseraBind()
			}
			e.addNodes("a100", 2, 4, "NVIDIA A100-SXM4-40GB", 40960)
			seen := e.watchWrites()
			e.startScheduler()
			pods := []*corev1.Pod{
				fixtures.MakePod().Namespace(gpuNS).Name("whole").Container("main", map[string]string{names.GPU: "1"}).Obj(),
				fixtures.MakePod().Namespace(gpuNS).Name("half").Container("main", map[string]string{names.GPU: "0.5"}).Obj(),
				fixtures.MakePod().Namespace(gpuNS).Name("two-containers").
					Container("a", map[string]string{names.Memory: "4000", names.Cores: "25"}).
					Container("b", map[string]string{names.MemoryPercentage: "25"}).Obj(),
			}
			for _, p := range pods {
				if _, err := e.create(p); err != nil {
					t.Fatalf("creating %s: %v", p.Name, err)
				}
				e.waitBound(p.Name)
			}
			e.checkInvariant()
			for _, p := range pods {
				var w writes
				err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
					w = seen(p.Name)
					return w.bound, nil
				})
				if err != nil {
					t.Fatalf("%s: the watch never delivered the bound pod", p.Name)
				}
				if w.boundWithoutRecord {
					t.Errorf("%s: a write bound the pod without its record", p.Name)
				}
				if got := w.recordBeforeBinding; got == tc.tesseraBind {
					t.Errorf("%s: record written before the binding = %v, want %v", p.Name, got, !tc.tesseraBind)
				}
			}
		})
	}
}

// withoutTesseraBind is the shipped configuration with the Tessera plugin
// taken out of the bind extension point, so DefaultBinder binds.
func (e *env) withoutTesseraBind() string {
	t := e.t
	return e.schedulerConfig("scheduler-prebind.yaml", func(cfg map[string]any) {
		for _, p := range cfg["profiles"].([]any) {
			prof := p.(map[string]any)
			if prof["schedulerName"] == api.SchedulerName {
				plugins := prof["plugins"].(map[string]any)
				if _, ok := plugins["bind"]; !ok {
					t.Fatal("the shipped profile has no bind section")
				}
				delete(plugins, "bind")
			}
		}
	})
}

// writes is what the pod's successive versions showed.
type writes struct {
	bound               bool // a version had a node
	recordBeforeBinding bool // a version had the record and no node
	boundWithoutRecord  bool // a version had a node and no record
}

// watchWrites watches every version of the pods of gpuNS until the test
// ends; the returned function tells what a pod's versions showed.
func (e *env) watchWrites() func(name string) writes {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := e.cp.Client.CoreV1().Pods(gpuNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]writes{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			_, rec := p.Annotations[api.AnnotationAllocation]
			bound := p.Spec.NodeName != ""
			mu.Lock()
			s := seen[p.Name]
			s.recordBeforeBinding = s.recordBeforeBinding || (rec && !bound)
			s.boundWithoutRecord = s.boundWithoutRecord || (bound && !rec)
			s.bound = s.bound || bound
			seen[p.Name] = s
			mu.Unlock()
		}
	}()
	e.t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return func(name string) writes {
		mu.Lock()
		defer mu.Unlock()
		return seen[name]
	}
}
