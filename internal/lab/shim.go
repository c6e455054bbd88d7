package lab

// The node agents' trust settings in the lab, and the kubelet-facing shim
// each node runs in front of its agent (package kubeletshim).

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/nodeagent"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/internal/recordsig"
)

// agentSockets is where a node's agent serves its shim, one socket per
// resource.
func agentSockets(nodeDir string) string { return filepath.Join(nodeDir, "agent") }

// trustOptions sets what a lab node agent checks: the scheduler's
// signatures, and (with --shim) serving the shim instead of the kubelet.
// The host-side reconciler is off until the lab's GPUs report processes
// (the mock NVML lists none).
func trustOptions(o *nodeagent.Options, f *nodeFlags) {
	o.RecordKeys = &recordsig.Store{}
	o.Reconcile.Interval = 0
	if f.shim {
		o.PluginSocketDir = agentSockets(f.dir)
	}
}

// startShim starts the node's kubelet shim under the supervisor.
func startShim(sup *supervisor, comp func(string, ...string) []string, d Dir, node string) error {
	dir := d.Node(node)
	if err := os.MkdirAll(filepath.Join(dir, "kubelet", "device-plugins"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(agentSockets(dir), 0o755); err != nil {
		return err
	}
	return sup.start("kubelet-shim/"+node, comp("kubelet-shim", "--dir="+dir), nil, false)
}

func runKubeletShim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kubelet-shim", flag.ContinueOnError)
	dir := fs.String("dir", "", "the node's directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("kubelet-shim: --dir is required")
	}
	return kubeletshim.NewManager(kubeletshim.ManagerOptions{
		PluginDir: filepath.Join(*dir, "kubelet", "device-plugins"), AgentSocketDir: agentSockets(*dir), AgentWait: time.Minute,
	}, klog.Background().WithName("kubelet-shim")).Run(ctx)
}
