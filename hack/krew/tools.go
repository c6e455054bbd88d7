//go:build tools

// Package krew pins krew, the kubectl plugin manager, in a module of its
// own (its Kubernetes libraries are older than Tessera's and helm's): the
// release test installs kubectl-tessera with it from the release's krew
// manifest and archive (hack/release-plugin-test.sh).
//
//	go build -o krew sigs.k8s.io/krew/cmd/krew   (from this directory)
package krew

import (
	_ "sigs.k8s.io/krew/cmd/krew"
)
