package modes

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// mig-dynamic makes a MIG instance for each pod (the shipped profile
// mig-dynamic).
func init() {
	names := api.DefaultResourceNames
	Register(&Mode{
		Name:    "mig-dynamic",
		Summary: "dynamic MIG: an instance made for each pod, sized to its memory and cores",
		Order:   40,
		Profile: "mig-dynamic", Sharing: api.SharingMIGDynamic,
		Node: "lab-mig-dynamic", Model: "A100-40GB", GPUs: 1,
		Taints: []corev1.Taint{{Key: SharingTaint, Value: "mig-dynamic", Effect: corev1.TaintEffectNoSchedule}},
		Demo: []DemoPod{
			{
				Name: "demo-mig-dynamic", Command: []string{"gpu-fill"},
				Resources: map[string]string{names.GPU: "1", names.Memory: "9000", names.Cores: "25"},
				Show:      "a pod asking 9000 MiB and 25 % on a dynamic-MIG GPU gets a MIG instance made for it (2g.10gb) and sees its memory",
			},
		},
	})
}
