//go:build integration

package lab_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/testenv"
)

// TestNodeAgentMetrics scrapes the lab's node agents: every running
// fractional pod has per-container series with DCGM's labels (gpu, UUID,
// Hostname, namespace, pod, container), its limit as granted, and the
// memory its process holds through the limiter.
func TestNodeAgentMetrics(t *testing.T) {
	const ns = "metrics"
	useNamespace(t, ns)
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: fill, namespace: metrics}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: tessera-lab/cuda
    command: [gpu-fill, --max, "1024", --hold, forever]
    resources:
      limits: {nvidia.com/gpumem: 3072, nvidia.com/gpucores: 30}
---
apiVersion: v1
kind: Pod
metadata: {name: idle, namespace: metrics}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: tessera-lab/cuda
    command: [sleep, "3600"]
    resources:
      limits: {nvidia.com/gpu: 0.25}
`)
	logsContain(t, ns, "fill", "holding")
	for _, name := range []string{"fill", "idle"} {
		pod := waitPod(t, ns, name, time.Minute, phase("Running"))
		rec, err := kubeobj.Record(pod)
		if err != nil || rec == nil {
			t.Fatalf("%s: record %v", name, err)
		}
		g := rec.Containers[0].Devices[0]
		url, err := lab.MetricsURL(dir, pod.Spec.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"UUID": g.UUID, "Hostname": pod.Spec.NodeName, "namespace": ns, "pod": name, "container": "main"}
		var limit, used *dto.Metric
		testenv.WaitFor(t, "series of "+name, time.Minute, func() bool {
			fams := scrapeMetrics(t, url)
			limit = findSeries(fams, "tessera_container_memory_limit_bytes", want)
			used = findSeries(fams, "tessera_container_memory_used_bytes", want)
			return limit != nil && used != nil && (name != "fill" || used.GetGauge().GetValue() >= 1024<<20)
		})
		if got := limit.GetGauge().GetValue(); got != float64(g.MemoryMiB<<20) {
			t.Errorf("%s: limit %v, want %d MiB", name, got, g.MemoryMiB)
		}
		hasGPU := false
		for _, l := range limit.Label {
			hasGPU = hasGPU || (l.GetName() == "gpu" && l.GetValue() != "")
		}
		if !hasGPU {
			t.Errorf("%s: no gpu label: %v", name, limit.Label)
		}
		t.Logf("%s on %s: limit %.0f MiB, used %.0f MiB", name, pod.Spec.NodeName, limit.GetGauge().GetValue()/(1<<20), used.GetGauge().GetValue()/(1<<20))
	}
	for _, name := range []string{"fill", "idle"} {
		_ = client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	}
}

func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func findSeries(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
next:
	for _, m := range fams[name].GetMetric() {
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
