package modes

import "github.com/tessera-gpu/tessera/pkg/api"

// mps is NVIDIA's MPS guide as written; every node agent is given the
// lab's MPS control daemon (component mps-control), which a node uses
// only when its profile is MPS.
func init() {
	Register(&Mode{
		Name:    "mps",
		Summary: "NVIDIA's MPS guide as written: 10 clients per GPU as nvidia.com/gpu.shared, each client's share enforced by the control daemon and the limiter",
		Order:   20,
		Profile: "mps", Sharing: api.SharingMPS,
		// NVIDIA's MPS guide.
		ProfileYAML: `version: v1
sharing:
  mps:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
`,
		Node: "lab-mps", Model: "A100-40GB", GPUs: 1,
		Demo: []DemoPod{
			{
				Name: "demo-mps", Command: []string{"gpu-fill"},
				Resources: map[string]string{"nvidia.com/gpu.shared": "1"},
				Show:      "an MPS client (NVIDIA's guide: 10 replicas) gets a tenth of the GPU's memory and is refused there",
			},
		},
	})
}
