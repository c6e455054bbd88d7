package lab

import (
	"fmt"
	"os"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/lab/component"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
)

// startNode prepares an emulated node's directory (the limiter installed
// as the agent's DaemonSet would, the GPUs' state files before its agent
// reads them) and starts its components: the container runtime, the
// hollow kubelet on port (each in a mount namespace of its own), the
// kubelet shim, and the node agent under the agents' identity
// (agentKubeconfig), serving the shim.
func startNode(sup *supervisor.Supervisor, d labdir.Dir, t tools.Dir, n modes.NodeSpec, agentKubeconfig string, port int) error {
	dir := d.Node(n.Name)
	for _, p := range []string{dir.Tmp(), dir.DevicePlugins(), dir.AgentSockets()} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	if err := t.InstallLimiter(dir.Limiter()); err != nil {
		return fmt.Errorf("installing the limiter: %w", err)
	}
	if err := component.CreateGPUs(dir, n.Name, n.Model, n.GPUs, n.Partitioning); err != nil {
		return err
	}
	f := component.NodeFlags{
		Kubeconfig: d.Kubeconfig(), Node: n.Name, Mode: n.Mode, Dir: dir, Lab: d, Model: n.Model, GPUs: n.GPUs,
		Labels: n.Labels, Taints: n.Taints, ConfigMap: install.Namespace + "/" + modes.NodeConfigMap,
		Partitioning: n.Partitioning,
	}
	runtime := f
	runtime.Tools = t
	if err := sup.Start(component.Runtime+"/"+n.Name, runtime.Args(component.Runtime), nil, true); err != nil {
		return err
	}
	kubelet := f
	kubelet.Port = port
	if err := sup.Start(component.Kubelet+"/"+n.Name, kubelet.Args(component.Kubelet), []string{"TMPDIR=" + dir.Tmp()}, true); err != nil {
		return err
	}
	if err := sup.Start(component.KubeletShim+"/"+n.Name, component.ShimArgs(dir), nil, false); err != nil {
		return err
	}
	agent := f
	agent.Kubeconfig, agent.Shim = agentKubeconfig, true
	return sup.Start(component.NodeAgent+"/"+n.Name, agent.Args(component.NodeAgent), nil, false)
}
