package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// PolicySchedulerName is the profile EveryPolicyConfig gives policy.
func PolicySchedulerName(policy string) string { return "tessera-policy-" + policy }

// EveryPolicyConfig is the shipped scheduler configuration
// (deploy.SchedulerConfigFor, reaching its API server through kubeconfig)
// with its tessera-scheduler profile repeated once per placement policy
// (policies.Names), each named PolicySchedulerName(policy) and running
// that policy: one scheduler process starts every policy.
func EveryPolicyConfig(kubeconfig string) ([]byte, error) {
	raw, err := deploy.SchedulerConfigFor(kubeconfig, 100, 200)
	if err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, err
	}
	profiles, _ := cfg["profiles"].([]any)
	if len(profiles) != 1 {
		return nil, fmt.Errorf("the shipped configuration has %d profiles, want 1", len(profiles))
	}
	var out []any
	for _, name := range policies.Names() {
		// A deep copy of the profile through YAML.
		b, err := yaml.Marshal(profiles[0])
		if err != nil {
			return nil, err
		}
		var prof map[string]any
		if err := yaml.Unmarshal(b, &prof); err != nil {
			return nil, err
		}
		prof["schedulerName"] = PolicySchedulerName(name)
		set := false
		for _, pc := range prof["pluginConfig"].([]any) {
			if pc := pc.(map[string]any); pc["name"] == "Tessera" {
				pc["args"].(map[string]any)["placementPolicy"] = name
				set = true
			}
		}
		if !set {
			return nil, fmt.Errorf("the shipped profile has no Tessera pluginConfig")
		}
		out = append(out, prof)
	}
	cfg["profiles"] = out
	return yaml.Marshal(cfg)
}

// CheckEveryPolicySchedules creates in namespace ns (which must exist) one
// pod asking a tenth of a GPU per profile of EveryPolicyConfig, and waits
// until a scheduler running that configuration has bound each with a
// valid allocation record for the node it is bound to. It fails t naming
// the policies whose pod was not placed.
func CheckEveryPolicySchedules(t testing.TB, client kubernetes.Interface, ns string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	names := api.DefaultResourceNames
	for _, name := range policies.Names() {
		pod := fixtures.MakePod().Namespace(ns).Name("policy-"+name).SchedulerName(PolicySchedulerName(name)).
			ZeroTerminationGracePeriod().
			Container("c", map[string]string{names.GPU: "1", names.MemoryPercentage: "10", names.Cores: "10"}).Obj()
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating the pod for policy %s: %v", name, err)
		}
	}
	deadline := time.Now().Add(timeout)
	for _, name := range policies.Names() {
		var why string
		for {
			p, err := client.CoreV1().Pods(ns).Get(ctx, "policy-"+name, metav1.GetOptions{})
			switch {
			case err != nil:
				why = err.Error()
			case p.Spec.NodeName == "":
				why = fmt.Sprintf("not bound (conditions %+v)", p.Status.Conditions)
			default:
				rec, err := api.DecodeAllocation([]byte(p.Annotations[api.AnnotationAllocation]))
				if err == nil && rec.Node == p.Spec.NodeName {
					why = ""
				} else {
					why = fmt.Sprintf("bound to %s without a valid record (%v)", p.Spec.NodeName, err)
				}
			}
			if why == "" || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if why != "" {
			t.Errorf("policy %s (profile %s): %s", name, PolicySchedulerName(name), why)
		}
	}
}
