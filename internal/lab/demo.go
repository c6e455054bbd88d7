package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/examples"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
)

// Demo starts the lab, applies the example workloads with kubectl, waits
// until every pod runs or is pending with the scheduler's reason, prints
// the allocation table, the packing figures and what one shared
// container was given, then runs each mode's demo workloads (gpu-fill)
// and prints what they saw and what the GPUs held, and stops the lab.
func Demo(ctx context.Context, cfg Config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	var demoErr error
	err := Up(ctx, cfg, func(st *State, client kubernetes.Interface) {
		defer cancel()
		demoErr = runDemo(ctx, cfg, client, out)
	})
	if err != nil {
		return err
	}
	return demoErr
}

func runDemo(ctx context.Context, cfg Config, client kubernetes.Interface, out io.Writer) error {
	dir := cfg.Dir.path("examples")
	if err := WriteExamples(dir); err != nil {
		return err
	}
	fmt.Fprintf(out, "\napplying examples/ (as kubectl apply -f examples/ would):\n")
	if err := Apply(ctx, cfg.Dir.Kubeconfig(), dir, out); err != nil {
		return err
	}
	start := time.Now()
	if err := WaitSettled(ctx, client, metav1.NamespaceDefault, 2*time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nall pods running or pending with a reason after %.1fs\n\n", time.Since(start).Seconds())
	r, err := Collect(ctx, client)
	if err != nil {
		return err
	}
	if err := r.Print(out); err != nil {
		return err
	}
	c, err := ContainerOf(cfg.Dir, "fractional-explicit", "infer")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nwhat default/fractional-explicit's container infer got from the device plugin (and runs with):\n")
	keys := make([]string, 0, len(c.Env))
	for k := range c.Env {
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "NVIDIA_") || strings.HasPrefix(k, "TESSERA_") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "  env   %s=%s\n", k, c.Env[k])
	}
	for _, m := range c.Mounts {
		if !strings.HasPrefix(m.HostPath, "/var/lib/kubelet/") {
			fmt.Fprintf(out, "  mount %s -> %s\n", m.HostPath, m.ContainerPath)
		}
	}
	if r.Invariant != nil {
		return fmt.Errorf("invariant broken: %w", r.Invariant)
	}
	return runWorkloads(ctx, cfg.Dir, client, out)
}

// WriteExamples writes the example manifests into dir.
func WriteExamples(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return fs.WalkDir(examples.Manifests, ".", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := examples.Manifests.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, path), b, 0o644)
	})
}

// WaitSettled waits until the namespace's Deployments have all their
// replicas created and each pod runs, has finished, or is pending with
// the scheduler's reason.
func WaitSettled(ctx context.Context, client kubernetes.Interface, ns string, timeout time.Duration) error {
	var waiting []string
	err := waitUntil(ctx, timeout, func(ctx context.Context) (bool, error) {
		waiting = waiting[:0]
		deps, err := client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range deps.Items {
			if d.Spec.Replicas != nil && d.Status.Replicas < *d.Spec.Replicas {
				waiting = append(waiting, "deployment "+d.Name)
			}
		}
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if !settled(&p) {
				waiting = append(waiting, fmt.Sprintf("pod %s (%s)", p.Name, p.Status.Phase))
			}
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w: still waiting for %s", err, strings.Join(waiting, ", "))
	}
	return nil
}

func settled(p *corev1.Pod) bool {
	switch p.Status.Phase {
	case corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed:
		return true
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// ContainerOf reads what the fake runtime recorded for a container of a
// pod in the default namespace, on whichever node it ran.
func ContainerOf(d Dir, pod, container string) (*hollowkubelet.Container, error) {
	matches, err := filepath.Glob(filepath.Join(string(d), "nodes", "*", "containers", metav1.NamespaceDefault+"_"+pod+"_"+container+".json"))
	if err != nil || len(matches) == 0 {
		return nil, fmt.Errorf("no container %s of pod %s recorded in %s", container, pod, d)
	}
	return readContainer(matches[0])
}

// ContainerIn reads what node's fake runtime recorded for a container
// (the latest creation, after restarts).
func ContainerIn(d Dir, node, namespace, pod, container string) (*hollowkubelet.Container, error) {
	return readContainer(filepath.Join(d.Containers(node), namespace+"_"+pod+"_"+container+".json"))
}

func readContainer(path string) (*hollowkubelet.Container, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c hollowkubelet.Container
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}
