package charts

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// renderNotes renders templates/NOTES.txt with values (a file, or "" for
// the defaults) and returns it with the rest of the render. helm template
// leaves NOTES.txt out, so a copy of the chart renders it through tpl into
// a ConfigMap of its own, with the chart's named templates and values.
func renderNotes(t *testing.T, values string) (notes, docs string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tessera")
	if err := os.CopyFS(dir, os.DirFS("tessera")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "templates", "NOTES.txt"), filepath.Join(dir, "files", "notes.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-rendered-notes.yaml"), []byte(`apiVersion: v1
kind: ConfigMap
metadata:
  name: zz-rendered-notes
data:
  notes: {{ tpl (.Files.Get "files/notes.txt") . | quote }}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "tessera", dir, "--namespace", "tessera-system"}
	if values != "" {
		abs, err := filepath.Abs(values)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", abs)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	cm := objects(t, out)["ConfigMap/zz-rendered-notes"]
	if cm == nil {
		t.Fatal("the render has no ConfigMap zz-rendered-notes")
	}
	notes, _ = cm.Object["data"].(map[string]any)["notes"].(string)
	return notes, out
}

// TestChartNotes: the notes helm prints after an install name every
// component the release installed (each Deployment, DaemonSet, webhook
// configuration, admission policy, DeviceClass, ServiceMonitor and
// PrometheusRule of the render), the namespace, the scheduler name GPU
// pods go to, and how to check the install.
func TestChartNotes(t *testing.T) {
	named := map[string]bool{"Deployment": true, "DaemonSet": true, "MutatingWebhookConfiguration": true,
		"ValidatingAdmissionPolicy": true, "DeviceClass": true, "ServiceMonitor": true, "PrometheusRule": true}
	for set, values := range valueSets {
		t.Run(set, func(t *testing.T) {
			notes, docs := renderNotes(t, values)
			if strings.TrimSpace(notes) == "" {
				t.Fatal("NOTES.txt renders empty")
			}
			t.Log("\n" + notes)
			n := 0
			for key, u := range objects(t, docs) {
				if named[u.GetKind()] {
					n++
					if !strings.Contains(notes, u.GetName()) {
						t.Errorf("the notes do not name %s", key)
					}
				}
			}
			if n < 5 {
				t.Errorf("only %d objects of the kinds the notes name in the render", n)
			}
			for _, w := range []string{"tessera-system", "kubectl -n tessera-system get deployments,daemonsets", "TesseraPrerequisite", "docs/operations.md"} {
				if !strings.Contains(notes, w) {
					t.Errorf("the notes do not say %q", w)
				}
			}
		})
	}
}
