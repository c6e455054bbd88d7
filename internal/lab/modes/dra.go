package modes

// DRA in the lab (docs/dra.md): the dra mode's hollow kubelets run the
// kubelet's DRA manager and plugin registration, `up` creates Tessera's
// DeviceClasses (with the compatibility classes gpu.nvidia.com and
// nvidia-gpu, since the lab runs no NVIDIA DRA driver) and the claims'
// admission policy, and the node's agent serves the DRA driver
// gpu.tessera.io (its profile, the shipped dra, says mode: dra). Every
// node agent is given the DRA driver's paths and every node's runtime
// resolves CDI devices, so any node relabelled to a dra profile serves
// claims too.

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func init() {
	Register(&Mode{
		Name:    "dra",
		Summary: "DRA: GPUs as ResourceClaims of the driver gpu.tessera.io, shares as consumable capacity (memory, cores) enforced by the limiter; nvidia.com/gpu pods through the mapped DeviceClass",
		Order:   50,
		Profile: "dra", Sharing: api.SharingShared,
		Node: "lab-dra", Model: "A100-80GB", GPUs: 4,
		Setup: ensureDRA, Serving: draServing,
		// Only this mode's kubelets run the DRA manager: the other nodes'
		// kubelets stay as they were.
		Kubelet: func(o *hollowkubelet.Options) { o.DRA = true },
		Demo: []DemoPod{
			{
				Name: "demo-dra-whole-gpu", Command: []string{"sh", "-c", "nvidia-smi -L && gpu-fill"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "1"},
				Show:      "an unchanged nvidia.com/gpu: 1 pod on a DRA node gets a whole GPU through the DeviceClass extended-resource.gpu.tessera.io (a claim the scheduler makes for it)",
			},
		},
	})
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
