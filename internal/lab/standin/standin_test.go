package standin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/tessera-gpu/tessera/internal/testenv"
)

// corpusContainers are the containers of test/corpus's workloads.
func corpusContainers(t *testing.T) []corev1.Container {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(t), "test", "corpus", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("corpus: %v %v", files, err)
	}
	var out []corev1.Container
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var spec corev1.PodSpec
		switch o := obj.(type) {
		case *corev1.Pod:
			spec = o.Spec
		case *appsv1.Deployment:
			spec = o.Spec.Template.Spec
		case *batchv1.Job:
			spec = o.Spec.Template.Spec
		default:
			t.Fatalf("%s: no case for %T", f, obj)
		}
		out = append(append(out, spec.InitContainers...), spec.Containers...)
	}
	return out
}

// TestEveryCorpusImageStoodIn: the table holds every image the corpus
// uses, and only those: no image the table names is unused.
func TestEveryCorpusImageStoodIn(t *testing.T) {
	var used []string
	for _, c := range corpusContainers(t) {
		if _, ok := Lookup(c.Image); !ok {
			t.Errorf("container %s: image %s has no stand-in", c.Name, c.Image)
		}
		used = append(used, c.Image)
	}
	for _, im := range Images {
		if !slices.Contains(used, im.Ref) {
			t.Errorf("%s is in the table but no corpus workload uses it", im.Ref)
		}
	}
}

func TestCommand(t *testing.T) {
	for _, c := range []struct {
		image string
		argv  []string
		env   map[string]string
		gpus  string
	}{
		{"vllm/vllm-openai:latest", []string{"/bin/sh", "-c", "vllm serve m --trust-remote-code"}, nil, "1"},
		{"vllm/vllm-openai:latest", []string{"/bin/sh", "-c", "vllm serve m --tensor-parallel-size 4"}, nil, "4"},
		{"nvcr.io/nvidia/nemo:25.02", []string{"torchrun", "--nproc_per_node=8", "/workspace/pretrain.py"}, nil, "8"},
		{"nvcr.io/nvidia/pytorch:24.12-py3", []string{"torchrun", "--nproc-per-node", "gpu", "train.py"}, nil, "0"},
		{"us-docker.pkg.dev/deeplearning-platform-release/gcr.io/huggingface-text-generation-inference-cu121.2-0.ubuntu2204:latest", nil, map[string]string{"NUM_SHARD": "1"}, "1"},
		{"rayproject/ray-ml:2.6.3-gpu", []string{"/bin/bash", "-lc", "--", "ulimit -n 65536; ray start --block --num-gpus=1 "}, nil, "1"},
		{"nvcr.io/nvidia/tritonserver:25.02-py3", []string{"tritonserver", "--model-repository=/models"}, nil, "0"},
	} {
		got, ok := Command("/t/gpu-fill", c.image, c.argv, c.env)
		if !ok || len(got) != 6 || got[0] != "/bin/sh" || got[3] != "/t/gpu-fill" || got[5] != c.gpus {
			t.Errorf("%s %v: %q, want gpu-fill on %s GPUs", c.image, c.argv, got, c.gpus)
			continue
		}
		if !strings.Contains(got[4], c.image) || !strings.Contains(got[4], strings.Join(c.argv, " ")) {
			t.Errorf("%s: the note %q does not say what it stands in for", c.image, got[4])
		}
	}
	// The examples' tags run as any other image.
	for _, ref := range []string{"nvcr.io/nvidia/tritonserver:24.08-py3", "nvcr.io/nvidia/pytorch:24.08-py3", "busybox"} {
		if _, ok := Command("/t/gpu-fill", ref, nil, nil); ok {
			t.Errorf("%s stood in for", ref)
		}
	}
}
