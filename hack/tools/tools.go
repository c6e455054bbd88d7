//go:build tools

// Package tools pins the versions of the command-line tools Tessera's
// tests and CI build from the Go module proxy (helm), in a module of
// their own so their dependencies do not touch the main go.mod.
//
//	go build -o bin/helm helm.sh/helm/v3/cmd/helm   (from this directory)
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
