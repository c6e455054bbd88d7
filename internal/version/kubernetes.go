package version

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// kubernetesModule is the module of the control plane Tessera links (the
// emulated cluster's API server, controller manager and kubelets, and
// kube-scheduler in the scheduler).
const kubernetesModule = "k8s.io/kubernetes"

// Kubernetes is the version of k8s.io/kubernetes this binary was built
// with ("v1.36.3"), "" when the build does not say.
func Kubernetes() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range info.Deps {
		if d.Path == kubernetesModule {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}

// KubernetesLDFlags are the linker flags that make the Kubernetes
// components of a binary report v (e.g. "v1.36.3") as their version, as
// Kubernetes' own build sets them (k8s.io/component-base/version). Without
// them they report "v0.0.0-master+$Format:%H$", which kubectl cannot
// parse. The Makefile sets the same flags.
func KubernetesLDFlags(v string) ([]string, error) {
	var major, minor string
	if parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3); len(parts) == 3 && strings.HasPrefix(v, "v") {
		major, minor = parts[0], parts[1]
	} else {
		return nil, fmt.Errorf("Kubernetes version %q: want vMAJOR.MINOR.PATCH", v)
	}
	const pkg = "k8s.io/component-base/version."
	return []string{
		"-X", pkg + "gitVersion=" + v,
		"-X", pkg + "gitMajor=" + major,
		"-X", pkg + "gitMinor=" + minor,
		"-X", pkg + "gitTreeState=clean",
	}, nil
}
