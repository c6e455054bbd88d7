//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/lab/volumes"
	"github.com/tessera-gpu/tessera/internal/testenv"
)

// corpusDir is test/corpus, as an absolute path: the tests' kubectl runs
// in the repository's root.
func corpusDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(testenv.RepoRoot(t), "test", "corpus")
}

// tgiNode carries the label TGI's manifest selects nodes by (a GKE node
// pool of L4 GPUs), for the length of TestCorpusOnTheLab.
const tgiNode = "lab-gpu-03"

// cleanWorkloads deletes, when the test ends, the namespace's workload
// controllers (before useNamespace deletes their pods, which they would
// make again) and its claims, and waits until their volumes are deleted
// with their directories.
func cleanWorkloads(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() {
		bg := metav1.DeletePropagationBackground
		opts := metav1.DeleteOptions{PropagationPolicy: &bg}
		for _, err := range []error{
			client.AppsV1().Deployments(ns).DeleteCollection(ctx, opts, metav1.ListOptions{}),
			client.BatchV1().Jobs(ns).DeleteCollection(ctx, opts, metav1.ListOptions{}),
		} {
			if err != nil {
				t.Errorf("deleting the workloads of %s: %v", ns, err)
			}
		}
		testenv.WaitFor(t, "the workloads of "+ns+" deleted", time.Minute, func() bool {
			d, err1 := client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
			j, err2 := client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
			return err1 == nil && err2 == nil && len(d.Items) == 0 && len(j.Items) == 0
		})
		zero := int64(0)
		if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the pods of %s: %v", ns, err)
		}
		claims, err := client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Errorf("listing the claims of %s: %v", ns, err)
			return
		}
		if err := client.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the claims of %s: %v", ns, err)
		}
		// Released, each volume goes with its directory.
		testenv.WaitFor(t, "the volumes of "+ns+"'s claims deleted", 2*time.Minute, func() bool {
			for _, c := range claims.Items {
				if _, err := client.CoreV1().PersistentVolumes().Get(ctx, volumes.VolumeName(&c), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return false
				}
			}
			return true
		})
		for _, c := range claims.Items {
			if node := c.Annotations["volume.kubernetes.io/selected-node"]; node != "" {
				if _, err := os.Stat(filepath.Join(dir.Node(node).Volumes(), volumes.VolumeName(&c))); !os.IsNotExist(err) {
					t.Errorf("the directory of claim %s's volume is left: %v", c.Name, err)
				}
			}
		}
	})
}

var (
	gpuLineRE   = regexp.MustCompile(`gpu-fill: GPU (\d+) `)
	moreRefused = "1 MiB more: CUDA_ERROR_OUT_OF_MEMORY"
)

// refusedAtLimits checks a stand-in's log: on each of the container's
// GPUs (in order), cuMemGetInfo's total is the container's limit on it
// (limits, MiB), the GPU was filled until the driver refused, and one MiB
// more was refused.
func refusedAtLimits(t *testing.T, who, log string, limits []int64) {
	t.Helper()
	parts := gpuLineRE.Split(log, -1)[1:]
	if len(parts) != len(limits) {
		t.Errorf("%s: gpu-fill filled %d GPUs, want %d:\n%s", who, len(parts), len(limits), log)
		return
	}
	for i, part := range parts {
		m := totalRE.FindStringSubmatch(part)
		if m == nil || m[1] != strconv.FormatInt(limits[i], 10) {
			t.Errorf("%s: GPU %d shows %v as its memory, want total %d MiB", who, i, m, limits[i])
		}
		if !strings.Contains(part, "refused at") || !strings.Contains(part, moreRefused) {
			t.Errorf("%s: GPU %d was not refused at its limit:\n%s", who, i, part)
		}
	}
}

