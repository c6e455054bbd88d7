package main

// What Tessera's binaries and core packages may link, checked with go list:
// each binary under cmd/ against rules of its own, the pure packages
// against the standard library and a few of their own module's, and every
// package of the module against importing a package above it.

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/tessera-gpu/tessera"

// pkg is one package go list reports.
type pkg struct {
	path     string
	imports  []string
	standard bool
}

// goList runs go list -f with a format of "|"-separated fields and returns
// each package's fields.
func goList(t *testing.T, args ...string) [][]string {
	t.Helper()
	args = append([]string{"list"}, args...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" {
			rows = append(rows, strings.Split(line, "|"))
		}
	}
	return rows
}

// deps lists the packages patterns link (go list -deps), with their imports.
func deps(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	var pkgs []pkg
	for _, f := range goList(t, append([]string{"-deps", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}|{{.Standard}}"}, patterns...)...) {
		if len(f) != 3 {
			t.Fatalf("go list printed %q", f)
		}
		p := pkg{path: f[0], standard: f[2] == "true"}
		if f[1] != "" {
			p.imports = strings.Split(f[1], ",")
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 2 {
		t.Fatalf("go list -deps %v printed only %v", patterns, pkgs)
	}
	return pkgs
}

func has(pkgs []pkg, path string) bool {
	return slices.ContainsFunc(pkgs, func(p pkg) bool { return p.path == path })
}

// under reports whether path is prefix or a package below it.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// linkRules is what one binary may link.
type linkRules struct {
	// why is what the binary is, for the failure messages.
	why string
	// deny: no package at or below one of these.
	deny []string
	// only, when set, is an allow-list: every package outside the
	// standard library must be at or below one of these.
	only []string
	// testing: the packages importing "testing" the binary may link (no
	// other may, nor Tessera's test harness).
	testing []string
}

// Dependencies no shipped binary takes: the emulated control plane
// (API server, controller manager, kubelet, etcd server), the lab, the
// simulator (its trace, its research baselines), NVML's mocks and
// Tessera's NVML test helpers.
var (
	controlPlane = []string{
		"k8s.io/kubernetes/cmd/kube-apiserver",
		"k8s.io/kubernetes/cmd/kube-controller-manager",
		"k8s.io/kubernetes/pkg/kubelet",
		"k8s.io/kubernetes/pkg/kubemark",
		"go.etcd.io/etcd/server",
		module + "/internal/lab",
		module + "/internal/hollowkubelet",
	}
	nvmlMocks = []string{
		"github.com/NVIDIA/go-nvml/pkg/nvml/mock",
		module + "/internal/nodeagent/nvmltest",
	}
)

// kubemarkTesting are the packages of upstream's hollow kubelet that
// import "testing" (kubemark links test/utils, the fake CRI runtime its
// apis/testing); tessera-lab runs a hollow kubelet, so it links them.
// Nothing else may.
var kubemarkTesting = []string{
	"k8s.io/kubernetes/test/utils",
	"k8s.io/cri-api/pkg/apis/testing",
}

// binaries are the rules of every main package under cmd/, by directory;
// a binary without an entry fails TestEveryBinaryLinksOnlyWhatItMay.
var binaries = map[string]linkRules{
	"tessera": {
		why: "the daemon every Tessera image ships (scheduler, webhook, node agent, kubelet shim)",
		// internal/lp stays: the shipped tessera policy prices shares
		// with its arc-flow LP (internal/policies/pricing.go).
		deny: slices.Concat(controlPlane, nvmlMocks, []string{module + "/internal/sim"}),
	},
	"kubectl-tessera": {
		why: "the kubectl plugin: the cluster's GPUs through the API server and the placement core",
		deny: []string{
			"k8s.io/kubernetes", // kube-scheduler, the kubelet, …: none of it
			"github.com/NVIDIA/go-nvml",
			"go.etcd.io",
			module + "/internal/scheduler",
			module + "/internal/nodeagent",
			module + "/internal/lab",
			module + "/internal/hollowkubelet",
			module + "/internal/sim",
			module + "/internal/policies",
			module + "/internal/lp",
		},
	},
	"tessera-lab": {
		why: "the emulated GPU cluster (a control plane, hollow kubelets, emulated NVML)",
		// The lab's NVML is internal/lab/nvmlemu; the test-only helpers
		// (nvmltest) and go-nvml's DGX fixtures are for tests.
		deny: []string{module + "/internal/sim", module + "/internal/nodeagent/nvmltest",
			"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100", "github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"},
		testing: kubemarkTesting,
	},
	"tessera-lab/init": {
		why:  "the lab containers' init process",
		only: []string{module + "/cmd/tessera-lab/init", module + "/internal/hollowkubelet/cinit", "golang.org/x/sys"},
	},
	"tessera-hook": {
		why: "the OCI hook the node agent injects into GPU containers: the runtime runs it on every start of one, so it starts in milliseconds",
		// NVML and the module's hook code; no Kubernetes, no metrics.
		only: []string{module + "/cmd/tessera-hook", module + "/internal/nodeagent/memlimits", module + "/internal/nodeagent/discovery",
			module + "/internal/cgroup2", module + "/internal/cli", module + "/internal/mig", module + "/pkg/api", "github.com/NVIDIA/go-nvml", "github.com/opencontainers/runtime-spec", "golang.org/x/sys"},
	},
	"tessera-sim": {
		why: "the research simulator: the placement core over a trace, no cluster",
		// No Kubernetes, no NVML, nothing outside the module.
		only: []string{module},
	},
}

// TestEveryBinaryLinksOnlyWhatItMay holds every main package under cmd/ to
// its rules (binaries): the daemon carries no control plane, lab,
// simulator or NVML mocks; kubectl-tessera no kube-scheduler; the
// simulator no Kubernetes; none links test code.
func TestEveryBinaryLinksOnlyWhatItMay(t *testing.T) {
	var mains []string
	for _, f := range goList(t, "-f", "{{.Name}}|{{.ImportPath}}", module+"/cmd/...") {
		if f[0] == "main" {
			mains = append(mains, strings.TrimPrefix(f[1], module+"/cmd/"))
		}
	}
	if !slices.Contains(mains, "tessera") || !slices.Contains(mains, "kubectl-tessera") {
		t.Fatalf("go list found the binaries %v under cmd/", mains)
	}
	for _, bin := range mains {
		t.Run(bin, func(t *testing.T) {
			rules, ok := binaries[bin]
			if !ok {
				t.Fatalf("cmd/%s has no entry in binaries (deps_test.go): say what it may link", bin)
			}
			for _, p := range deps(t, module+"/cmd/"+bin) {
				if reason := rules.violation(p); reason != "" {
					t.Errorf("cmd/%s (%s) links %s: %s", bin, rules.why, p.path, reason)
				}
			}
		})
	}
	for bin := range binaries {
		if !slices.Contains(mains, bin) {
			t.Errorf("binaries has an entry for cmd/%s, which is not a main package", bin)
		}
	}
}

// violation says why linking p breaks the rules, "" if it does not.
func (r linkRules) violation(p pkg) string {
	for _, d := range r.deny {
		if under(p.path, d) {
			return "denied (" + d + ")"
		}
	}
	if r.only != nil && !p.standard && !slices.ContainsFunc(r.only, func(o string) bool { return under(p.path, o) }) {
		return "not in its allow-list " + strings.Join(r.only, ", ")
	}
	if under(p.path, module+"/internal/testenv") {
		return "the test harness"
	}
	if slices.Contains(p.imports, "testing") && p.path != "testing" && !slices.Contains(r.testing, p.path) {
		return `it imports "testing"`
	}
	return ""
}

// The rules catch what they are for: a binary linking a denied or
// unlisted package, or test code.
func TestLinkRulesViolations(t *testing.T) {
	for _, c := range []struct {
		bin  string
		p    pkg
		want string
	}{
		{"kubectl-tessera", pkg{path: "k8s.io/kubernetes/pkg/scheduler"}, "denied"},
		{"tessera", pkg{path: module + "/internal/sim/baselines"}, "denied"},
		{"tessera", pkg{path: "github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"}, "denied"},
		{"tessera-sim", pkg{path: "k8s.io/api/core/v1"}, "allow-list"},
		{"tessera", pkg{path: "example.com/x", imports: []string{"testing"}}, "testing"},
		{"tessera-lab", pkg{path: module + "/internal/testenv/fixtures"}, "test harness"},
	} {
		if got := binaries[c.bin].violation(c.p); !strings.Contains(got, c.want) {
			t.Errorf("%s linking %s: %q, want a violation saying %q", c.bin, c.p.path, got, c.want)
		}
	}
	for _, c := range []struct {
		bin string
		p   pkg
	}{
		{"tessera", pkg{path: module + "/internal/lp"}},
		{"tessera-sim", pkg{path: "strings", standard: true}},
		{"tessera-lab", pkg{path: "k8s.io/kubernetes/test/utils", imports: []string{"testing"}}},
	} {
		if got := binaries[c.bin].violation(c.p); got != "" {
			t.Errorf("%s linking %s: %q, want no violation", c.bin, c.p.path, got)
		}
	}
}

// No package of the module imports one above it (a package whose path is
// a prefix of its own), in its code or its tests, with or without the
// integration tag: a parent composes its children, never the reverse.
func TestNoPackageImportsOneAboveIt(t *testing.T) {
	const format = "{{.ImportPath}}|{{join .Imports \",\"}},{{join .TestImports \",\"}},{{join .XTestImports \",\"}}"
	seen := 0
	for _, tags := range []string{"", "integration"} {
		for _, f := range goList(t, "-tags", tags, "-f", format, module+"/...") {
			seen++
			for _, imp := range strings.Split(f[1], ",") {
				if imp != "" && strings.HasPrefix(f[0], imp+"/") {
					t.Errorf("%s imports %s, a package above it (tags %q)", f[0], imp, tags)
				}
			}
		}
	}
	if seen < 50 {
		t.Fatalf("go list printed only %d packages", seen)
	}
}

// The node agent links neither the placement core (its search and
// policies) nor the scheduler side; what it needs of the core's rules is
// in the pure package gpushare, and it reads pods through kubeobj.
func TestNodeAgentLinksNoPlacementCore(t *testing.T) {
	forbidden := []string{
		module + "/internal/placement",
		module + "/internal/policies",
		module + "/internal/sim",
		module + "/internal/podrequest",
		module + "/internal/scheduler",
	}
	pkgs := deps(t, module+"/internal/nodeagent/...")
	if !has(pkgs, module+"/internal/nodeagent/deviceplugin") || !has(pkgs, module+"/internal/kubeobj") {
		t.Fatalf("go list -deps of the node agent lacks its own packages: %v", pkgs)
	}
	for _, p := range pkgs {
		if slices.Contains(forbidden, p.path) {
			t.Errorf("the node agent links %s", p.path)
		}
	}
}

// The pure packages link the standard library and the listed packages of
// the module, nothing else (no Kubernetes, no NVML), so anything may link
// them: gpushare, the placement core, its policies and the simulator's
// baselines. kubeobj reads Kubernetes objects and links no Tessera package
// but pkg/api.
func TestPurePackages(t *testing.T) {
	core := []string{module + "/pkg/api", module + "/internal/gpushare", module + "/internal/mig", module + "/internal/placement"}
	for pure, allowed := range map[string][]string{
		"internal/gpushare":      {module + "/pkg/api"},
		"internal/placement":     core,
		"internal/policies":      append(core, module+"/internal/lp"),
		"internal/sim/baselines": append(core, module+"/internal/lp", module+"/internal/policies"),
	} {
		for _, p := range deps(t, module+"/"+pure) {
			if !p.standard && p.path != module+"/"+pure && !slices.Contains(allowed, p.path) {
				t.Errorf("%s links %s", pure, p.path)
			}
		}
	}
	for _, p := range deps(t, module+"/internal/kubeobj") {
		if strings.HasPrefix(p.path, module+"/") && p.path != module+"/internal/kubeobj" && p.path != module+"/pkg/api" {
			t.Errorf("kubeobj links %s", p.path)
		}
	}
}
