package modes

// Volcano in the lab (docs/volcano.md): a node whose agent's profile says
// mode volcano, so Volcano's scheduler (which `tessera-lab up --volcano`
// starts) places GPU shares on it through Volcano's vGPU protocol and the
// agent serves them with the limiter. Only with --volcano: without
// Volcano's scheduler nothing would place the node's pods.

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// VolcanoProfile is the volcano node's agent profile: shares enforced by
// the limiter, 10 per GPU (Volcano's default split count).
const VolcanoProfile = "mode: volcano\nsharing: shared\nsharesPerGPU: 10\n"

// VolcanoMode is the mode's name (NodeSpec.Mode).
const VolcanoMode = "volcano"

func init() {
	Register(&Mode{
		Name:    VolcanoMode,
		Summary: "Volcano's scheduler places GPU shares (volcano.sh/vgpu-number, vgpu-memory, vgpu-cores), gangs and queues; the agent speaks Volcano's vGPU protocol and the limiter enforces each share (with --volcano)",
		Order:   60,
		Profile: "volcano", ProfileYAML: VolcanoProfile, Sharing: api.SharingShared,
		Node: "lab-volcano", Model: "A100-40GB", GPUs: 8,
		Serving:   volcanoServing,
		OnRequest: true,
	})
}

// volcanoServing is the volcano mode's Serving: the node's GPUs are
// registered with Volcano and its vGPU count, memory and cores are
// allocatable.
func volcanoServing(_ context.Context, _ kubernetes.Interface, node *corev1.Node) bool {
	if node.Annotations[api.AnnotationVolcanoRegister] == "" {
		return false
	}
	for _, r := range []string{api.VolcanoVGPUNumber, api.VolcanoVGPUMemory, api.VolcanoVGPUCores} {
		q, ok := node.Status.Allocatable[corev1.ResourceName(r)]
		if !ok || q.Value() == 0 {
			return false
		}
	}
	return true
}
