//go:build tools

// Package volcano pins the release of Volcano (volcano.sh/volcano) that
// Tessera's lab runs and its tests drive (docs/volcano.md): its scheduler
// and controller manager, built from the Go module proxy in a module of
// their own, since Volcano carries its own Kubernetes version and replace
// block. build.sh builds them and copies the release's CRDs beside them.
//
// The replace block is Volcano's own (its go.mod at the tag), but for
// volcano.sh/apis: Volcano's go.mod points it at a directory of its
// repository (staging/src/volcano.sh/apis) that the module does not
// contain; volcano.sh/apis v1.14.0 is the published module of that
// directory's content at v1.14.1 (identical files).
package volcano

import (
	_ "volcano.sh/volcano/cmd/controller-manager"
	_ "volcano.sh/volcano/cmd/scheduler"
)
