package webhook

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func expectRefused(t *testing.T, adm *Admission, p *corev1.Pod, wants ...string) {
	t.Helper()
	errs := adm.Validate(p)
	if len(errs) == 0 {
		t.Fatalf("admitted, want a refusal mentioning %q", wants)
	}
	msg := Message(errs)
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("%q does not mention %q", msg, w)
		}
	}
}

// TestIsolationSettingsRefused: finding 7 of the trust issue. A GPU pod
// that could reach other tenants' GPUs or processes is refused; a trusted
// namespace may run it.
func TestIsolationSettingsRefused(t *testing.T) {
	yes := true
	unmasked := corev1.UnmaskedProcMount
	share := map[string]string{names().Memory: "1000"}
	cases := []struct {
		name   string
		mutate func(p *corev1.Pod)
		want   []string
	}{
		{"hostPID", func(p *corev1.Pod) { p.Spec.HostPID = true }, []string{"spec.hostPID", "every process on the node", TrustedLabel}},
		{"hostIPC", func(p *corev1.Pod) { p.Spec.HostIPC = true }, []string{"spec.hostIPC"}},
		{"SYS_ADMIN", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE", "SYS_ADMIN"}}}
		}, []string{"spec.containers[0].securityContext.capabilities.add[1]", "SYS_ADMIN"}},
		{"CAP_SYS_PTRACE", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"cap_sys_ptrace"}}}
		}, []string{"capabilities.add[0]", "cap_sys_ptrace"}},
		{"privileged", func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &yes} }, []string{"securityContext.privileged"}},
		{"unmasked proc", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ProcMount: &unmasked}
		}, []string{"securityContext.procMount"}},
		{"hostPath /dev", func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{hostPath("/dev")} }, []string{"spec.volumes[0].hostPath.path", `"/dev"`}},
		{"hostPath under /dev", func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{hostPath("/dev/nvidia0")} }, []string{"/dev/nvidia0", "overlaps /dev"}},
		{"hostPath above Tessera's state", func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{hostPath("/var/lib/")} }, []string{`"/var/lib/"`, "overlaps /var/lib/kubelet"}},
		{"hostPath /", func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{hostPath("/")} }, []string{`"/"`}},
		{"hostPath dodge", func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{hostPath("/tmp/../dev/./")} }, []string{"overlaps /dev"}},
		{"privileged init container", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", SecurityContext: &corev1.SecurityContext{Privileged: &yes}}}
		}, []string{"spec.initContainers[0].securityContext.privileged"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := pod(share)
			tc.mutate(p)
			expectRefused(t, testAdmission(), p, tc.want...)
			trusting := testAdmission()
			trusting.Trusted = func(ns string) bool { return ns == p.Namespace }
			if errs := trusting.Validate(p); len(errs) > 0 {
				t.Errorf("refused in a trusted namespace: %s", Message(errs))
			}
		})
	}
	// Harmless host paths and capabilities pass.
	p := pod(share)
	p.Spec.Volumes = []corev1.Volume{hostPath("/data/models"), hostPath("/var/log")}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}}}
	if errs := testAdmission().Validate(p); len(errs) > 0 {
		t.Errorf("refused: %s", Message(errs))
	}
	// A pod without GPU resources is not the webhook's business.
	cpu := pod(map[string]string{"cpu": "1"})
	cpu.Spec.HostPID = true
	if errs := testAdmission().Validate(cpu); len(errs) > 0 {
		t.Errorf("CPU pod refused: %s", Message(errs))
	}
}

func hostPath(p string) corev1.Volume {
	return corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}}
}

func names() api.ResourceNames { return api.DefaultResourceNames }

