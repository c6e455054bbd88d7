package webhook

import (
	"encoding/json"
	"fmt"
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

// TestInjectionOverridesRefused: finding 5, re-derived from what holds a
// tenant to its share. What is still refused takes effect before the
// container's code runs (the runtime's device selection, where it reads
// the environment) or hides what the node agent mounts (the limits file,
// the preload list, the limiter, its state).
func TestInjectionOverridesRefused(t *testing.T) {
	share := map[string]string{names().Memory: "1000"}
	cases := []struct {
		name   string
		mutate func(p *corev1.Pod)
		want   []string
	}{
		{"all GPUs", env("NVIDIA_VISIBLE_DEVICES"), []string{"spec.containers[0].env[1].name", "NVIDIA_VISIBLE_DEVICES", "selects the container's GPUs before its code runs", "envvar"}},
		{"MIG config devices", env("NVIDIA_MIG_CONFIG_DEVICES"), []string{"NVIDIA_MIG_CONFIG_DEVICES"}},
		{"IMEX channels", env("NVIDIA_IMEX_CHANNELS"), []string{"NVIDIA_IMEX_CHANNELS"}},
		{"envFrom without prefix", cm(""), []string{"spec.containers[0].envFrom[0]", `ConfigMap "cfg" without a prefix`, "NVIDIA_VISIBLE_DEVICES"}},
		{"envFrom reaching NVIDIA_", cm("NVIDIA_"), []string{"spec.containers[0].envFrom[0].prefix", `"NVIDIA_"`}},
		{"envFrom reaching NVIDIA_VISIBLE_", cm("NVIDIA_VISIBLE_"), []string{`"NVIDIA_VISIBLE_"`}},
		{"mount over the preload list", mount("/etc/ld.so.preload"), []string{"spec.containers[0].volumeMounts[0].mountPath", "/etc/ld.so.preload"}},
		{"mount over the limits file", mount("/etc/tessera"), []string{"/etc/tessera"}},
		{"mount under the limits dir", mount("/etc/tessera/limiter.conf"), []string{"/etc/tessera/limiter.conf"}},
		{"mount over the library", mount("/usr/local/tessera/"), []string{"/usr/local/tessera"}},
		{"mount over the state", mount("/tessera/state/cache"), []string{"/tessera/state/cache"}},
		{"sidecar without GPU sets the env", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "side", Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}})
		}, []string{"spec.containers[1].env[0].name"}},
		{"bad preload declaration", func(p *corev1.Pod) {
			p.Annotations = map[string]string{api.AnnotationPreload: "/tmp/libjemalloc.so"}
		}, []string{"metadata.annotations[tessera.io/preload]", "/tmp/libjemalloc.so", "must be under"}},
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
	// Allowed: other variables, prefixed envFrom, mounts elsewhere.
	p := pod(share)
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CUDA_VISIBLE_DEVICES", Value: "0"}, {Name: "TESSERA_LIMITER_DEBUG", Value: "1"}, {Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "compute"}}
	cm("APP_")(p)
	mount("/etc/config")(p)
	if errs := testAdmission().Validate(p); len(errs) > 0 {
		t.Errorf("refused: %s", Message(errs))
	}
}

func env(name string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "OK", Value: "1"}, {Name: name, Value: "0"}}
	}
}

func cm(prefix string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: prefix, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
	}
}

func mount(path string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: path}}
	}
}

// TestLiftedRefusalsAdmitted: the refusals the principle lifts. Each was
// refused before (TestInjectionOverridesRefused listed them); each takes
// effect only inside the container, where the tenant could set it
// anyway, and the limiter takes its limits from the read-only limits file
// over every variable. Admitted, the pod is given exactly the share it
// asks (the defaults and the quota charge the webhook writes; the node
// agent's limits file for the share: deviceplugin
// TestSpecEnvironmentChangesNoShare; the limiter holding it:
// limiter/test file-over-env, the tcmalloc-style interposer).
func TestLiftedRefusalsAdmitted(t *testing.T) {
	for _, name := range []string{
		"CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
		"LD_PRELOAD", "LD_AUDIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PIPE_DIRECTORY", "TESSERA_SM_ELASTIC",
		"GPU_CORE_UTILIZATION_POLICY", "CUDA_DISABLE_CONTROL", "CUDA_OVERSUBSCRIBE", "CUDA_DEVICE_ORDER", "CUDA_DEVICE_MAX_CONNECTIONS",
	} {
		t.Run(name, func(t *testing.T) {
			p := pod(map[string]string{names().Memory: "1000"})
			env(name)(p)
			expectShare(t, testAdmission(), p, 1000)
		})
	}
	// envFrom with a prefix reaching the limiter's names, but no
	// device-selecting one.
	for _, prefix := range []string{"CUDA_", "CUDA_DEVICE_", "LD_", "TESSERA_"} {
		p := pod(map[string]string{names().Memory: "1000"})
		cm(prefix)(p)
		expectShare(t, testAdmission(), p, 1000)
	}
}

