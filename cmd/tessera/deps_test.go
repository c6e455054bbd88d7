package main

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

// deps lists the packages patterns link (go list -deps), with their imports.
func deps(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}|{{.Standard}}"}, patterns...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list printed %q", line)
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

// TestNoControlPlaneInProductionBinary keeps the emulated cluster's
// dependencies (API server, controller manager, kubelet) out of the
// binary every Tessera image ships; they belong to tessera-lab.
func TestNoControlPlaneInProductionBinary(t *testing.T) {
	forbidden := []string{
		"k8s.io/kubernetes/cmd/kube-apiserver/",
		"k8s.io/kubernetes/cmd/kube-controller-manager/",
		"k8s.io/kubernetes/pkg/kubelet/",
		"k8s.io/kubernetes/pkg/kubemark",
		module + "/internal/lab",
		module + "/internal/hollowkubelet",
		"go.etcd.io/etcd/server/",
	}
	pkgs := deps(t, ".")
	if len(pkgs) < 50 {
		t.Fatalf("go list -deps printed only %d packages", len(pkgs))
	}
	for _, d := range pkgs {
		for _, f := range forbidden {
			if strings.HasPrefix(d.path, f) {
				t.Errorf("cmd/tessera depends on %s", d.path)
			}
		}
	}
}

// kubemarkTesting are the packages of upstream's hollow kubelet that
// import "testing" (kubemark links test/utils, the fake CRI runtime its
// apis/testing); tessera-lab runs a hollow kubelet, so it links them.
// Nothing else may.
var kubemarkTesting = []string{
	"k8s.io/kubernetes/test/utils",
	"k8s.io/cri-api/pkg/apis/testing",
}

// Shipped code does not depend on test code: neither binary links a
// package that imports "testing" (tessera-lab: but the hollow kubelet's
// own, above), nor Tessera's test harness.
func TestShippedBinariesLinkNoTestCode(t *testing.T) {
	for _, bin := range []string{".", "../tessera-lab"} {
		pkgs := deps(t, bin)
		for _, p := range pkgs {
			if strings.HasPrefix(p.path, module+"/internal/testenv") {
				t.Errorf("%s links the test harness %s", bin, p.path)
			}
			if !slices.Contains(p.imports, "testing") || p.path == "testing" {
				continue
			}
			if bin != "." && slices.Contains(kubemarkTesting, p.path) {
				continue
			}
			t.Errorf("%s links %s, which imports \"testing\"", bin, p.path)
		}
	}
}

// The node agent links neither the placement core (its search and
// policies) nor the scheduler side; what it needs of the core's rules is
// in the pure package gpushare, and it reads pods through kubeobj.
func TestNodeAgentLinksNoPlacementCore(t *testing.T) {
	forbidden := []string{
		module + "/internal/placement",
		module + "/internal/placement/policies",
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

// gpushare is pure: the standard library and pkg/api, nothing else, so
// anything may link it. kubeobj reads Kubernetes objects and links no
// Tessera package but pkg/api.
func TestPurePackages(t *testing.T) {
	for _, p := range deps(t, module+"/internal/gpushare") {
		if !p.standard && p.path != module+"/internal/gpushare" && p.path != module+"/pkg/api" {
			t.Errorf("gpushare links %s", p.path)
		}
	}
	for _, p := range deps(t, module+"/internal/kubeobj") {
		if strings.HasPrefix(p.path, module+"/") && p.path != module+"/internal/kubeobj" && p.path != module+"/pkg/api" {
			t.Errorf("kubeobj links %s", p.path)
		}
	}
}
