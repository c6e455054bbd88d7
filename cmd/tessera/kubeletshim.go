package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// runKubeletShim serves the kubelet-facing end of the device plugin and
// forwards to the node agent's --plugin-socket (package kubeletshim).
func runKubeletShim(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("kubelet-shim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("resource-prefix", api.DefaultResourcePrefix, "prefix of the GPU resource names")
	pluginDir := fs.String("plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory")
	agent := fs.String("agent-socket", "/var/lib/tessera/plugin.sock", "the node agent's --plugin-socket")
	wait := fs.Duration("agent-wait", time.Minute, "how long a kubelet call waits for the node agent to be reachable")
	stale := fs.Duration("stale-after", 2*time.Minute, "report the GPUs unhealthy once the agent has been away this long (negative: never)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tessera kubelet-shim [flags]\n\nRegisters the GPU resource with the kubelet and forwards the device plugin API to the node agent, so that the kubelet's connection outlives agent restarts.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	names, err := api.NewResourceNames(*prefix)
	if err != nil {
		return fmt.Errorf("%w: --resource-prefix: %v", errUsage, err)
	}
	if *wait <= 0 {
		return fmt.Errorf("%w: --agent-wait %v must be positive", errUsage, *wait)
	}
	s, err := kubeletshim.New(kubeletshim.Options{
		Resource: names.GPU, PluginDir: *pluginDir, Endpoint: "tessera-shim-" + sanitizeResource(names.GPU) + ".sock",
		AgentSocket: *agent, AgentWait: *wait, StaleAfter: *stale,
	}, klog.Background().WithName("kubelet-shim"))
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

func sanitizeResource(r string) string {
	out := []byte(r)
	for i, c := range out {
		if c == '/' || c == '.' {
			out[i] = '-'
		}
	}
	return string(out)
}
