// Package hollowkubelet runs a hollow kubelet (k8s.io/kubernetes/pkg/kubemark:
// the real kubelet code with a fake container runtime) whose device calls
// go to the kubelet's real device manager, so a device plugin registered
// on its socket directory is admitted, allocated and its answers put into
// the containers exactly as on a real node. The emulated cluster
// (internal/lab) and the node agent's integration tests use it.
//
// The device manager listens on the fixed directory
// /var/lib/kubelet/device-plugins, so one process can run one hollow
// kubelet, inside a mount namespace that gives it its own directory there.
//
// It is Tessera's one kubelet emulation. Run starts a whole hollow
// kubelet; a test that must drive admission itself (restart the device
// manager, admit pods one at a time) uses the same ContainerManager
// directly: StartDeviceManager, Admit, GetResources, GetDevices, and
// ServePodResources for the pod-resources API.
package hollowkubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/status"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// ContainerManager is the kubelet's stub container manager with the
// device manager wired in the way the real one does it: capacity from the
// plugins, allocation at admission, and the plugins' environment, mounts
// and devices in every container's run options.
type ContainerManager struct {
	cm.ContainerManager
	dm *devicemanager.ManagerImpl
	// dra is the kubelet's DRA manager (EnableDRA; dra.go); nil: none.
	dra *kubeletdra.Manager
}

// NewContainerManager creates the device manager on the fixed socket
// directory.
func NewContainerManager() (*ContainerManager, error) {
	dm, err := devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
	if err != nil {
		return nil, fmt.Errorf("device manager: %w", err)
	}
	return &ContainerManager{ContainerManager: cm.NewStubContainerManager(), dm: dm}, nil
}

func (g *ContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc, getNode cm.GetNodeFunc, sources config.SourcesReady, ps status.PodStatusProvider, rs internalapi.RuntimeService, lsci bool) error {
	if err := g.ContainerManager.Start(ctx, node, activePods, getNode, sources, ps, rs, lsci); err != nil {
		return err
	}
	if err := g.StartDRA(ctx, activePods, getNode, sources); err != nil {
		return err
	}
	containers, running := RuntimeContainers(ctx, rs)
	return g.startDeviceManager(klog.FromContext(ctx), activePods, sources, containers, running)
}

// StartDeviceManager starts the device manager alone: it serves
// kubelet.sock, takes plugin registrations and reads its checkpoint.
// activePods are the pods it keeps devices for; while sources are not all
// ready (a restarted kubelet) it also keeps checkpointed devices of pods
// it has not seen. It knows of no running container (a bare device
// manager has no runtime; Start gives it the runtime's).
func (g *ContainerManager) StartDeviceManager(logger klog.Logger, activePods cm.ActivePodsFunc, sources config.SourcesReady) error {
	return g.startDeviceManager(logger, activePods, sources, containermap.NewContainerMap(), sets.New[string]())
}

func (g *ContainerManager) startDeviceManager(logger klog.Logger, activePods cm.ActivePodsFunc, sources config.SourcesReady, containers containermap.ContainerMap, running sets.Set[string]) error {
	return g.dm.Start(logger, devicemanager.ActivePodsFunc(activePods), sources, containers, running)
}

// RuntimeContainers is what the kubelet's container manager reads from the
// runtime when it starts (pkg/kubelet/cm's unexported
// buildContainerMapAndRunningSetFromRuntime, which the stub container
// manager skips): every container by pod UID and name, and the IDs of
// those running. The device manager needs them after a kubelet restart:
// while the config sources are not all ready it admits a pod whose
// container the runtime reports running without asking for devices, as
// that container already has them. Without them a restarted kubelet
// whose device plugin has not registered again yet rejects the pods that
// ran on through the restart ("no healthy devices present",
// UnexpectedAdmissionError) and kills their containers.
func RuntimeContainers(ctx context.Context, rs internalapi.RuntimeService) (containermap.ContainerMap, sets.Set[string]) {
	containers, running := containermap.NewContainerMap(), sets.New[string]()
	if rs == nil {
		return containers, running
	}
	logger := klog.FromContext(ctx)
	sandboxes, err := rs.ListPodSandbox(ctx, nil)
	if err != nil {
		logger.Error(err, "Listing the runtime's pod sandboxes for the device manager")
	}
	podOf := map[string]string{}
	for _, sb := range sandboxes {
		if sb.Metadata != nil {
			podOf[sb.Id] = sb.Metadata.Uid
		}
	}
	list, err := rs.ListContainers(ctx, nil)
	if err != nil {
		logger.Error(err, "Listing the runtime's containers for the device manager")
	}
	for _, c := range list {
		uid, ok := podOf[c.PodSandboxId]
		if !ok || c.Metadata == nil {
			continue
		}
		containers.Add(uid, c.Metadata.Name, c.Id)
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running.Insert(c.Id)
		}
	}
	return containers, running
}