// TestInjectionOverridesRefused: finding 5. A GPU pod's own environment
// and volumes cannot override what the node agent gives its containers.
func TestInjectionOverridesRefused(t *testing.T) {
	share := map[string]string{names().Memory: "1000"}
	env := func(name string) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "OK", Value: "1"}, {Name: name, Value: "0"}}
		}
	}
	cm := func(prefix string) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: prefix, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
		}
	}
	mount := func(path string) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: path}}
		}
	}
	cases := []struct {
		name   string
		mutate func(p *corev1.Pod)
		want   []string
	}{
		{"memory limit", env("CUDA_DEVICE_MEMORY_LIMIT_0"), []string{"spec.containers[0].env[1].name", "CUDA_DEVICE_MEMORY_LIMIT_0"}},
		{"SM limit", env("CUDA_DEVICE_SM_LIMIT"), []string{"CUDA_DEVICE_SM_LIMIT"}},
		{"all GPUs", env("NVIDIA_VISIBLE_DEVICES"), []string{"NVIDIA_VISIBLE_DEVICES", "selects the container's GPUs"}},
		{"preload", env("LD_PRELOAD"), []string{"LD_PRELOAD"}},
		{"MPS", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}},
		{"Tessera", env("TESSERA_SM_ELASTIC"), []string{"TESSERA_SM_ELASTIC"}},
		{"HAMi loosening", env("GPU_CORE_UTILIZATION_POLICY"), []string{"GPU_CORE_UTILIZATION_POLICY"}},
		{"malformed limiter name", env("CUDA_DEVICE_MEMORY_LIMIT_"), []string{"CUDA_DEVICE_MEMORY_LIMIT_"}},
		{"envFrom without prefix", cm(""), []string{"spec.containers[0].envFrom[0]", `ConfigMap "cfg" without a prefix`, "NVIDIA_VISIBLE_DEVICES"}},
		{"envFrom reaching NVIDIA_", cm("NVIDIA_"), []string{"spec.containers[0].envFrom[0].prefix", `"NVIDIA_"`}},
		{"envFrom reaching CUDA_DEVICE_", cm("CUDA_"), []string{`"CUDA_"`}},
		{"mount over the preload list", mount("/etc/ld.so.preload"), []string{"spec.containers[0].volumeMounts[0].mountPath", "/etc/ld.so.preload"}},
		{"mount over the limits file", mount("/etc/tessera"), []string{"/etc/tessera"}},
		{"mount under the limits dir", mount("/etc/tessera/limiter.conf"), []string{"/etc/tessera/limiter.conf"}},
		{"mount over the library", mount("/usr/local/tessera/"), []string{"/usr/local/tessera"}},
		{"mount over the state", mount("/tessera/state/cache"), []string{"/tessera/state/cache"}},
		{"sidecar without GPU sets the env", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "side", Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}})
		}, []string{"spec.containers[1].env[0].name"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := pod(share)
			tc.mutate(p)
			expectRefused(t, testAdmission(), p, tc.want...)
			// No namespace opt-out for these.
			trusting := testAdmission()
			trusting.Trusted = func(string) bool { return true }
			if errs := trusting.Validate(p); len(errs) == 0 {
				t.Error("a trusted namespace may override the agent's settings")
			}
		})
	}
	// Allowed: other variables, prefixed envFrom, mounts elsewhere
	// (including above the agent's paths: the runtime mounts deeper paths
	// last), and unprefixed envFrom where the cluster opted in.
	p := pod(share)
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CUDA_VISIBLE_DEVICES", Value: "0"}, {Name: "TESSERA_LIMITER_DEBUG", Value: "1"}, {Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "compute"}}
	cm("APP_")(p)
	if errs := testAdmission().Validate(p); len(errs) > 0 {
		t.Errorf("refused: %s", Message(errs))
	}
	mount("/etc/config")(p)
	if errs := testAdmission().Validate(p); len(errs) > 0 {
		t.Errorf("refused: %s", Message(errs))
	}
	cm("")(p)
	allowing := testAdmission()
	allowing.AllowUnprefixedEnvFrom = true
	if errs := allowing.Validate(p); len(errs) > 0 {
		t.Errorf("refused with --allow-unprefixed-env-from: %s", Message(errs))
	}
}

func admissionRequest(t *testing.T, user string, op admissionv1.Operation, sub string, obj, old runtime.Object) *admissionv1.AdmissionRequest {
	t.Helper()
	raw := func(o runtime.Object) runtime.RawExtension {
		if o == nil {
			return runtime.RawExtension{}
		}
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	kind := "Pod"
	if _, ok := obj.(*corev1.Binding); ok {
		kind = "Binding"
	}
	return &admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: kind}, Operation: op, SubResource: sub,
		Namespace: "default", Name: "p", UserInfo: authenticationv1.UserInfo{Username: user},
		Object: raw(obj), OldObject: raw(old),
	}
}

