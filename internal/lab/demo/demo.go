// Package demo is `tessera-lab demo` on a running lab: the examples
// applied and reported, then every mode's demo pods run, each showing
// what its mode enforces.
package demo

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/examples"
	"github.com/tessera-gpu/tessera/internal/lab/apply"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/status"
)

// Run is the demo on a lab that serves (the lab in d, its nodes): it
// applies the example workloads as kubectl would, waits until every pod
// runs or is pending with the scheduler's reason, prints the allocation
// table, the packing figures and what one shared container was given,
// then runs each mode's demo pods (gpu-fill) and prints what they saw and
// what the GPUs held.
func Run(ctx context.Context, d labdir.Dir, nodes []modes.NodeSpec, client kubernetes.Interface, out io.Writer) error {
	dir := d.Examples()
	if err := WriteExamples(dir); err != nil {
		return err
	}
	fmt.Fprintf(out, "\napplying examples/ (as kubectl apply -f examples/ would):\n")
	if err := apply.Dir(ctx, d.Kubeconfig(), dir, out); err != nil {
		return err
	}
	start := time.Now()
	if err := status.WaitSettled(ctx, client, metav1.NamespaceDefault, 2*time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nall pods running or pending with a reason after %.1fs\n\n", time.Since(start).Seconds())
	r, err := status.Collect(ctx, client)
	if err != nil {
		return err
	}
	if err := r.Print(out); err != nil {
		return err
	}
	c, err := d.ContainerOf("fractional-explicit", "infer")
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
	return runWorkloads(ctx, d, nodes, client, out)
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
