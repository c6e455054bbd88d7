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
package hollowkubelet

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	internalapi "k8s.io/cri-api/pkg/apis"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
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
	return g.dm.Start(klog.FromContext(ctx), devicemanager.ActivePodsFunc(activePods), sources, containermap.NewContainerMap(), sets.New[string]())
}

func (g *ContainerManager) GetDevicePluginResourceCapacity() (v1.ResourceList, v1.ResourceList, []string) {
	return g.dm.GetCapacity()
}

func (g *ContainerManager) GetResources(ctx context.Context, pod *v1.Pod, c *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts := &kubecontainer.RunContainerOptions{}
	dev, err := g.dm.GetDeviceRunContainerOptions(ctx, pod, c)
	if err != nil || dev == nil {
		return opts, err
	}
	opts.Envs, opts.Mounts, opts.Devices = dev.Envs, dev.Mounts, dev.Devices
	return opts, nil
}

func (g *ContainerManager) UpdatePluginResources(n *schedulerframework.NodeInfo, a *lifecycle.PodAdmitAttributes) error {
	return g.dm.UpdatePluginResources(n, a)
}

func (g *ContainerManager) ShouldResetExtendedResourceCapacity() bool {
	return g.dm.ShouldResetExtendedResourceCapacity()
}

func (g *ContainerManager) GetAllocateResourcesPodAdmitHandler() lifecycle.PodAdmitHandler {
	return admitHandler{g.dm}
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

// admitHandler allocates devices container by container, init containers
// first, as the topology manager's admit handler does.
type admitHandler struct{ dm *devicemanager.ManagerImpl }

func (h admitHandler) Admit(attrs *lifecycle.PodAdmitAttributes) lifecycle.PodAdmitResult {
	pod := attrs.Pod
	all := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		if err := h.dm.Allocate(pod, &all[i]); err != nil {
			return lifecycle.PodAdmitResult{Admit: false, Reason: "UnexpectedAdmissionError", Message: fmt.Sprintf("Allocate failed due to %v, which is unexpected", err)}
		}
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
