package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
)

// runKubeletShim serves the kubelet-facing end of the node agent's device
// plugins and forwards to the agent's --plugin-socket-dir (package
// kubeletshim).
func runKubeletShim(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("kubelet-shim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pluginDir := fs.String("plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory")
	agent := fs.String("agent-socket-dir", "/var/lib/tessera/plugins", "the node agent's --plugin-socket-dir")
	wait := fs.Duration("agent-wait", time.Minute, "how long a kubelet call waits for the node agent to be reachable")
	stale := fs.Duration("stale-after", 2*time.Minute, "report a resource's devices unhealthy once the agent has not served it for this long (negative: never)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tessera kubelet-shim [flags]\n\nRegisters the node agent's GPU resources with the kubelet and forwards the device plugin API to the agent, so that the kubelet's connection outlives agent restarts.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *wait <= 0 {
		return fmt.Errorf("%w: --agent-wait %v must be positive", errUsage, *wait)
	}
	return kubeletshim.NewManager(kubeletshim.ManagerOptions{
		PluginDir: *pluginDir, AgentSocketDir: *agent, AgentWait: *wait, StaleAfter: *stale,
	}, klog.Background().WithName("kubelet-shim")).Run(ctx)
}
