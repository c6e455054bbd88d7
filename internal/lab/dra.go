package lab

// DRA in the lab (docs/dra.md): the dra mode's hollow kubelets run the
// kubelet's DRA manager and plugin registration (--dra), every node agent
// may serve the DRA
// driver gpu.tessera.io (it does on nodes whose profile says mode: dra,
// such as the dra mode's lab-dra), every node's runtime resolves CDI
// devices from the node's CDI directory, and `up` creates Tessera's
// DeviceClasses (with the compatibility classes gpu.nvidia.com and
// nvidia-gpu, since the lab runs no NVIDIA DRA driver) and the claims'
// admission policy.

import (
	"context"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// cdiDir is where the node's DRA driver writes CDI specs and its runtime
// reads them (/var/run/cdi on a node).
func (n nodeDir) cdiDir() string { return n.path("cdi") }

// claimDir holds the DRA driver's per-claim limiter files and checkpoint.
func (n nodeDir) claimDir() string { return n.path("claims") }

// labDRA are the node agent's DRA paths on the node whose directory is
// dir: the kubelet's plugin directories under the node's kubelet root
// (bind-mounted on /var/lib/kubelet in the kubelet's mount namespace).
func labDRA(dir string) dra.Options {
	nd := nodeDir(dir)
	root := nd.path("kubelet")
	return dra.Options{
		ClaimRoot:     nd.claimDir(),
		CDIDir:        nd.cdiDir(),
		PluginDataDir: filepath.Join(root, "plugins", api.DRADriverName),
		RegistrarDir:  filepath.Join(root, "plugins_registry"),
	}
}

// ensureDRA is the dra mode's Setup: the shipped DeviceClasses, the
// compatibility ones and the claims' admission policy.
func ensureDRA(ctx context.Context, client kubernetes.Interface) error {
	return dra.ApplyManifests(ctx, client, deploy.DRADeviceClasses, deploy.DRACompatDeviceClasses, deploy.DRAAdmission)
}

// draServing is the dra mode's Serving: the node's agent publishes
// mode dra in its inventory and its ResourceSlice of driver
// gpu.tessera.io has devices.
func draServing(ctx context.Context, client kubernetes.Interface, node *corev1.Node) bool {
	inv, err := kubeobj.Inventory(node)
	if err != nil || inv == nil || inv.Mode != api.ModeDRA {
		return false
	}
	l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node.Name})
	if err != nil {
		return false
	}
	for _, s := range l.Items {
		if s.Spec.Driver == api.DRADriverName && len(s.Spec.Devices) > 0 {
			return true
		}
	}
	return false
}
