package modes

import "github.com/tessera-gpu/tessera/pkg/api"

// fractional is the default mode: Tessera's shares through the device
// plugin.
func init() {
	gpu, memory := api.DefaultResourceNames.GPU, api.DefaultResourceNames.Memory
	Register(&Mode{
		Name:    "fractional",
		Summary: "fractional shares through the device plugin: memory and compute limits enforced by the limiter",
		Order:   0,
		Profile: "default", ProfileYAML: "sharing: shared\nsharesPerGPU: 10\n", Sharing: api.SharingShared,
		Node: "lab-gpu-01", Model: "A100-40GB", GPUs: 8,
		Demo: []DemoPod{
			{
				Name: "demo-10gib", Command: []string{"gpu-fill"},
				Resources: map[string]string{gpu: "1", memory: "10240"},
				Show:      "a pod given 10 GiB of a GPU sees 10 GiB in total and is refused at 10 GiB",
			},
			{
				Name: "demo-whole-gpu", Command: []string{"gpu-fill"},
				Resources: map[string]string{gpu: "1"},
				Show:      "a pod given a whole GPU sees the whole GPU (no limiter)",
			},
			{
				Name: "demo-half-a", Command: []string{"gpu-fill", "--hold", "forever"},
				Resources: map[string]string{gpu: "0.5"},
				Show:      "two half-GPU pods on one GPU (the second asks for the first's GPU) fill it together and no further",
				Holds:     true,
			},
			{
				Name: "demo-half-b", Command: []string{"gpu-fill", "--hold", "1"},
				Resources: map[string]string{gpu: "0.5"},
				SameGPUAs: "demo-half-a",
			},
		},
	})
}
