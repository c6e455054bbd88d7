//go:build integration

package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGolden runs every command of the plugin against a real kube-apiserver
// holding a fixed workload and compares its output with testdata/*.golden
// (go test -tags integration ./cmd/kubectl-tessera -update rewrites them).
//
// The workload: node gpu-a (2× A100 40 GB, shared, 4 shares) holds a
// 20 GiB/50% pod, a two-container pod and a whole GPU; gpu-b (1× A100,
// MPS) has an MPS client; gpu-c's only GPU is unhealthy; cpu-1 has no
// GPUs. ml/big asks 30000 MiB and fits nowhere; ml/small fits on gpu-b.
// Namespace dra holds DRA claims on two DRA nodes (draWorkload).
func TestGolden(t *testing.T) {
	ctx := context.Background()
	cp := testenv.StartControlPlane(t)
	c := cp.Client
	names := api.DefaultResourceNames

	a := fixtures.Inventory("gpu-a", 2, "NVIDIA A100-SXM4-40GB", 40960, 4)
	b := fixtures.Inventory("gpu-b", 1, "NVIDIA A100-SXM4-40GB", 40960, 4)
	b.GPUs[0].Sharing = api.SharingMPS
	cc := fixtures.Inventory("gpu-c", 1, "NVIDIA H100 80GB HBM3", 81559, 4)
	cc.GPUs[0].Health, cc.GPUs[0].HealthReason = api.Unhealthy, "XID 79"
	for name, inv := range map[string]*api.NodeInventory{"gpu-a": a, "gpu-b": b, "gpu-c": cc} {
		if _, err := c.CoreV1().Nodes().Create(ctx, fixtures.Node(name, inv, names), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"ml", "team"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ga0, ga1, gb0 := a.GPUs[0].UUID, a.GPUs[1].UUID, b.GPUs[0].UUID
	pods := []*corev1.Pod{
		fixtures.MakePod().Namespace("ml").Name("train").Node("gpu-a").
			GPUContainer("main", api.DeviceGrant{UUID: ga0, MemoryMiB: 20480, Cores: 50}).Obj(),
		fixtures.MakePod().Namespace("team").Name("two").Node("gpu-a").
			GPUContainer("a", api.DeviceGrant{UUID: ga0, MemoryMiB: 5120, Cores: 10}).
			GPUContainer("b", api.DeviceGrant{UUID: ga0, MemoryMiB: 5120, Cores: 10}).Obj(),
		fixtures.MakePod().Namespace("ml").Name("whole").Node("gpu-a").
			GPUContainer("main", api.DeviceGrant{UUID: ga1, MemoryMiB: 40960, Cores: 100, Exclusive: true}).Obj(),
		fixtures.MakePod().Namespace("team").Name("mps").Node("gpu-b").
			GPUContainer("client", api.DeviceGrant{UUID: gb0, MemoryMiB: 20480, Cores: 25}).Obj(),
		fixtures.MakePod().Namespace("ml").Name("big").SchedulerName(api.SchedulerName).
			Container("main", map[string]string{names.GPU: "1", names.Memory: "30000"}).Obj(),
		fixtures.MakePod().Namespace("ml").Name("small").SchedulerName(api.SchedulerName).
			Container("main", map[string]string{names.GPU: "1", names.Memory: "4096"}).Obj(),
		fixtures.MakePod().Namespace("ml").Name("web").Container("main", nil).Obj(),
	}
	for _, p := range pods {
		got, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			got.Status.Phase = corev1.PodRunning
			if _, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}

	draWorkload(ctx, t, c, names)

	kc := "--kubeconfig=" + cp.Kubeconfig
	cases := []struct {
		golden string
		args   []string
	}{
		{"nodes", []string{"nodes", kc}},
		{"nodes-wide", []string{"nodes", kc, "-o", "wide"}},
		{"nodes-json", []string{"nodes", kc, "-o", "json"}},
		{"pods-ml", []string{"pods", kc, "-n", "ml"}},
		{"pods-all-wide", []string{"pods", kc, "-A", "-o", "wide"}},
		{"pods-yaml", []string{"pods", kc, "-n", "team", "-o", "yaml"}},
		{"why-big", []string{"why", "big", kc, "-n", "ml"}},
		{"why-small", []string{"why", "small", kc, "-n", "ml"}},
		{"why-web", []string{"why", "web", kc, "-n", "ml"}},
		{"why-train-json", []string{"why", "train", kc, "-n", "ml", "-o", "json"}},
		{"pods-dra", []string{"pods", kc, "-n", "dra"}},
		{"pods-dra-wide", []string{"pods", kc, "-n", "dra", "-o", "wide"}},
		{"pods-dra-json", []string{"pods", kc, "-n", "dra", "-o", "json"}},
		{"why-dra-waiting", []string{"why", "waiting", kc, "-n", "dra"}},
		{"why-dra-waiting-yaml", []string{"why", "waiting", kc, "-n", "dra", "-o", "yaml"}},
		{"why-dra-lost", []string{"why", "lost", kc, "-n", "dra"}},
		{"why-dra-queued", []string{"why", "queued", kc, "-n", "dra"}},
	}
	for _, tc := range cases {
		t.Run(tc.golden, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := run(ctx, tc.args, &out, &errOut); err != nil {
				t.Fatalf("%v\n%s", err, errOut.String())
			}
			path := filepath.Join("testdata", tc.golden+".golden")
			if *update {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("kubectl-tessera %v differs from %s:\n--- got\n%s--- want\n%s", tc.args[:1], path, out.String(), want)
			}
		})
	}

	// Errors: an unknown pod, an unknown output format.
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"why", "nope", kc, "-n", "ml"}, &out, &errOut); err == nil {
		t.Error("why of a missing pod succeeded")
	}
	if err := run(ctx, []string{"nodes", kc, "-o", "jsonpath={.x}"}, &out, &errOut); err == nil {
		t.Error("-o jsonpath accepted")
	}
}

// run runs the plugin with args.
func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	cmd := newCommand(genericiooptions.IOStreams{Out: out, ErrOut: errOut})
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		return fmt.Errorf("kubectl-tessera %v: %w", args, err)
	}
	return nil
}