// expectShare asserts that p is admitted and mutated to exactly memMiB of
// one GPU, charged memMiB to the GPU memory quota.
func expectShare(t *testing.T, adm *Admission, p *corev1.Pod, memMiB int64) {
	t.Helper()
	if errs := adm.Validate(p); len(errs) > 0 {
		t.Fatalf("refused: %s", Message(errs))
	}
	out, _, err := adm.Mutate(p)
	if err != nil {
		t.Fatal(err)
	}
	lim := out.Spec.Containers[0].Resources.Limits
	gpu, mem, charge := lim[corev1.ResourceName(names().GPU)], lim[corev1.ResourceName(names().Memory)], lim[QuotaMemoryResource]
	if gpu.Value() != 1 || mem.Value() != memMiB || charge.Value() != memMiB<<20 {
		t.Errorf("admitted with limits %v, want 1 GPU, %d MiB, charged %d MiB", lim, memMiB, memMiB)
	}
}

// TestDeviceSelectionPerStrategy: where the node agents pass GPUs by CDI
// or volume mounts (and the runtime ignores the environment of
// unprivileged containers), the environment selects nothing: the device
// variables and unprefixed envFrom are admitted; the envFrom rule can
// still be set either way.
func TestDeviceSelectionPerStrategy(t *testing.T) {
	share := map[string]string{names().Memory: "1000"}
	for _, s := range []api.DeviceListStrategy{api.DeviceListCDI, api.DeviceListVolumeMounts} {
		adm := testAdmission()
		adm.DeviceListStrategy = s
		p := pod(share)
		env("NVIDIA_VISIBLE_DEVICES")(p)
		cm("")(p)
		expectShare(t, adm, p, 1000)
		adm.UnprefixedEnvFrom = EnvFromRefuse
		expectRefused(t, adm, p, "without a prefix")
	}
	// Under envvar, allow is the administrator's word (the earlier flag
	// says the same).
	for _, adm := range []*Admission{{UnprefixedEnvFrom: EnvFromAllow}, {AllowUnprefixedEnvFrom: true}} {
		a := testAdmission()
		a.UnprefixedEnvFrom, a.AllowUnprefixedEnvFrom = adm.UnprefixedEnvFrom, adm.AllowUnprefixedEnvFrom
		p := pod(share)
		cm("")(p)
		expectShare(t, a, p, 1000)
	}
}

// TestMountsAboveTheAgentsPaths: an emptyDir over /etc or /usr/local in
// a share hid the preload list and the limits file in the lab's runtime
// (the container held 40960 MiB against a 4096 MiB record). Every
// ancestor of a path the agent mounts is refused, naming the path.
func TestMountsAboveTheAgentsPaths(t *testing.T) {
	for _, path := range []string{"/etc", "/etc/", "/usr/local", "/usr", "/", "/tessera", "//etc//"} {
		p := pod(map[string]string{names().Memory: "4096"})
		mount(path)(p)
		expectRefused(t, testAdmission(), p, "spec.containers[0].volumeMounts[0].mountPath", fmt.Sprintf("%q is above", path), "can hide them")
	}
	for _, path := range []string{"/etc/app", "/usr/local/app", "/tesseract", "/etc/tesseract"} {
		p := pod(map[string]string{names().Memory: "4096"})
		mount(path)(p)
		if errs := testAdmission().Validate(p); len(errs) > 0 {
			t.Errorf("%s refused: %s", path, Message(errs))
		}
	}
	// Block devices too.
	p := pod(map[string]string{names().Memory: "4096"})
	p.Spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "b", DevicePath: "/etc"}}
	expectRefused(t, testAdmission(), p, "volumeDevices[0].devicePath", `"/etc" is above`)
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
		Name: "debug", SecurityContext: &corev1.SecurityContext{Privileged: &yes}, Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}},
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
