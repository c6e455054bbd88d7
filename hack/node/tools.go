//go:build tools

// Package node pins the container runtime of make e2e's real node in a
// module of its own (as hack/tools pins helm), so its dependencies stay out
// of Tessera's go.mod: containerd 2.x (the daemon, its runc shim, ctr), runc
// and the CNI plugins the node's network uses (bridge, host-local,
// loopback, portmap). build.sh builds them.
package node

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
	_ "github.com/opencontainers/runc"
)
