package version

import (
	"slices"
	"strings"
	"testing"
)

func TestKubernetesLDFlags(t *testing.T) {
	flags, err := KubernetesLDFlags("v1.36.3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"k8s.io/component-base/version.gitVersion=v1.36.3", "k8s.io/component-base/version.gitMajor=1", "k8s.io/component-base/version.gitMinor=36"} {
		if !slices.Contains(flags, want) {
			t.Errorf("flags %v lack %s", flags, want)
		}
	}
	for _, bad := range []string{"", "1.36.3", "v1.36", "latest"} {
		if _, err := KubernetesLDFlags(bad); err == nil || !strings.Contains(err.Error(), "vMAJOR.MINOR.PATCH") {
			t.Errorf("KubernetesLDFlags(%q) = %v, want an error", bad, err)
		}
	}
}
