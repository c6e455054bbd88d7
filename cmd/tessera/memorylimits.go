package main

import (
	"context"
	"io"
	"os"

	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
)

// runMemoryLimits is the createContainer hook the node agent injects into
// GPU containers where the driver partitions GPU memory per cgroup
// (memlimits.HookCommand): the container runtime runs it on the host.
func runMemoryLimits(_ context.Context, args []string, _, stderr io.Writer) error {
	return memlimits.HookCommand(args, discovery.Open, os.Stdin, stderr)
}
