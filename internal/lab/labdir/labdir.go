// Package labdir is the layout of the emulated cluster's state directory:
// where each component finds its files and sockets, and where the lab's
// users find the kubeconfig, the logs and what each node's containers
// got. The lab writes lab.json here (package lab); docs/lab.md lists the
// layout.
package labdir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Dir is the lab's state directory.
type Dir string

// Default is $HOME/.tessera-lab (or a directory under the temporary
// directory when there is no home).
func Default() string {
	if home, err := os.UserHomeDir(); err == nil && home != "" && home != "/" {
		return filepath.Join(home, ".tessera-lab")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("tessera-lab-%d", os.Getuid()))
}

func (d Dir) path(p ...string) string { return filepath.Join(append([]string{string(d)}, p...)...) }

// Kubeconfig is the cluster-admin kubeconfig users and tools take.
func (d Dir) Kubeconfig() string { return d.path("kubeconfig") }

// SchedulerKubeconfig is the scheduler's kubeconfig (its ServiceAccount).
func (d Dir) SchedulerKubeconfig() string { return d.path("scheduler.kubeconfig") }

// NodeAgentKubeconfig is the node agents' kubeconfig (their
// ServiceAccount).
func (d Dir) NodeAgentKubeconfig() string { return d.path("node-agent.kubeconfig") }

// SchedulerConfig is the scheduler's configuration.
func (d Dir) SchedulerConfig() string { return d.path("scheduler.yaml") }

// AdmissionConfig configures the API server's admission plugins beside a
// real node (PodSecurity's defaults).
func (d Dir) AdmissionConfig() string { return d.path("admission.yaml") }

// StateFile describes the running lab (lab.json).
func (d Dir) StateFile() string { return d.path("lab.json") }

// Logs holds one log file per component (Log).
func (d Dir) Logs() string { return d.path("logs") }

// Log is the log file of a supervised component ("kubelet/lab-gpu-01" is
// logs/kubelet_lab-gpu-01.log).
func (d Dir) Log(component string) string {
	return d.path("logs", strings.ReplaceAll(component, "/", "_")+".log")
}

// Etcd holds etcd's data.
func (d Dir) Etcd() string { return d.path("etcd") }

// PKI holds the lab's credentials (package pki).
func (d Dir) PKI() string { return d.path("pki") }

// Examples is where the demo writes the example manifests it applies.
func (d Dir) Examples() string { return d.path("examples") }

// Node is an emulated node's directory (Node("*"): a filepath.Glob
// pattern of every node's).
func (d Dir) Node(name string) NodeDir { return NodeDir(d.path("nodes", name)) }

// MetricsURL is the /metrics URL of a running lab node's agent.
func (d Dir) MetricsURL(node string) (string, error) {
	b, err := os.ReadFile(d.Node(node).MetricsAddress())
	if err != nil {
		return "", fmt.Errorf("node %s: the agent's metrics address: %w", node, err)
	}
	return "http://" + strings.TrimSpace(string(b)) + "/metrics", nil
}

// NodeDir is one emulated node's directory.
type NodeDir string

func (n NodeDir) path(p ...string) string { return filepath.Join(append([]string{string(n)}, p...)...) }

// Kubelet is the kubelet's root directory, bind-mounted on
// /var/lib/kubelet in the kubelet's and the runtime's mount namespace.
func (n NodeDir) Kubelet() string { return n.path("kubelet") }

// DevicePlugins is the kubelet's device-plugin directory, as the node
// agent and the kubelet shim (outside the namespace) reach it.
func (n NodeDir) DevicePlugins() string { return n.path("kubelet", "device-plugins") }

// PodResources is the kubelet's pod-resources socket, as the node agent
// reaches it.
func (n NodeDir) PodResources() string { return n.path("kubelet", "pod-resources", "kubelet.sock") }

// CRISocket is where the node's container runtime serves the kubelet.
func (n NodeDir) CRISocket() string { return n.path("cri.sock") }

// Containers holds one record (hollowkubelet.Container) per container of
// the node's runtime.
func (n NodeDir) Containers() string { return n.path("containers") }

// ContainerRecord is the record of a container: the latest container of
// that name in that pod.
func (n NodeDir) ContainerRecord(namespace, pod, container string) string {
	return n.path("containers", namespace+"_"+pod+"_"+container+".json")
}

// Run holds a scratch directory per running container.
func (n NodeDir) Run() string { return n.path("run") }

// PodLogs holds the containers' logs.
func (n NodeDir) PodLogs() string { return n.path("pod-logs") }

// Tmp is the kubelet's TMPDIR.
func (n NodeDir) Tmp() string { return n.path("tmp") }

// PKI holds the kubelet's serving certificate.
func (n NodeDir) PKI() string { return n.path("pki") }

// GPUs holds the state file of each GPU and the driver socket
// (fakegpu.Node).
func (n NodeDir) GPUs() string { return n.path("gpus") }

// Limiter is the limiter library the node's agent mounts into containers.
func (n NodeDir) Limiter() string { return n.path("limiter", "libtessera-limiter.so") }

// Preload is the ld.so.preload file naming the limiter.
func (n NodeDir) Preload() string { return n.path("limiter", "ld.so.preload") }

// LimiterState holds one limiter state directory per container.
func (n NodeDir) LimiterState() string { return n.path("limiter-state") }

// Budgets holds the node agent's GPU budget files (memory no container
// is guaranteed, and who borrows it).
func (n NodeDir) Budgets() string { return n.path("burst") }

// MPS holds the MPS control daemons' directories.
func (n NodeDir) MPS() string { return n.path("mps") }

// AgentSockets is where the node's agent serves its kubelet shim, one
// socket per resource.
func (n NodeDir) AgentSockets() string { return n.path("agent") }

// MetricsAddress holds the address the node's agent serves metrics on.
func (n NodeDir) MetricsAddress() string { return n.path("metrics-address") }

// MIGDevices lists the MIG devices of the node's emulated GPUs as its
// agent last read them (JSON, by MIG device UUID): how the node's runtime
// finds a MIG device on a node that publishes no inventory (a volcano
// node).
func (n NodeDir) MIGDevices() string { return n.path("mig-devices.json") }

// CDI is where the node's DRA driver writes CDI specs and its runtime
// reads them (/var/run/cdi on a node).
func (n NodeDir) CDI() string { return n.path("cdi") }

// Claims holds the DRA driver's per-claim limiter files and checkpoint.
func (n NodeDir) Claims() string { return n.path("claims") }

// Cgroup is where the node's runtime mounts the cgroup v2 hierarchy, in
// its own mount namespace, when the host has it mounted nowhere.
func (n NodeDir) Cgroup() string { return n.path("cgroup") }

// Volumes holds the directories of the node's provisioned volumes.
func (n NodeDir) Volumes() string { return n.path("volumes") }
