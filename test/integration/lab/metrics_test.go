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
	"github.com/tessera-gpu/tessera/internal/testenv"
)

// TestNodeAgentMetrics scrapes the lab's node agents: every running
// fractional pod has per-container series with DCGM's labels (gpu, UUID,
// Hostname, namespace, pod, container), its limit as granted, the memory
// its process holds through the limiter, the time the limiter held its
// launches back and the allocations it refused: a pod that fills its
// limit (gpu-fill without --max) shows refusals, one that keeps its GPU
// busy beyond its 30 % share shows time throttled. A pod served by a DRA
// claim on lab-dra has the same series with the claim's name in `claim`.
func TestNodeAgentMetrics(t *testing.T) {
	const ns = "metrics"
	draNamespace(t, ns)
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
---
apiVersion: v1
kind: Pod
metadata: {name: full, namespace: metrics}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: tessera-lab/cuda
    command: [gpu-fill, --busy, "3600"]
    resources:
      limits: {nvidia.com/gpumem: 2048, nvidia.com/gpucores: 30}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: metrics, name: tenth}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.io
          capacity:
            requests: {memory: 2Gi, cores: "10"}
---
apiVersion: v1
kind: Pod
metadata: {name: claimed, namespace: metrics}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: tessera-lab/cuda
    command: [gpu-fill, --hold, forever]
    resources: {claims: [{name: gpu}]}
  resourceClaims: [{name: gpu, resourceClaimTemplateName: tenth}]
`)
	logsContain(t, ns, "fill", "holding")
	logsContain(t, ns, "full", "keeping the GPU busy")
	logsContain(t, ns, "claimed", "holding")
	type want struct {
		pod, uuid, claim string
		limitMiB         int64
		used             float64 // bytes, at least
		refused          bool    // at least one refusal
		throttled        bool    // some time throttled
	}
	var wants []want
	for _, name := range []string{"fill", "idle", "full"} {
		pod := waitPod(t, ns, name, time.Minute, phase("Running"))
		rec, err := kubeobj.Record(pod)
		if err != nil || rec == nil {
			t.Fatalf("%s: record %v", name, err)
		}
		g := rec.Containers[0].Devices[0]
		w := want{pod: name, uuid: g.UUID, limitMiB: g.MemoryMiB}
		switch name {
		case "fill":
			w.used = 1024 << 20
		case "full":
			w.used, w.refused, w.throttled = 2048<<20, true, true
		}
		wants = append(wants, w)
	}
	claimed := waitPod(t, ns, "claimed", time.Minute, phase("Running"))
	if claimed.Spec.NodeName != draNode || len(claimed.Status.ResourceClaimStatuses) != 1 || claimed.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("claimed: on %s, claim statuses %+v", claimed.Spec.NodeName, claimed.Status.ResourceClaimStatuses)
	}
	_, gpu := draContainer(t, ns, "claimed", "main")
	wants = append(wants, want{pod: "claimed", uuid: gpu, claim: *claimed.Status.ResourceClaimStatuses[0].ResourceClaimName,
		limitMiB: 2048, used: 2048 << 20, refused: true})

	for _, w := range wants {
		pod := waitPod(t, ns, w.pod, time.Minute, phase("Running"))
		url, err := dir.MetricsURL(pod.Spec.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{"UUID": w.uuid, "Hostname": pod.Spec.NodeName, "namespace": ns, "pod": w.pod, "container": "main", "claim": w.claim}
		var limit, used, throttled, refused *dto.Metric
		testenv.WaitFor(t, "series of "+w.pod, time.Minute, func() bool {
			fams := scrapeMetrics(t, url)
			limit = findSeries(fams, "tessera_container_memory_limit_bytes", labels)
			used = findSeries(fams, "tessera_container_memory_used_bytes", labels)
			throttled = findSeries(fams, "tessera_container_throttled_seconds_total", labels)
			refused = findSeries(fams, "tessera_container_allocations_refused_total", labels)
			return limit != nil && used != nil && throttled != nil && refused != nil &&
				used.GetGauge().GetValue() >= w.used &&
				(!w.refused || refused.GetCounter().GetValue() > 0) &&
				(!w.throttled || throttled.GetCounter().GetValue() > 0)
		})
		if got := limit.GetGauge().GetValue(); got != float64(w.limitMiB<<20) {
			t.Errorf("%s: limit %v, want %d MiB", w.pod, got, w.limitMiB)
		}
		for _, m := range []*dto.Metric{limit, used, throttled, refused} {
			hasGPU := false
			for _, l := range m.Label {
				hasGPU = hasGPU || (l.GetName() == "gpu" && l.GetValue() != "")
			}
			if !hasGPU {
				t.Errorf("%s: no gpu label: %v", w.pod, m.Label)
			}
		}
		if w.claim != "" {
			// the claim's container has no series without the claim (a DRA pod has no record)
			if m := findSeries(scrapeMetrics(t, url), "tessera_container_memory_limit_bytes", map[string]string{"pod": w.pod, "claim": ""}); m != nil {
				t.Errorf("%s: a series without its claim: %v", w.pod, m.Label)
			}
		}
		t.Logf("%s on %s (claim %q): limit %.0f MiB, used %.0f MiB, throttled %.2f s, refused %.0f", w.pod, pod.Spec.NodeName, w.claim,
			limit.GetGauge().GetValue()/(1<<20), used.GetGauge().GetValue()/(1<<20), throttled.GetCounter().GetValue(), refused.GetCounter().GetValue())
	}
	for _, name := range []string{"fill", "idle", "full", "claimed"} {
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