// TestCorpusOnTheLab is the acceptance of the real-world workloads of
// test/corpus (the GPU guides' 8-GPU affinity pod, vLLM, Triton, TGI, a
// PyTorchJob's worker, a KubeRay GPU worker, a Jupyter notebook, a NeMo
// training Job), applied as a user would with what their sources create
// beside them (test/corpus/README.md): every one admitted, bound and
// started; the claims bound to volumes of the lab's provisioner; each
// container given its record's share with the read-only preload list and
// limits file (whole GPUs without them), and the stand-in for its image
// refused at exactly its limit on each of its GPUs; the physical check
// finds no memory held without a valid grant.
func TestCorpusOnTheLab(t *testing.T) {
	ctx := context.Background()
	const ns = "corpus"
	useNamespace(t, ns)
	cleanWorkloads(t, ns)
	for name, data := range map[string]map[string]string{
		"hf-token-secret":     {"token": "hf_lab"},
		"hf-secret":           {"hf_token": "hf_lab"},
		"jupyter-alice-token": {"token": "lab"},
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: data}
		if _, err := client.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	corpus := corpusDir(t)
	kubectl(t, "apply", "-n", ns, "-f", filepath.Join(corpus, "volumes"))
	kubectl(t, "label", "node", tgiNode, "cloud.google.com/gke-accelerator=nvidia-l4", "--overwrite")
	t.Cleanup(func() { kubectl(t, "label", "node", tgiNode, "cloud.google.com/gke-accelerator-") })

	files, err := filepath.Glob(filepath.Join(corpus, "*.yaml"))
	if err != nil || len(files) < 8 {
		t.Fatalf("corpus: %v %v", files, err)
	}
	// The guides' pod first: it may only run on the H100 node, which the
	// NeMo Job's 8 whole GPUs would fit too.
	slices.SortStableFunc(files, func(a, b string) int {
		ga, gb := strings.Contains(a, "guide-8gpu"), strings.Contains(b, "guide-8gpu")
		switch {
		case ga && !gb:
			return -1
		case gb && !ga:
			return 1
		}
		return 0
	})
	start := time.Now()
	for i, f := range files {
		kubectl(t, "apply", "-n", ns, "-f", f)
		if i == 0 {
			waitPod(t, ns, "train-8gpu", 2*time.Minute, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
		}
	}
	// Each workload is one pod: a Deployment of one replica, a Job of
	// one, a pod.
	var pods []corev1.Pod
	testenv.WaitFor(t, "the corpus's 8 pods running", 4*time.Minute, func() bool {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		pods = l.Items
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		return running == len(files) && len(pods) == len(files)
	})
	t.Logf("the corpus's %d workloads admitted, bound and running in %v", len(files), time.Since(start).Round(100*time.Millisecond))

	for i := range pods {
		p := &pods[i]
		rec := record(t, p)
		for _, c := range rec.Containers {
			got := checkContainer(t, p, c)
			if got == nil {
				continue
			}
			if !got.StandIn {
				t.Errorf("%s/%s: image %s ran %v, not the stand-in", p.Name, c.Name, got.Image, got.Command)
			}
			var limits []int64
			for _, d := range c.Devices {
				limits = append(limits, d.MemoryMiB) // a whole GPU's record holds all of its memory
			}
			log := logsContain(t, ns, p.Name, "holding")
			if !strings.Contains(log, "is not pulled; gpu-fill stands in for") {
				t.Errorf("%s: no stand-in line in its log:\n%s", p.Name, log)
			}
			refusedAtLimits(t, fmt.Sprintf("%s (%s, on %s)", p.Name, got.Image, p.Spec.NodeName), log, limits)
		}
		if p.Name == "train-8gpu" {
			if n, err := client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{}); err != nil || n.Labels["nvidia.com/gpu.product"] != "NVIDIA-H100-80GB-HBM3" {
				t.Errorf("the guides' pod runs on %s (%v): want the H100 node its affinity names", p.Spec.NodeName, err)
			}
		}
		if strings.HasPrefix(p.Name, "tgi-deployment-") && p.Spec.NodeName != tgiNode {
			t.Errorf("TGI runs on %s, its nodeSelector names %s's label", p.Spec.NodeName, tgiNode)
		}
	}
	// The claims: bound to volumes the lab's provisioner made on their
	// pods' nodes.
	claims, err := client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(claims.Items) != 2 {
		t.Fatalf("claims %v, %v", claims, err)
	}
	for _, c := range claims.Items {
		if c.Status.Phase != corev1.ClaimBound {
			t.Errorf("claim %s is %s", c.Name, c.Status.Phase)
			continue
		}
		pv, err := client.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node := c.Annotations["volume.kubernetes.io/selected-node"]
		if pv.Annotations["pv.kubernetes.io/provisioned-by"] != volumes.Provisioner || pv.Spec.HostPath == nil ||
			!strings.HasPrefix(pv.Spec.HostPath.Path, dir.Node(node).Volumes()) {
			t.Errorf("claim %s: volume %s %+v", c.Name, pv.Name, pv.Spec.PersistentVolumeSource)
		}
	}
	ph := checkPhysical(t)
	if err := ph.Err(); err != nil {
		t.Errorf("physical check: %v", err)
	}
	if ph.Processes == 0 {
		t.Error("the physical check saw no GPU process")
	}
}