// TestOnlyTheSchedulerWritesRecords: findings 1-4. Setting, changing or
// removing the record is refused to everyone but the scheduler, whatever
// carries it: a create, an update, the binding, the status subresource.
func TestOnlyTheSchedulerWritesRecords(t *testing.T) {
	adm := testAdmission()
	plain := pod(map[string]string{names().Memory: "1000"})
	withRec := plain.DeepCopy()
	withRec.Annotations = map[string]string{api.AnnotationAllocation: `{"forged":true}`}
	other := plain.DeepCopy()
	other.Annotations = map[string]string{api.AnnotationAllocation: `{"other":true}`}
	cpu := pod(map[string]string{"cpu": "1"})
	cpu.Spec.NodeName = "n1"
	cpu.Annotations = withRec.Annotations
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: withRec.Annotations}, Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}}
	attacker := "system:serviceaccount:team-a:default"
	cases := []struct {
		name    string
		req     *admissionv1.AdmissionRequest
		want    string
		schedOK bool
	}{
		{"patch after binding", admissionRequest(t, attacker, admissionv1.Update, "", other, withRec), "may not change it (update pods)", true},
		{"remove", admissionRequest(t, attacker, admissionv1.Update, "", plain, withRec), "may not remove it", true},
		{"status", admissionRequest(t, attacker, admissionv1.Update, "status", withRec, plain), "may not set it (update pods/status)", true},
		{"self-binding", admissionRequest(t, attacker, admissionv1.Create, "binding", binding, nil), "may not set it (create pods/binding)", true},
		{"CPU-only squatter", admissionRequest(t, attacker, admissionv1.Create, "", cpu, nil), "may not set it (create pods)", true},
		{"kube-system controller", admissionRequest(t, "system:serviceaccount:kube-system:replicaset-controller", admissionv1.Create, "", withRec, nil), "only the Tessera scheduler", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, mutate := range []bool{true, false} {
				r := adm.review(tc.req, mutate)
				if r.Allowed || !strings.Contains(r.Result.Message, tc.want) || r.Result.Code != 403 {
					t.Errorf("mutate=%v: %+v, want a 403 mentioning %q", mutate, r.Result, tc.want)
				}
			}
			sched := *tc.req
			sched.UserInfo.Username = DefaultSchedulerUser
			if r := adm.review(&sched, false); r.Allowed != tc.schedOK {
				t.Errorf("the scheduler: allowed=%v (%+v)", r.Allowed, r.Result)
			}
		})
	}
	// Updates that leave the record alone pass.
	for _, req := range []*admissionv1.AdmissionRequest{
		admissionRequest(t, attacker, admissionv1.Update, "", withRec, withRec),
		admissionRequest(t, attacker, admissionv1.Update, "status", plain, plain),
		admissionRequest(t, attacker, admissionv1.Create, "binding", &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Target: corev1.ObjectReference{Name: "n1"}}, nil),
	} {
		if r := adm.review(req, false); !r.Allowed {
			t.Errorf("%s %s refused: %+v", req.Operation, req.SubResource, r.Result)
		}
	}
}

// TestEphemeralContainersChecked: kubectl debug must not add a privileged
// container, or one that overrides the agent's settings, to a GPU pod.
func TestEphemeralContainersChecked(t *testing.T) {
	yes := true
	old := pod(map[string]string{names().Memory: "1000"})
	p := old.DeepCopy()
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debug", SecurityContext: &corev1.SecurityContext{Privileged: &yes}, Env: []corev1.EnvVar{{Name: "LD_PRELOAD", Value: "/x.so"}},
	}}}
	r := testAdmission().review(admissionRequest(t, "someone", admissionv1.Update, "ephemeralcontainers", p, old), false)
	if r.Allowed || !strings.Contains(r.Result.Message, "spec.ephemeralContainers[0].securityContext.privileged") || !strings.Contains(r.Result.Message, "spec.ephemeralContainers[0].env[0].name") {
		t.Errorf("%+v", r.Result)
	}
	p.Spec.EphemeralContainers[0].SecurityContext, p.Spec.EphemeralContainers[0].Env = nil, nil
	if r := testAdmission().review(admissionRequest(t, "someone", admissionv1.Update, "ephemeralcontainers", p, old), false); !r.Allowed {
		t.Errorf("a plain debug container refused: %+v", r.Result)
	}
}

// TestRecordConditionMatchesTheWebhook: the CEL condition that sends
// record writes to the webhook names the same users and annotation.
func TestRecordCondition(t *testing.T) {
	got := RecordWrittenByOthers([]string{"a", "b'c"})
	for _, w := range []string{`request.userInfo.username in ['a', 'b\'c']`, "'tessera.io/allocation' in object.metadata.annotations", "oldObject != null"} {
		if !strings.Contains(got, w) {
			t.Errorf("%s does not contain %s", got, w)
		}
	}
}

// TestShippedPolicyIsPolicies: deploy/admission/policy.yaml is exactly
// the objects Policies builds for the shipped identities, so the policy
// in the API server and the webhook's condition cannot drift apart.
func TestShippedPolicyIsPolicies(t *testing.T) {
	pols, binds := Policies([]string{DefaultSchedulerUser}, []string{DefaultNodeAgentUser})
	var want []any
	for i := range pols {
		want = append(want, pols[i], binds[i])
	}
	docs := strings.Split(string(deploy.AdmissionPolicy), "\n---\n")
	if len(docs) != len(want) {
		t.Fatalf("%d documents, want %d", len(docs), len(want))
	}
	for i, doc := range docs {
		var got, exp map[string]any
		if err := yaml.Unmarshal([]byte(doc), &got); err != nil {
			t.Fatal(err)
		}
		b, err := yaml.Marshal(want[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &exp); err != nil {
			t.Fatal(err)
		}
		delete(exp, "status")
		if !reflect.DeepEqual(got, exp) {
			t.Errorf("document %d differs:\nshipped: %v\nbuilt:   %v", i, got, exp)
		}
	}
	if !strings.Contains(pols[0].Spec.Variables[1].Expression, "'tessera.io/allocation' in object.metadata.annotations") ||
		!strings.Contains(RecordWrittenByOthers([]string{DefaultSchedulerUser}), pols[0].Spec.Variables[1].Expression) {
		t.Error("the policy and the webhook's condition read the record differently")
	}
}
