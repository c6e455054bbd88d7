// Package standin is the lab's table of the images whose programs its
// containers stand in for. The lab pulls no image: a container runs the
// host's programs (docs/lab.md, "Containers: the contract"), and the
// programs of a real workload's image (vllm, tritonserver, torchrun, a
// notebook server) are not among them. A container of an image of this
// table runs, in place of its command, the lab's gpu-fill on the GPUs its
// workload would use: each filled through the limiter until the driver
// refuses (where its share ends), then held, so the workload is seen
// holding its share and refused at its limit.
//
// The table holds the images of the real-world workloads of test/corpus,
// by their exact reference: another tag of one of these images (as the
// examples use) runs as any other image.
package standin

import (
	"fmt"
	"strconv"
	"strings"
)

// Image is one image the lab stands in for.
type Image struct {
	// Ref is the image reference as manifests name it.
	Ref string
	// Workload says what the image runs.
	Workload string
	// GPUs reads, from the container's command and environment, how many
	// GPUs the workload uses; 0 (or GPUs nil): every GPU the container
	// has.
	GPUs func(argv []string, env map[string]string) int
}

// Images is the table: every image of test/corpus.
var Images = []Image{
	{Ref: "vllm/vllm-openai:latest", Workload: "vLLM's OpenAI-compatible server",
		// vLLM serves a model on --tensor-parallel-size GPUs, 1 by default.
		GPUs: func(argv []string, _ map[string]string) int { return flagInt(argv, 1, "--tensor-parallel-size", "-tp") }},
	{Ref: "nvcr.io/nvidia/tritonserver:25.02-py3", Workload: "NVIDIA Triton Inference Server"},
	{Ref: "us-docker.pkg.dev/deeplearning-platform-release/gcr.io/huggingface-text-generation-inference-cu121.2-0.ubuntu2204:latest",
		Workload: "Hugging Face Text Generation Inference",
		// TGI shards the model over NUM_SHARD GPUs, all it sees by default.
		GPUs: func(_ []string, env map[string]string) int { n, _ := strconv.Atoi(env["NUM_SHARD"]); return max(n, 0) }},
	{Ref: "gcr.io/your-project/pytorch_dist_mnist:latest", Workload: "the Kubeflow Training Operator's distributed MNIST (PyTorchJob)"},
	{Ref: "rayproject/ray-ml:2.6.3-gpu", Workload: "a Ray worker node",
		GPUs: func(argv []string, _ map[string]string) int { return flagInt(argv, 0, "--num-gpus") }},
	{Ref: "quay.io/jupyter/pytorch-notebook:cuda12-python-3.11", Workload: "a Jupyter notebook server (PyTorch, CUDA 12)"},
	{Ref: "nvcr.io/nvidia/nemo:25.02", Workload: "NVIDIA NeMo training (torchrun)", GPUs: torchrun},
	{Ref: "nvcr.io/nvidia/pytorch:24.12-py3", Workload: "PyTorch training (torchrun)", GPUs: torchrun},
}

// Lookup finds an image in the table by its reference.
func Lookup(ref string) (Image, bool) {
	for _, im := range Images {
		if im.Ref == ref {
			return im, true
		}
	}
	return Image{}, false
}

// Command is what a container of image runs in place of argv (its command
// and arguments; env its environment), with gpuFill the path of the lab's
// gpu-fill in the container; false when the image is not in the table.
// The command says first, on its output, what it stands in for.
func Command(gpuFill, image string, argv []string, env map[string]string) ([]string, bool) {
	im, ok := Lookup(image)
	if !ok {
		return nil, false
	}
	n := 0
	if im.GPUs != nil {
		n = im.GPUs(argv, env)
	}
	on := "every GPU of the container"
	if n > 0 {
		on = fmt.Sprintf("%d GPU(s)", n)
	}
	note := fmt.Sprintf("tessera-lab: %s (%s) is not pulled; gpu-fill stands in for %q on %s", image, im.Workload, strings.Join(argv, " "), on)
	// The shell says what stands in and becomes gpu-fill, which ends at
	// SIGTERM as the workload would.
	return []string{"/bin/sh", "-c", `echo "$1"; exec "$0" --devices "$2" --hold forever`, gpuFill, note, strconv.Itoa(n)}, true
}

// torchrun reads torchrun's --nproc_per_node (--nproc-per-node): one
// worker per GPU; "gpu" or "auto" (or none given): every GPU.
func torchrun(argv []string, _ map[string]string) int {
	return flagInt(argv, 0, "--nproc_per_node", "--nproc-per-node")
}

// flagInt is the value of the first of the flags in argv ("--flag N" or
// "--flag=N", also inside a shell command line), def when none is given
// or its value is not a count.
func flagInt(argv []string, def int, flags ...string) int {
	var words []string
	for _, a := range argv {
		words = append(words, strings.Fields(a)...)
	}
	for i, w := range words {
		for _, f := range flags {
			v, ok := "", false
			if rest, eq := strings.CutPrefix(w, f+"="); eq {
				v, ok = rest, true
			} else if w == f && i+1 < len(words) {
				v, ok = words[i+1], true
			}
			if !ok {
				continue
			}
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				return n
			}
			return def
		}
	}
	return def
}
