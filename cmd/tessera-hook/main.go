// Command tessera-hook is the OCI hook the node agent injects into GPU
// containers through their CDI edits; the container runtime runs it on
// the host, on every start of such a container, so it is a small binary
// of its own (it starts in a few milliseconds; deps_test.go holds it to
// that). Its one command:
//
//	tessera-hook memory-limits --confirm FILE --gpu UUID=SOFT:HARD...
//	tessera-hook memory-limits --release --confirm FILE
//
// sets (or clears) the driver's GPU memory limits of the container's own
// cgroup v2 group (internal/nodeagent/memlimits).
package main

import (
	"fmt"
	"os"

	"github.com/tessera-gpu/tessera/internal/cli"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
)

func main() {
	args := os.Args[1:]
	if len(args) == 0 || args[0] != "memory-limits" {
		fmt.Fprintln(os.Stderr, "Usage: tessera-hook memory-limits [flags] (tessera-hook memory-limits -h for the flags)")
		os.Exit(2)
	}
	err := memlimits.HookCommand(args[1:], discovery.Open, os.Stdin, os.Stderr)
	os.Exit(cli.ExitCode(os.Stderr, "tessera-hook", "memory-limits", err))
}
