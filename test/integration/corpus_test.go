//go:build integration

package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// corpusDir holds the real-world GPU workloads (test/corpus/README.md).
const corpusDir = "../corpus"

// TestCorpus creates every workload of test/corpus through the API server
// with the webhook registered as shipped: each is admitted; a workload's
// template is converted as its pods are, and a pod made from it (as its
// controller makes them) is admitted too; every pod is given the share
// its file states (# share: name=value … on the pod's GPU container).
func TestCorpus(t *testing.T) {
	e := newEnv(t)
	e.addNodes("a100", 1, 8, "NVIDIA A100-SXM4-80GB", 81920)
	testenv.WaitFor(t, "webhook to see the inventories", 30*time.Second, func() bool {
		_, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name("probe80").Container("main", map[string]string{names.Memory: "81920"}).Obj())
		return err == nil
	})
	ctx := context.Background()
	const ns = "corpus"
	e.ensureNS(ns)
	files, err := filepath.Glob(filepath.Join(corpusDir, "*.yaml"))
	if err != nil || len(files) < 8 {
		t.Fatalf("corpus: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			share := corpusShare(t, string(raw))
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var tmpl *corev1.PodTemplateSpec
			switch o := obj.(type) {
			case *corev1.Pod:
				got, err := e.cp.Client.CoreV1().Pods(ns).Create(ctx, o, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				expectCorpusShare(t, got, share)
				return
			case *appsv1.Deployment:
				got, err := e.cp.Client.AppsV1().Deployments(ns).Create(ctx, o, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				tmpl = &got.Spec.Template
			case *batchv1.Job:
				got, err := e.cp.Client.BatchV1().Jobs(ns).Create(ctx, o, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				tmpl = &got.Spec.Template
			default:
				t.Fatalf("no case for %T", obj)
			}
			// The template as stored, made a pod as its controller makes it.
			pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
			pod.Namespace = ns
			pod.GenerateName = strings.TrimSuffix(filepath.Base(f), ".yaml") + "-"
			got, err := e.cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("its pod refused: %v", err)
			}
			expectCorpusShare(t, got, share)
		})
	}
}

// corpusShare reads a corpus file's "# share: gpu=1 gpumem-percentage=50"
// line (resource names under the default prefix).
func corpusShare(t *testing.T, text string) map[string]int64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, "# share:")
		if !ok {
			continue
		}
		out := map[string]int64{}
		for _, f := range strings.Fields(rest) {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("share %q: %v", f, err)
			}
			out["nvidia.com/"+k] = n
		}
		return out
	}
	t.Fatal("no # share: line")
	return nil
}

// expectCorpusShare: the pod was sent to Tessera's scheduler and its GPU
// container asks exactly share (and no other GPU resource), as equal
// requests and limits.
func expectCorpusShare(t *testing.T, p *corev1.Pod, share map[string]int64) {
	t.Helper()
	if p.Spec.SchedulerName != api.SchedulerName {
		t.Errorf("scheduler %q", p.Spec.SchedulerName)
	}
	found := false
	for _, c := range p.Spec.Containers {
		if _, ok := c.Resources.Limits[corev1.ResourceName(names.GPU)]; !ok {
			continue
		}
		found = true
		for _, n := range names.All() {
			l, hasL := c.Resources.Limits[corev1.ResourceName(n)]
			r := c.Resources.Requests[corev1.ResourceName(n)]
			want, wanted := share[n]
			switch {
			case wanted && (l.Value() != want || r.Value() != want):
				t.Errorf("%s: limit %s request %s, want %d", n, l.String(), r.String(), want)
			case !wanted && hasL:
				t.Errorf("%s set to %s", n, l.String())
			}
		}
	}
	if !found {
		t.Error("no GPU container")
	}
}