// TestFormerlyRefusedVariablesAdmitted is the runtime half of the env
// tests that flipped: a share whose pod sets the variables the webhook
// refused before (the limiter's own limits, CUDA_DEVICE_ORDER,
// CUDA_DEVICE_MAX_CONNECTIONS, CUDA_VISIBLE_DEVICES, LD_PRELOAD of an
// allocator that replaces malloc) is admitted, the preloaded library
// loads and serves the process, and gpu-fill is refused at exactly the
// granted 4096 MiB, not at what the variables say.
func TestFormerlyRefusedVariablesAdmitted(t *testing.T) {
	ctx := context.Background()
	const ns = "env-admitted"
	tenant := tenantClient(t, ns)
	lib := t.TempDir()
	if err := testenv.Make("limiter", "B="+lib, lib+"/libtest-malloc.so"); err != nil {
		t.Fatal(err)
	}
	hostDir := corev1.HostPathDirectory
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "overrides", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: new(int64),
			Volumes: []corev1.Volume{{Name: "allocator", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: lib, Type: &hostDir}}}},
			Containers: []corev1.Container{{
				Name: "main", Image: "tessera-lab/cuda",
				Command: []string{"sh", "-c", "gpu-fill && echo served=$(cat /tmp/served)"},
				Env: []corev1.EnvVar{
					{Name: "CUDA_DEVICE_MEMORY_LIMIT", Value: "40960m"}, {Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "0"},
					{Name: "CUDA_DEVICE_MEMORY_LIMIT_", Value: "1m"}, {Name: "CUDA_DEVICE_SM_LIMIT", Value: "100"},
					{Name: "CUDA_DEVICE_ORDER", Value: "PCI_BUS_ID"}, {Name: "CUDA_DEVICE_MAX_CONNECTIONS", Value: "1"},
					{Name: "CUDA_VISIBLE_DEVICES", Value: "0"},
					{Name: "LD_PRELOAD", Value: "/opt/allocator/libtest-malloc.so"}, {Name: "TEST_MALLOC_MARK", Value: "/tmp/served"},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "allocator", MountPath: "/opt/allocator", ReadOnly: true}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceName(names.GPU): resource.MustParse("0.1"),
				}},
			}},
		},
	}
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("refused: %v", err)
	}
	got := waitPod(t, ns, "overrides", 2*time.Minute, phase(corev1.PodSucceeded, corev1.PodFailed))
	log := logsContain(t, ns, "overrides", "1 MiB more")
	t.Logf("kubectl logs overrides:\n%s", log)
	if got.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s: %s", got.Status.Phase, got.Status.Message)
	}
	rec := record(t, got)
	if d := rec.Containers[0].Devices; len(d) != 1 || d[0].MemoryMiB != 4096 || d[0].Cores != 10 {
		t.Fatalf("record %+v, want 4096 MiB and 10 %% of one A100-40GB", rec.Containers)
	}
	checkContainer(t, got, rec.Containers[0])
	refusedAt := regexp.MustCompile(`served=(\d+)`).FindStringSubmatch(log)
	if refusedAt == nil || refusedAt[1] == "0" {
		t.Errorf("the preloaded allocator did not serve the process: %v", refusedAt)
	}
	refusedAtLimits(t, "overrides", log, []int64{4096})
}
