package modes

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// time-slicing is NVIDIA's time-slicing guide as written.
func init() {
	Register(&Mode{
		Name:    "time-slicing",
		Summary: "NVIDIA's time-slicing guide as written: 4 replicas of each GPU, nothing isolated",
		Order:   10,
		Profile: "time-slicing", Sharing: api.SharingTimeSlicing,
		// NVIDIA's time-slicing guide.
		ProfileYAML: `version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`,
		Node: "lab-time-slicing", Model: "A100-40GB", GPUs: 1,
		Taints: []corev1.Taint{{Key: SharingTaint, Value: "time-slicing", Effect: corev1.TaintEffectNoSchedule}},
		Demo: []DemoPod{
			{
				Name: "demo-time-slicing", Command: []string{"sh", "-c", "nvidia-smi -L && gpu-fill"},
				Resources: map[string]string{api.DefaultResourceNames.GPU: "1"},
				Show:      "a pod on a time-sliced GPU (NVIDIA's guide) sees the whole GPU: nothing is isolated",
			},
		},
	})
}
