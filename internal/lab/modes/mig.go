package modes

import "github.com/tessera-gpu/tessera/pkg/api"

// mig is static MIG as NVIDIA's device plugin serves it: the mixed
// strategy, the layout from the node's nvidia.com/mig.config label (the
// shipped mig-parted document).
func init() {
	Register(&Mode{
		Name:    "mig",
		Summary: "static MIG: mig-parted's all-1g.5gb layout (the node's nvidia.com/mig.config label), mixed strategy: nvidia.com/mig-1g.5gb",
		Order:   30,
		Profile: "mig", ProfileYAML: "version: v1\nflags:\n  migStrategy: mixed\n", Sharing: api.SharingMIG,
		Node: "lab-mig", Model: "A100-40GB", GPUs: 1,
		Labels: map[string]string{api.LabelMIGConfig: "all-1g.5gb"},
		Demo: []DemoPod{
			{
				Name: "demo-mig", Command: []string{"gpu-fill"},
				Resources: map[string]string{"nvidia.com/mig-1g.5gb": "1"},
				Show:      "a pod given a MIG device (nvidia.com/mig-1g.5gb) sees that device's memory, no limiter",
			},
		},
	})
}