// StopDeviceManager stops the device manager (a kubelet going down).
func (g *ContainerManager) StopDeviceManager(logger klog.Logger) error { return g.dm.Stop(logger) }

// Admit allocates the pod's devices container by container, init
// containers first, as the kubelet's admission does once the pod is in
// its pod manager. The first failure is the pod's rejection.
func (g *ContainerManager) Admit(pod *v1.Pod) error {
	all := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		if err := g.dm.Allocate(pod, &all[i]); err != nil {
			return err
		}
	}
	return nil
}

func (g *ContainerManager) GetDevicePluginResourceCapacity() (v1.ResourceList, v1.ResourceList, []string) {
	return g.dm.GetCapacity()
}

func (g *ContainerManager) GetResources(ctx context.Context, pod *v1.Pod, c *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts := &kubecontainer.RunContainerOptions{}
	cdi, err := g.draCDIDevices(pod, c)
	if err != nil {
		return nil, err
	}
	opts.CDIDevices = cdi
	dev, err := g.dm.GetDeviceRunContainerOptions(ctx, pod, c)
	if err != nil || dev == nil {
		return opts, err
	}
	opts.Envs, opts.Mounts, opts.Devices = dev.Envs, dev.Mounts, dev.Devices
	opts.CDIDevices = append(opts.CDIDevices, dev.CDIDevices...)
	return opts, nil
}

func (g *ContainerManager) UpdatePluginResources(n *schedulerframework.NodeInfo, a *lifecycle.PodAdmitAttributes) error {
	return g.dm.UpdatePluginResources(n, a)
}

func (g *ContainerManager) ShouldResetExtendedResourceCapacity() bool {
	return g.dm.ShouldResetExtendedResourceCapacity()
}

func (g *ContainerManager) GetAllocateResourcesPodAdmitHandler() lifecycle.PodAdmitHandler {
	return admitHandler{g}
}

func (g *ContainerManager) UpdateAllocatedDevices() { g.dm.UpdateAllocatedDevices() }

func (g *ContainerManager) GetDevices(podUID, container string) []*podresourcesapi.ContainerDevices {
	return ContainerDevices(g.dm.GetDevices(podUID, container))
}

func (g *ContainerManager) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return ContainerDevices(g.dm.GetAllocatableDevices())
}

func (g *ContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, s *v1.PodStatus) {
	g.dm.UpdateAllocatedResourcesStatus(pod, s)
}

// admitHandler is the kubelet's admission of a pod's devices, as the
// topology manager's admit handler does it (ContainerManager.Admit).
type admitHandler struct{ g *ContainerManager }

func (h admitHandler) Admit(attrs *lifecycle.PodAdmitAttributes) lifecycle.PodAdmitResult {
	if err := h.g.Admit(attrs.Pod); err != nil {
		return lifecycle.PodAdmitResult{Admit: false, Reason: "UnexpectedAdmissionError", Message: fmt.Sprintf("Allocate failed due to %v, which is unexpected", err)}
	}
	return lifecycle.PodAdmitResult{Admit: true}
}

// ContainerDevices converts the device manager's view into the
// pod-resources API's, one device per entry.
func ContainerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for res, ds := range devs {
		for id := range ds {
			out = append(out, &podresourcesapi.ContainerDevices{ResourceName: res, DeviceIds: []string{id}})
		}
	}
	return out
}

// ServePodResources serves the kubelet's pod-resources API (v1) on the
// unix socket: pods lists the kubelet's pods, g says what devices each
// container holds. The kubelet of Run serves its own; this is for drivers
// of a bare ContainerManager. Stop the returned server when done.
func ServePodResources(ctx context.Context, socket string, pods podresources.PodsProvider, g *ContainerManager) (*grpc.Server, error) {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(ctx, podresources.PodResourcesProviders{
		Pods: pods, Devices: g, Cpus: g, Memory: g, DynamicResources: g,
	}))
	go func() { _ = srv.Serve(lis) }()
	return srv, nil
}
