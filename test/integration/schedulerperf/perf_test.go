//go:build integration

// Package schedulerperf runs Kubernetes' scheduler_perf harness with the
// Tessera plugin registered out of tree. See docs/benchmarks.md.
//
//	# small workloads (CI): 100 nodes, 400 pods per scheduler
//	go test -tags integration -count=1 -run '^$' -bench BenchmarkPerfScheduling -benchtime=1x \
//	    -perf-scheduling-label-filter=integration-test ./test/integration/schedulerperf/
//	# 5,000 nodes x 8 GPUs, 10,000 pods per scheduler
//	go test -tags integration -count=1 -run '^$' -bench BenchmarkPerfScheduling -benchtime=1x \
//	    -timeout=60m ./test/integration/schedulerperf/
//
// (RunIntegrationPerfScheduling takes no out-of-tree plugins, so the small
// workloads run through the benchmark entry point too.)
package schedulerperf

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestMain builds etcd 3.6 from the pinned module and puts it first in
// PATH: scheduler_perf starts an "etcd" binary from PATH for every workload
// (on a unix socket, which Debian's etcd 3.4 rejects).
func TestMain(m *testing.M) {
	if err := perf.InitTests(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "tessera-perf-etcd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := testenv.BuildEtcd(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	// Results go to a temporary directory unless -data-items-dir says
	// otherwise, never into the source tree.
	if f := flag.Lookup("data-items-dir"); f != nil && f.Value.String() == "" {
		_ = flag.Set("data-items-dir", dir)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func registry() frameworkruntime.Registry {
	return scheduler.Registry()
}

// BenchmarkPerfScheduling runs the performance workloads (label
// performance): stock whole-GPU pods and Tessera fractional pods on
// 5,000 nodes x 8 GPUs, and the DRA claims (dra_test.go) on 5,000 nodes
// x 8 GPUs.
func BenchmarkPerfScheduling(b *testing.B) {
	perf.RunBenchmarkPerfScheduling(b, "performance-config.yaml", "tessera", registry(), draOptions()...)
}

// TestPerfConfigMatchesDeploy keeps the benchmark's tessera-scheduler
// profile identical to the shipped one.
func TestPerfConfigMatchesDeploy(t *testing.T) {
	profile := func(path string) map[string]any {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Profiles []map[string]any `json:"profiles"`
		}
		if err := yaml.Unmarshal(data, &cfg); err != nil {
			t.Fatal(err)
		}
		for _, p := range cfg.Profiles {
			if p["schedulerName"] == api.SchedulerName {
				return p
			}
		}
		t.Fatalf("%s has no %s profile", path, api.SchedulerName)
		return nil
	}
	// The benchmark keeps the record signing key in kube-system:
	// scheduler_perf's API server has no tessera-system namespace.
	signingNamespace := func(p map[string]any) string {
		for _, pc := range p["pluginConfig"].([]any) {
			if pc := pc.(map[string]any); pc["name"] == "Tessera" {
				rs, _ := pc["args"].(map[string]any)["recordSigning"].(map[string]any)
				ns, _ := rs["namespace"].(string)
				delete(rs, "namespace")
				return ns
			}
		}
		return ""
	}
	deployed := profile(filepath.Join(testenv.RepoRoot(t), "deploy", "scheduler", "config.yaml"))
	perfProfile := profile("scheduler-config.yaml")
	if ns := signingNamespace(perfProfile); ns != "kube-system" {
		t.Errorf("scheduler-config.yaml keeps the record signing key in %q, want kube-system", ns)
	}
	signingNamespace(deployed)
	if !reflect.DeepEqual(deployed, perfProfile) {
		t.Errorf("scheduler-config.yaml's %s profile differs from deploy/scheduler/config.yaml", api.SchedulerName)
	}
}
