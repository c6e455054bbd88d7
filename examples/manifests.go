// Package examples holds example workloads: the Kubernetes manifests in
// this directory (`kubectl apply -f examples/` on a cluster or the
// emulated lab) and, under traces/, the default simulator trace.
package examples

import "embed"

// Manifests are the *.yaml files of this directory, which
// `tessera-lab demo` applies.
//
//go:embed *.yaml
var Manifests embed.FS
