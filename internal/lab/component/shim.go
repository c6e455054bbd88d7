package component

// The kubelet-facing shim each node runs in front of its agent (package
// kubeletshim).

import (
	"context"
	"flag"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
)

// ShimArgs runs the node's kubelet shim.
func ShimArgs(n labdir.NodeDir) []string { return Args(KubeletShim, "--dir="+string(n)) }

func runKubeletShim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(KubeletShim, flag.ContinueOnError)
	dir := fs.String("dir", "", "the node's directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("kubelet-shim: --dir is required")
	}
	n := labdir.NodeDir(*dir)
	return kubeletshim.NewManager(kubeletshim.ManagerOptions{
		PluginDir: n.DevicePlugins(), AgentSocketDir: n.AgentSockets(), AgentWait: time.Minute,
	}, klog.Background().WithName("kubelet-shim")).Run(ctx)
}
