// Package component runs one of the emulated cluster's components in the
// process the supervisor starts for it, `tessera-lab component NAME
// [flags]`: the real kube-apiserver and controller manager, Tessera's
// scheduler and webhook, and per node its container runtime, hollow
// kubelet, kubelet shim and node agent (over the emulated NVML), the MPS
// control daemon's stand-in, and the volume provisioner. The flags each
// takes are built here too
// (Args, NodeFlags), so the lab that starts a component and the component
// read one command line.
package component

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/tessera-gpu/tessera/internal/scheduler"
)

// Command is the hidden subcommand under which the supervisor starts each
// component: tessera-lab component <name> [flags].
const Command = "component"

// The components.
const (
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "scheduler"
	Webhook           = "webhook"
	// KubeScheduler is the stock kube-scheduler, which places pods beside
	// a real node when Tessera is installed by its chart (StartControlPlane).
	KubeScheduler = "kube-scheduler"
	// VolumeProvisioner provisions the lab's PersistentVolumes (package
	// volumes).
	VolumeProvisioner = "volume-provisioner"
	// Per node:
	Runtime     = "runtime"
	Kubelet     = "kubelet"
	KubeletShim = "kubelet-shim"
	NodeAgent   = "node-agent"
	// MPSControl is the lab's stand-in for nvidia-cuda-mps-control
	// (mpsfake), run as `tessera-lab component mps-control [-d|-f]`; the
	// node agents whose profile is MPS start it.
	MPSControl = "mps-control"
	// MemoryLimits is the lab's `tessera memory-limits` (the
	// createContainer hook the node agents of nodes whose driver
	// partitions memory inject), over the node's emulated NVML.
	MemoryLimits = "memory-limits"
)

// Args is the command line (after the binary) that runs a component with
// its flags.
func Args(name string, flags ...string) []string {
	return append([]string{Command, name}, flags...)
}

// Run runs one component in this process until it is signalled.
func Run(ctx context.Context, name string, args []string) error {
	switch name {
	case APIServer:
		cmd := apiserverapp.NewAPIServerCommand()
		cmd.SetArgs(args)
		return cmd.Execute()
	case ControllerManager:
		cmd := kcmapp.NewControllerManagerCommand()
		cmd.SetArgs(args)
		return cmd.Execute()
	case KubeScheduler:
		cmd := schedapp.NewSchedulerCommand()
		cmd.SetArgs(args)
		return cmd.Execute()
	case Scheduler:
		cmd := scheduler.NewCommand()
		cmd.SetArgs(args)
		return cmd.Execute()
	case Webhook:
		return runWebhook(ctx, args)
	case VolumeProvisioner:
		return runVolumeProvisioner(ctx, args)
	case Kubelet:
		return runKubelet(ctx, args)
	case Runtime:
		return runRuntime(ctx, args)
	case NodeAgent:
		return runNodeAgent(ctx, args)
	case KubeletShim:
		return runKubeletShim(ctx, args)
	case MPSControl:
		return runMPSControl(args)
	case MemoryLimits:
		return runMemoryLimits(args)
	case InCluster:
		return runInCluster(args)
	}
	return fmt.Errorf("unknown component %q", name)
}

// Client is a client of the lab's API server as the kubeconfig says, with
// the rate limits of a busy controller.
func Client(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	return kubernetes.NewForConfig(cfg)
}
