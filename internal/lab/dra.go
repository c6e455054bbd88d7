package lab

// DRA in the lab (docs/dra.md): every hollow kubelet runs the kubelet's
// DRA manager and plugin registration, every node agent may serve the DRA
// driver gpu.tessera.io (it does on nodes whose profile says mode: dra,
// such as the dra mode's lab-dra), every node's runtime resolves CDI
// devices from the node's CDI directory, and `up` creates Tessera's
// DeviceClasses (with the compatibility classes gpu.nvidia.com and
// nvidia-gpu, since the lab runs no NVIDIA DRA driver) and the claims'
// admission policy.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
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

// ensureDRA creates the shipped DeviceClasses and admission policy.
func ensureDRA(ctx context.Context, client kubernetes.Interface) error {
	for _, doc := range [][]byte{deploy.DRADeviceClasses, deploy.DRACompatDeviceClasses, deploy.DRAAdmission} {
		for _, part := range strings.Split(string(doc), "\n---\n") {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(part), &meta); err != nil {
				return fmt.Errorf("deploy/dra: %w", err)
			}
			var err error
			switch meta.Kind {
			case "DeviceClass":
				var o resourceapi.DeviceClass
				if err = yaml.UnmarshalStrict([]byte(part), &o); err == nil {
					_, err = client.ResourceV1().DeviceClasses().Create(ctx, &o, metav1.CreateOptions{})
				}
			case "ValidatingAdmissionPolicy":
				var o admissionv1.ValidatingAdmissionPolicy
				if err = yaml.UnmarshalStrict([]byte(part), &o); err == nil {
					_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &o, metav1.CreateOptions{})
				}
			case "ValidatingAdmissionPolicyBinding":
				var o admissionv1.ValidatingAdmissionPolicyBinding
				if err = yaml.UnmarshalStrict([]byte(part), &o); err == nil {
					_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &o, metav1.CreateOptions{})
				}
			default:
				err = fmt.Errorf("unexpected kind %q", meta.Kind)
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("deploy/dra %s: %w", meta.Kind, err)
			}
		}
	}
	return nil
}

// draReady reports whether the node in mode dra published its GPUs: its
// ResourceSlice of driver gpu.tessera.io has devices.
func draReady(ctx context.Context, client kubernetes.Interface, node string) bool {
	l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node})
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
