//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/clusterview"
	"github.com/tessera-gpu/tessera/internal/testenv"
)

// TestDRAViewsAndQuota, on the lab's DRA node with its real
// resourceclaim and quota controllers: a namespace with a 40 GiB GPU
// memory quota runs a pod whose template (20 GiB, 25 %) is shared by two
// containers and two pods sharing one pre-created 10 GiB claim (charged
// to each: 40 GiB in all), and refuses a fourth pod with the quota's
// message; kubectl tessera's views (clusterview) then show the claims on
// lab-dra's GPUs once each with their pods, and each container's memory
// and cores from its claim.
func TestDRAViewsAndQuota(t *testing.T) {
	const ns = "dra-ops"
	draNamespace(t, ns)
	apply(t, `apiVersion: v1
kind: ResourceQuota
metadata: {name: gpu-memory, namespace: dra-ops}
spec:
  hard: {requests.tessera.io/gpu-memory: 40Gi}
`)
	testenv.WaitFor(t, "the quota's status", time.Minute, func() bool {
		q, err := client.CoreV1().ResourceQuotas(ns).Get(context.Background(), "gpu-memory", metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) == 1
	})
	apply(t, `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: dra-ops, name: half}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.io
          capacity:
            requests: {memory: 20Gi, cores: "25"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: dra-ops, name: shared}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        capacity:
          requests: {memory: 10Gi}
`)
	pod := func(name, claim string, containers ...string) string {
		src := "resourceClaimTemplateName: half"
		if claim != "" {
			src = "resourceClaimName: " + claim
		}
		m := fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {namespace: dra-ops, name: %s}\nspec:\n  resourceClaims: [{name: gpu, %s}]\n  containers:\n", name, src)
		for _, c := range containers {
			m += fmt.Sprintf("  - {name: %s, image: cuda, command: [gpu-fill, --hold, forever], resources: {claims: [{name: gpu}]}}\n", c)
		}
		return m
	}
	apply(t, pod("pair", "", "a", "b"))
	apply(t, pod("r1", "shared", "main"))
	apply(t, pod("r2", "shared", "main"))
	out, err := kubectlIn(t, pod("over", "", "main"), "apply", "-f", "-")
	if err == nil || !strings.Contains(out, "exceeded quota: gpu-memory") || !strings.Contains(out, "used: requests.tessera.io/gpu-memory=40Gi") {
		t.Errorf("a fourth DRA pod over the 40 GiB quota: %v\n%s", err, out)
	}
	for _, n := range []string{"pair", "r1", "r2"} {
		waitRunning(t, ns, n)
	}

	r, err := clusterview.Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	// The GPUs' claims of this namespace, the generated claim's random
	// suffix replaced.
	gen := regexp.MustCompile(`^(dra-ops/pair-gpu-)[a-z0-9]+$`)
	var holders []string
	for _, n := range r.Nodes {
		for _, g := range n.GPUs {
			for _, u := range g.Claims {
				if !strings.HasPrefix(u.Claim, ns+"/") {
					continue
				}
				holders = append(holders, fmt.Sprintf("%s %s %d MiB %d%% pods %s", n.Name, gen.ReplaceAllString(u.Claim, "${1}*"), u.MemoryMiB, u.Cores, strings.Join(u.Pods, ",")))
				if !contains(g.Pods, u.Pods...) {
					t.Errorf("GPU %s pods %v lack the claim's %v", g.UUID, g.Pods, u.Pods)
				}
			}
		}
	}
	sort.Strings(holders)
	want := []string{
		"lab-dra dra-ops/pair-gpu-* 20480 MiB 25% pods dra-ops/pair",
		"lab-dra dra-ops/shared 10240 MiB 0% pods dra-ops/r1,dra-ops/r2",
	}
	if strings.Join(holders, "\n") != strings.Join(want, "\n") {
		t.Errorf("claims on the GPUs:\n%s\nwant:\n%s", strings.Join(holders, "\n"), strings.Join(want, "\n"))
	}
	var rows []string
	for _, p := range r.Pods {
		if p.Namespace != ns {
			continue
		}
		for _, c := range p.Containers {
			for _, d := range c.Devices {
				rows = append(rows, fmt.Sprintf("%s/%s %s %d MiB %d%% claim %s", p.Name, c.Name, p.Node, d.MemoryMiB, d.Cores, regexp.MustCompile(`^(pair-gpu-)[a-z0-9]+$`).ReplaceAllString(d.Claim, "${1}*")))
			}
		}
	}
	wantRows := []string{
		"pair/a lab-dra 20480 MiB 25% claim pair-gpu-*",
		"pair/b lab-dra 20480 MiB 25% claim pair-gpu-*",
		"r1/main lab-dra 10240 MiB 0% claim shared",
		"r2/main lab-dra 10240 MiB 0% claim shared",
	}
	if strings.Join(rows, "\n") != strings.Join(wantRows, "\n") {
		t.Errorf("pods' devices:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(wantRows, "\n"))
	}
	if r.Invariant != nil {
		t.Errorf("invariant: %v", r.Invariant)
	}
	// The charges: the template once (on container a), the shared claim
	// on each pod.
	for name, want := range map[string]string{"pair": "20Gi", "r1": "10Gi", "r2": "10Gi"} {
		p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := p.Spec.Containers[0].Resources.Requests[corev1.ResourceName("tessera.io/gpu-memory")]
		if q.String() != want {
			t.Errorf("pod %s charged %s, want %s", name, q.String(), want)
		}
	}
}

func contains(set []string, items ...string) bool {
	for _, it := range items {
		found := false
		for _, s := range set {
			found = found || s == it
		}
		if !found {
			return false
		}
	}
	return true
}
