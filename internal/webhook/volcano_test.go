package webhook

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestVolcanoPods: pods asking for Volcano's vGPU resources are held to
// the environment, mount and isolation rules of GPU pods, and refused
// where Volcano would grant a share the kubelet never asks the node about.
func TestVolcanoPods(t *testing.T) {
	p := testAdmission()
	vgpu := func(res map[string]string, mutate func(*corev1.Pod)) *corev1.Pod {
		pd := pod(res)
		pd.Spec.SchedulerName = api.VolcanoSchedulerName
		if mutate != nil {
			mutate(pd)
		}
		return pd
	}
	ok := map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: "3000", api.VolcanoVGPUCores: "50"}
	if errs := p.ValidateVolcano(vgpu(ok, nil)); len(errs) != 0 {
		t.Fatalf("Volcano's example refused: %v", errs)
	}
	if r := p.review(admissionRequest(t, "tenant", admissionv1.Create, "", vgpu(ok, nil), nil), true); !r.Allowed || r.Patch != nil {
		t.Errorf("Volcano's example: allowed %v, patch %s (the webhook neither routes nor changes Volcano's pods)", r.Allowed, r.Patch)
	}
	for _, tc := range []struct {
		name   string
		res    map[string]string
		mutate func(*corev1.Pod)
		want   string
	}{
		{"memory without count", map[string]string{api.VolcanoVGPUMemory: "3000"}, nil, "add volcano.sh/vgpu-number: 1"},
		{"cores without count", map[string]string{api.VolcanoVGPUCores: "30"}, nil, "without volcano.sh/vgpu-number"},
		{"memory 0", map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: "0"}, nil, "Volcano reads 0 as the whole GPU"},
		{"two memories", map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: "3000", api.VolcanoVGPUMemoryPercentage: "10"}, nil, "give the memory one way"},
		{"memory past the bound", map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: "99999999999"}, nil, "must be between 0"},
		{"count 0 with memory", map[string]string{api.VolcanoVGPUNumber: "0", api.VolcanoVGPUMemory: "3000"}, nil, "is 0 while"},
		{"nodeName", ok, func(p *corev1.Pod) { p.Spec.NodeName = "lab-volcano" }, "must be placed by Volcano's scheduler"},
		{"env override", ok, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		}, "NVIDIA_VISIBLE_DEVICES selects the container's GPUs"},
		{"hostPID", ok, func(p *corev1.Pod) { p.Spec.HostPID = true }, "host's PID namespace"},
		{"init container", ok, func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.VolcanoVGPUNumber: resource.MustParse("1")}}}}
		}, "app containers only"},
		{"both kinds", map[string]string{api.VolcanoVGPUNumber: "1", "nvidia.com/gpu": "1"}, nil, "a pod is placed by one of Volcano and"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pd := vgpu(tc.res, tc.mutate)
			r := p.review(admissionRequest(t, "tenant", admissionv1.Create, "", pd, nil), false)
			if r.Allowed || r.Result == nil || !strings.Contains(r.Result.Message, tc.want) {
				t.Errorf("allowed %v, %v; want a refusal mentioning %q", r.Allowed, r.Result, tc.want)
			}
		})
	}
}

// TestVolcanoClaims: a pod Volcano places with Tessera's claims is
// admitted without the GPU memory charge (Volcano would count it against
// its nodes, none of which has it), and refused where a ResourceQuota
// limits that charge.
func TestVolcanoClaims(t *testing.T) {
	f := newFakeClaims()
	f.template("team", "share", memSpec(1, "20Gi"))
	f.template("quoted", "share", memSpec(1, "20Gi"))
	f.quota["quoted"] = true
	p := claimAdmission(f)
	for ns, want := range map[string]string{"team": "", "quoted": "whose ResourceQuota limits tessera.io/gpu-memory"} {
		pd := withTemplateClaim(pod(nil), ns, "share")
		pd.Spec.SchedulerName = api.VolcanoSchedulerName
		r := p.review(admissionRequest(t, "tenant", admissionv1.Create, "", pd, nil), true)
		switch {
		case want == "" && (!r.Allowed || r.Patch != nil):
			t.Errorf("%s: allowed %v, patch %s; want admitted unchanged", ns, r.Allowed, r.Patch)
		case want != "" && (r.Allowed || !strings.Contains(r.Result.Message, want)):
			t.Errorf("%s: allowed %v, %v; want refused mentioning %q", ns, r.Allowed, r.Result, want)
		}
	}
}
