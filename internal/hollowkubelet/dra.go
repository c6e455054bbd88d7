package hollowkubelet

// The kubelet's DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra), wired
// into the container manager the way the real one does it: plugin
// registration through the kubelet's plugin watcher (the handler of
// GetPluginRegistrationHandlers), NodePrepareResources before a pod's
// containers start and NodeUnprepareResources once it is done, and the
// CDI devices the driver answered in every container's run options.

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// EnableDRA creates the kubelet's DRA manager, its checkpoint in
// stateDir (the kubelet's root directory). Start (or StartDRA) starts it.
func (g *ContainerManager) EnableDRA(logger klog.Logger, client clientset.Interface, stateDir string) error {
	m, err := kubeletdra.NewManager(logger, client, stateDir)
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	g.dra = m
	return nil
}

// DRAEnabled reports whether the DRA manager is wired in.
func (g *ContainerManager) DRAEnabled() bool { return g.dra != nil }

// StartDRA starts the DRA manager alone: its reconcile loop (which
// unprepares the claims of pods no longer active) and its plugin
// registry. getNode returns the kubelet's Node (the manager removes the
// node's ResourceSlices while no driver is registered).
func (g *ContainerManager) StartDRA(ctx context.Context, activePods cm.ActivePodsFunc, getNode cm.GetNodeFunc, sources config.SourcesReady) error {
	if g.dra == nil {
		return nil
	}
	return g.dra.Start(ctx, kubeletdra.ActivePodsFunc(activePods), kubeletdra.GetNodeFunc(getNode), sources)
}

// RunPluginWatcher runs the kubelet's plugin manager on the registration
// directory dir with the DRA handler, as the kubelet does on
// <root>/plugins_registry; for drivers of a bare ContainerManager (a full
// hollow kubelet runs its own). It returns at once; ctx stops it.
func (g *ContainerManager) RunPluginWatcher(ctx context.Context, dir string, sources config.SourcesReady) {
	pm := pluginmanager.NewPluginManager(dir, &record.FakeRecorder{})
	for name, h := range g.GetPluginRegistrationHandlers() {
		pm.AddHandler(name, h)
	}
	go pm.Run(ctx, sources, ctx.Done())
}

// GetPluginRegistrationHandlers hands the DRA manager's registration
// handler to the kubelet's plugin manager (device plugins register on
// kubelet.sock, not through the plugin watcher, in this wiring).
func (g *ContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	if g.dra == nil {
		return map[string]cache.PluginHandler{}
	}
	return map[string]cache.PluginHandler{pluginwatcherapi.DRAPlugin: g.dra.GetWatcherHandler()}
}

func (g *ContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	if g.dra == nil {
		return nil
	}
	return g.dra.PrepareResources(ctx, pod)
}

func (g *ContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	if g.dra == nil {
		return nil
	}
	return g.dra.UnprepareResources(ctx, pod)
}

func (g *ContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return g.dra != nil && g.dra.PodMightNeedToUnprepareResources(uid)
}

// draCDIDevices are the CDI devices of the container's claims.
func (g *ContainerManager) draCDIDevices(pod *v1.Pod, c *v1.Container) ([]kubecontainer.CDIDevice, error) {
	if g.dra == nil {
		return nil, nil
	}
	info, err := g.dra.GetResources(pod, c)
	if err != nil {
		return nil, err
	}
	return info.CDIDevices, nil
}

// GetDynamicResources is the pod-resources API's view of a container's
// claims (as the real container manager builds it).
func (g *ContainerManager) GetDynamicResources(pod *v1.Pod, c *v1.Container) []*podresourcesapi.DynamicResource {
	if g.dra == nil {
		return nil
	}
	infos, err := g.dra.GetContainerClaimInfos(pod, c)
	if err != nil {
		return nil
	}
	var out []*podresourcesapi.DynamicResource
	for _, info := range infos {
		var res []*podresourcesapi.ClaimResource
		for driver, st := range info.DriverState {
			for _, d := range st.Devices {
				var cdi []*podresourcesapi.CDIDevice
				for _, id := range d.CDIDeviceIDs {
					cdi = append(cdi, &podresourcesapi.CDIDevice{Name: id})
				}
				res = append(res, &podresourcesapi.ClaimResource{CdiDevices: cdi, DriverName: driver, PoolName: d.PoolName, DeviceName: d.DeviceName, ShareId: (*string)(d.ShareID)})
			}
		}
		out = append(out, &podresourcesapi.DynamicResource{ClaimName: info.ClaimName, ClaimNamespace: info.Namespace, ClaimResources: res})
	}
	return out
}
