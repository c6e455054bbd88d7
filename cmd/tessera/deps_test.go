package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoControlPlaneInProductionBinary keeps the emulated cluster's
// dependencies (API server, controller manager, kubelet) out of the
// binary every Tessera image ships; they belong to tessera-lab.
func TestNoControlPlaneInProductionBinary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"k8s.io/kubernetes/cmd/kube-apiserver/",
		"k8s.io/kubernetes/cmd/kube-controller-manager/",
		"k8s.io/kubernetes/pkg/kubelet/",
		"k8s.io/kubernetes/pkg/kubemark",
		"github.com/tessera-gpu/tessera/internal/lab",
		"github.com/tessera-gpu/tessera/internal/hollowkubelet",
		"go.etcd.io/etcd/server/",
	}
	deps := strings.Split(string(out), "\n")
	if len(deps) < 50 {
		t.Fatalf("go list -deps printed only %d packages: %s", len(deps), out)
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) {
				t.Errorf("cmd/tessera depends on %s", d)
			}
		}
	}
}
