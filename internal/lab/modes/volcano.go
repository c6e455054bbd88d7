package modes

// Volcano in the lab (docs/volcano.md): a node whose agent's profile says
// mode volcano, so Volcano's scheduler (which `tessera-lab up --volcano`
// starts) places GPU shares on it through Volcano's vGPU protocol and the
// agent serves them with the limiter. Only with --volcano: without
// Volcano's scheduler nothing would place the node's pods.

import (
	"context"
	"strings"

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

// VolcanoMIGProfile is the profile of a volcano node in Volcano's mig
// mode: a MIG instance made for each pod, of the geometry group Volcano's
// scheduler chose (docs/volcano.md, "MIG mode").
const VolcanoMIGProfile = "mode: volcano\nsharing: mig-dynamic\nsharesPerGPU: 7\n"

// VolcanoMIGMode is the mig mode's name, short like its nodes' names
// (lab-vc-mig-01): the kubelet's device-plugin sockets live below the
// node's directory, within a unix socket's 107 bytes.
const VolcanoMIGMode = "vc-mig"

// VolcanoModes are the lab's modes whose nodes Volcano's scheduler places.
func VolcanoModes() []string { return []string{VolcanoMode, VolcanoMIGMode} }

func init() {
	Register(&Mode{
		Name:    VolcanoMIGMode,
		Summary: "Volcano's mig mode: Volcano's scheduler picks a MIG geometry group and an instance of it for each vGPU container (volcano.sh/vgpu-memory), the agent makes that instance (with --volcano and --node-groups …@vc-mig)",
		Order:   61,
		Profile: "volcano-mig", ProfileYAML: VolcanoMIGProfile, Sharing: api.SharingMIGDynamic,
		Node: "lab-vc-mig", Model: "A100-40GB", GPUs: 1,
		// Volcano's hami-core pods would fit a GPU in MIG mode too.
		Taints:    []corev1.Taint{{Key: SharingTaint, Value: VolcanoMIGMode, Effect: corev1.TaintEffectNoSchedule}},
		Serving:   volcanoMIGServing,
		OnRequest: true,
	})
}

// volcanoMIGServing: as volcanoServing, and the GPUs are registered in
// Volcano's mig mode (MIG mode is on).
func volcanoMIGServing(ctx context.Context, c kubernetes.Interface, node *corev1.Node) bool {
	reg := node.Annotations[api.AnnotationVolcanoRegister]
	return volcanoServing(ctx, c, node) && strings.Count(reg, ","+api.VolcanoModeMIG+":") == strings.Count(reg, ":")
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
