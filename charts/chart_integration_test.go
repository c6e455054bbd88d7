//go:build integration

package charts

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/testenv"
)

// Pinned CRDs of the kinds the chart renders beside Kubernetes' own, from
// their projects' Go modules (the module proxy is what CI reaches).
var crds = []struct{ module, file string }{
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"},
	{"github.com/cert-manager/cert-manager@v1.21.2", "deploy/crds/cert-manager.io_certificates.yaml"},
	{"github.com/cert-manager/cert-manager@v1.21.2", "deploy/crds/cert-manager.io_issuers.yaml"},
}

func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", mod)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s", mod, err, out)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", mod, err, m.Error)
	}
	return m.Dir
}

// TestChartServerDryRun: every object of every golden value set is
// accepted by a real kube-apiserver (kubectl apply --dry-run=server), with
// the pinned CRDs of ServiceMonitor, PrometheusRule, Certificate and
// Issuer installed.
func TestChartServerDryRun(t *testing.T) {
	// The node agent is privileged (NVML events, device nodes): allowed
	// as on any cluster that runs GPU node software.
	cp := testenv.StartControlPlane(t, testenv.Options{APIServerFlags: []string{"--allow-privileged=true"}})
	dir := t.TempDir()
	kubectl, err := testenv.BuildKubectl(dir)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(kubectl, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	var files []string
	for _, c := range crds {
		files = append(files, filepath.Join(moduleDir(t, c.module), c.file))
	}
	if out, err := run(append([]string{"apply", "--server-side"}, flagsFor(files)...)...); err != nil {
		t.Fatalf("installing CRDs: %v\n%s", err, out)
	}
	if out, err := run("wait", "--for=condition=Established", "--timeout=60s", "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com", "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tessera-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, values := range valueSets {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "render.yaml")
			if err := os.WriteFile(path, []byte(render(t, values)), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := run("apply", "--dry-run=server", "-f", path)
			if err != nil {
				t.Fatalf("kubectl apply --dry-run=server: %v\n%s", err, out)
			}
			n := strings.Count(out, "(server dry run)")
			if n < 20 {
				t.Errorf("only %d objects accepted:\n%s", n, out)
			}
			t.Logf("%s: %d objects accepted by the API server", name, n)
		})
	}
}

func flagsFor(files []string) []string {
	var out []string
	for _, f := range files {
		out = append(out, "-f", f)
	}
	return out
}
