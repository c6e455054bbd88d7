package webhook

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// cpuPod is a pod asking for no GPU.
func cpuPod() *corev1.Pod {
	return fixtures.MakePod().Namespace("team").Name("cpu").Container("main", map[string]string{"cpu": "1"}).Obj()
}

// TestPodsWithoutGPUsSelectNoGPU: a pod asking for no GPU with
// NVIDIA_VISIBLE_DEVICES=all (or an unprefixed envFrom carrying it) got
// every GPU of its node, outside any share: the webhook checked only pods
// asking for GPUs. Where the environment selects devices, such a pod's
// variable is refused, and envFrom that could carry it is overridden by
// NVIDIA_VISIBLE_DEVICES=void (env wins over envFrom); trusted namespaces
// (monitoring, the GPU operator) are exempt; under CDI or volume mounts
// nothing is done.
func TestPodsWithoutGPUsSelectNoGPU(t *testing.T) {
	adm := testAdmission()
	p := cpuPod()
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	expectRefused(t, adm, p, "spec.containers[0].env[0].name", "NVIDIA_VISIBLE_DEVICES", "asks for no GPU", TrustedLabel)
	p.Spec.NodeName = "gpu-node" // bound by hand: the same refusal
	expectRefused(t, adm, p, "NVIDIA_VISIBLE_DEVICES")

	// envFrom: mutated to void, with a warning; valid once mutated.
	q := cpuPod()
	q.Spec.InitContainers = []corev1.Container{{Name: "init", EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}}}}}
	cm("")(q)
	expectRefused(t, adm, q, "spec.initContainers[0].envFrom[0]", `Secret "s"`, "void")
	out, changed, warnings, err := adm.mutate(q, false)
	if err != nil || !changed || len(warnings) != 2 {
		t.Fatalf("mutate: changed %v, warnings %q, %v", changed, warnings, err)
	}
	for _, c := range append(out.Spec.InitContainers, out.Spec.Containers...) {
		if n := len(c.Env); n == 0 || c.Env[n-1] != (corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}) {
			t.Errorf("container %s env %v", c.Name, c.Env)
		}
	}
	if errs := adm.Validate(out); len(errs) > 0 {
		t.Errorf("the mutated pod is refused: %s", Message(errs))
	}
	if out.Spec.SchedulerName != q.Spec.SchedulerName {
		t.Errorf("a pod without GPUs was sent to %s", out.Spec.SchedulerName)
	}
	// Through the webhook: the mutating pass admits it with the patch and
	// the warnings, the validating pass the patched pod.
	resp := adm.review(admissionRequest(t, "u", admissionv1.Create, "", q, nil), true)
	if !resp.Allowed || resp.Patch == nil || len(resp.Warnings) != 2 {
		t.Errorf("mutating pass: %+v %s %q", resp.Result, resp.Patch, resp.Warnings)
	}
	if resp := adm.review(admissionRequest(t, "u", admissionv1.Create, "", out, nil), false); !resp.Allowed {
		t.Errorf("validating pass: %+v", resp.Result)
	}
	if resp := adm.review(admissionRequest(t, "u", admissionv1.Create, "", q, nil), false); resp.Allowed {
		t.Error("validating pass admitted the unmutated pod")
	}
	// The JSON patch carries the env.
	patch, err := patchFor(q, out)
	if err != nil || !strings.Contains(string(patch), `"/spec/containers/0/env"`) || !strings.Contains(string(patch), `"void"`) {
		t.Errorf("patch %s %v", patch, err)
	}

	// Exempt: trusted namespaces; nothing to do where the environment
	// selects nothing; harmless envFrom prefixes; void itself.
	trusting := testAdmission()
	trusting.Trusted = func(string) bool { return true }
	cdi := testAdmission()
	cdi.DeviceListStrategy = api.DeviceListCDI
	for _, a := range []*Admission{trusting, cdi} {
		if errs := a.Validate(p); len(errs) > 0 {
			t.Errorf("refused: %s", Message(errs))
		}
		if _, changed, _, _ := a.mutate(q, false); changed {
			t.Error("mutated")
		}
	}
	r := cpuPod()
	cm("APP_")(r)
	r.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}
	if errs := adm.Validate(r); len(errs) > 0 {
		t.Errorf("refused: %s", Message(errs))
	}
	if _, changed, _, _ := adm.mutate(r, false); changed {
		t.Error("a harmless pod was mutated")
	}
	// Ephemeral containers added to such a pod: the same rule.
	e := cpuPod()
	e.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}}}}
	resp = adm.review(admissionRequest(t, "someone", admissionv1.Update, "ephemeralcontainers", e, cpuPod()), false)
	if resp.Allowed || !strings.Contains(resp.Result.Message, "spec.ephemeralContainers[0].env[0].name") {
		t.Errorf("%+v", resp.Result)
	}
}

// TestDeviceEnvConditionEvaluates: the condition that sends pods asking
// for no GPU matches exactly the pods deviceEnvFindings and voidDeviceEnv
// act on.
func TestDeviceEnvConditionEvaluates(t *testing.T) {
	prg := celProgram(t, DeviceEnvCondition())
	for name, tc := range map[string]struct {
		mutate func(p *corev1.Pod)
		want   bool
	}{
		"plain": {func(*corev1.Pod) {}, false},
		"env": {func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		}, true},
		"other env": {func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CUDA_DEVICE_ORDER", Value: "x"}}
		}, false},
		"envFrom":           {cm(""), true},
		"envFrom NVIDIA_":   {cm("NVIDIA_"), true},
		"envFrom APP_":      {cm("APP_"), false},
		"envFrom full name": {cm("NVIDIA_VISIBLE_DEVICES"), false},
		"init envFrom": {func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{}}}}}
		}, true},
		"ephemeral env": {func(p *corev1.Pod) {
			p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "e", Env: []corev1.EnvVar{{Name: "NVIDIA_IMEX_CHANNELS"}}}}}
		}, true},
	} {
		p := cpuPod()
		tc.mutate(p)
		if got := evalPod(t, prg, p); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
		if tc.want != (len(deviceEnvFindingsOf(p)) > 0) {
			t.Errorf("%s: the condition and deviceEnvFindings disagree", name)
		}
	}
}

func deviceEnvFindingsOf(p *corev1.Pod) field.ErrorList { return testAdmission().deviceEnvFindings(p) }

func celProgram(t *testing.T, expr string) cel.Program {
	t.Helper()
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		t.Fatal(iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	return prg
}

func evalPod(t *testing.T, prg cel.Program, o any) bool {
	t.Helper()
	raw, _ := json.Marshal(o)
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	out, _, err := prg.Eval(map[string]any{"object": obj})
	if err != nil {
		t.Fatal(err)
	}
	return out.Value().(bool)
}

// TestZeroGPUStripped: pods asking nvidia.com/gpu: 0 that landed on a
// MIG or DRA node were rejected by the kubelet for good ("no healthy
// devices present": its device manager checks the resource's devices
// before it sees that none is needed). The webhook removes GPU resources
// of 0 from containers that ask for no GPU, and leaves such a pod's
// scheduler alone.
func TestZeroGPUStripped(t *testing.T) {
	adm := testAdmission()
	for _, res := range []map[string]string{
		{names().GPU: "0"}, {names().GPU: "0", "cpu": "1"}, {names().Shared(names().GPU): "0"}, {names().MIG("1g.5gb"): "0"},
	} {
		p := pod(res)
		if errs := adm.Validate(p); len(errs) > 0 {
			t.Fatalf("%v refused: %s", res, Message(errs))
		}
		out, changed, warnings, err := adm.mutate(p, false)
		if err != nil || !changed || len(warnings) != 1 || !strings.Contains(warnings[0], "removed GPU resources of 0") {
			t.Fatalf("%v: changed %v warnings %q %v", res, changed, warnings, err)
		}
		c := out.Spec.Containers[0]
		for _, list := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for n := range list {
				if names().IsGPUResource(string(n)) || n == QuotaMemoryResource {
					t.Errorf("%v: %s left", res, n)
				}
			}
		}
		if out.Spec.SchedulerName != corev1.DefaultSchedulerName {
			t.Errorf("%v: sent to %s", res, out.Spec.SchedulerName)
		}
	}
	// A zero beside a container that asks keeps the pod a GPU pod.
	p := pod(map[string]string{names().Memory: "1000"})
	p.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(names().GPU): resource.MustParse("0")}}}}
	out, _, _, err := adm.mutate(p, false)
	if err != nil || out.Spec.SchedulerName != api.SchedulerName || len(out.Spec.InitContainers[0].Resources.Limits) != 0 {
		t.Errorf("%v %v %v", err, out.Spec.SchedulerName, out.Spec.InitContainers[0].Resources.Limits)
	}
	// A zero pod is not held to the GPU pods' isolation rules.
	z := pod(map[string]string{names().GPU: "0"})
	z.Spec.HostPID = true
	if errs := adm.Validate(z); len(errs) > 0 {
		t.Errorf("refused: %s", Message(errs))
	}
}

// TestQuotaChargesWhatAShareIsGiven: on the dynamic-MIG node, gpumem
// 1024 with gpucores 100 was charged 1 GiB but given a 7g.40gb instance
// (40192 MiB): the quota was bypassed by asking little memory and much
// compute. All of a GPU's cores take it whole (on every node kind), so
// they are charged the largest GPU; a share is charged at least the MIG
// instance its cores need on the cluster's MIG nodes.
func TestQuotaChargesWhatAShareIsGiven(t *testing.T) {
	iv := NewInventories(testLogger(t))
	inv := fixtures.Inventory("mig", 1, "NVIDIA A100-SXM4-40GB", 40960, 1)
	inv.GPUs[0].Sharing = api.SharingMIGDynamic
	inv.GPUs[0].SMCount = 108
	inv.GPUs[0].MIG = api.MIG{Capable: true, Enabled: true}
	iv.Set(fixtures.Node("mig", inv, names()))
	adm := testAdmission()
	adm.MIGShareMiB = iv.MIGShareMiB
	charge := func(res map[string]string) int64 {
		t.Helper()
		out, _, err := adm.Mutate(pod(res))
		if err != nil {
			t.Fatal(err)
		}
		q := out.Spec.Containers[0].Resources.Limits[QuotaMemoryResource]
		return q.Value() >> 20
	}
	for _, tc := range []struct {
		res  map[string]string
		want int64
	}{
		{map[string]string{names().Memory: "1024", names().Cores: "100"}, 40960},       // a whole GPU, the largest
		{map[string]string{names().Memory: "1024", names().Cores: "60"}, 40192},        // the 7g instance
		{map[string]string{names().Memory: "1024", names().Cores: "20"}, 9856},         // 2g.10gb
		{map[string]string{names().Memory: "1024"}, 4864},                              // 1g.5gb
		{map[string]string{names().Memory: "8000", names().Cores: "5"}, 9856},          // 1g.10gb
		{map[string]string{names().GPU: "2", names().Memory: "1024"}, 2 * 4864},        // one instance per GPU
		{map[string]string{names().MIG("3g.20gb"): "1"}, 20480},                        // by name, as before
		{map[string]string{names().Memory: "20000", names().Cores: "10"}, 40192},       // more than a 3g.20gb's 19968 MiB: the 7g
		{map[string]string{names().MemoryPercentage: "10", names().Cores: "10"}, 4864}, // 10 % of 40960: 1g.5gb
	} {
		if got := charge(tc.res); got != tc.want {
			t.Errorf("%v: charged %d MiB, want %d", tc.res, got, tc.want)
		}
	}
	// Without MIG nodes, a share is charged its memory.
	iv.Delete("mig")
	if got := charge(map[string]string{names().Memory: "1024", names().Cores: "60"}); got != 1024 {
		t.Errorf("no MIG node: charged %d MiB", got)
	}
}

// TestAuditMode: isolation findings are admitted with warnings, reported
// (the metric and the event), and refusals of requests the scheduler
// cannot honour stay.
func TestAuditMode(t *testing.T) {
	var reported []string
	var audited []bool
	adm := testAdmission()
	adm.Audit = true
	adm.Report = func(_ *corev1.Pod, f field.ErrorList, a bool) {
		for _, e := range f {
			reported = append(reported, FindingCheck(e))
		}
		audited = append(audited, a)
	}
	p := pod(map[string]string{names().Memory: "1000"})
	p.Spec.HostPID = true
	env("NVIDIA_VISIBLE_DEVICES")(p)
	r := adm.review(admissionRequest(t, "u", admissionv1.Create, "", p, nil), true)
	if !r.Allowed || r.Patch == nil {
		t.Fatalf("refused in audit mode: %+v", r.Result)
	}
	joined := strings.Join(r.Warnings, "\n")
	for _, w := range []string{"audit mode, would be refused", "spec.hostPID", "spec.containers[0].env[1].name"} {
		if !strings.Contains(joined, w) {
			t.Errorf("warnings %q do not mention %q", r.Warnings, w)
		}
	}
	if strings.Join(reported, ",") != "env,hostPID" || len(audited) != 1 || !audited[0] {
		t.Errorf("reported %v audited %v", reported, audited)
	}
	// Quantities are refused whatever the mode.
	q := pod(map[string]string{names().Cores: "101"})
	q.Spec.HostPID = true
	if r := adm.review(admissionRequest(t, "u", admissionv1.Create, "", q, nil), true); r.Allowed {
		t.Error("gpucores 101 admitted in audit mode")
	}
	// Enforcing: refused, reported as refused.
	adm.Audit = false
	reported, audited = nil, nil
	if r := adm.review(admissionRequest(t, "u", admissionv1.Create, "", p, nil), true); r.Allowed {
		t.Error("admitted when enforcing")
	}
	if len(audited) != 1 || audited[0] {
		t.Errorf("audited %v", audited)
	}
	for f, want := range map[string]string{"spec.containers[0].securityContext.capabilities.add[0]": "capabilities", "spec.volumes[2].hostPath.path": "hostPath", "spec.containers[1].envFrom[0].prefix": "envFrom", "spec.hostIPC": "hostIPC", "spec.initContainers[0].volumeMounts[0].mountPath": "volumeMounts"} {
		if got := FindingCheck(field.Forbidden(field.NewPath("x"), "")); got != "other" {
			t.Errorf("x: %s", got)
		}
		e := &field.Error{Field: f}
		if got := FindingCheck(e); got != want {
			t.Errorf("%s: %s, want %s", f, got, want)
		}
	}
}

// TestAuditEventTarget: events go to the pod's controller (its pods are
// created with generateName and have no name at admission), else to the
// pod.
func TestAuditEventTarget(t *testing.T) {
	yes := true
	p := cpuPod()
	p.Name = ""
	if eventTarget(p) != nil {
		t.Error("a nameless pod without owner has a target")
	}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", Controller: &yes}}
	if r := eventTarget(p); r == nil || r.Kind != "ReplicaSet" || r.Name != "rs" || r.Namespace != "team" {
		t.Errorf("%+v", r)
	}
	p.OwnerReferences, p.Name = nil, "named"
	if r := eventTarget(p); r == nil || r.Kind != "Pod" || r.Name != "named" {
		t.Errorf("%+v", r)
	}
}

// templateRequest is an admission request for a workload object.
func templateRequest(t *testing.T, kind metav1.GroupVersionKind, op admissionv1.Operation, obj runtime.Object) *admissionv1.AdmissionRequest {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{UID: "u", Kind: kind, Operation: op, Namespace: "team", Name: "w", Object: runtime.RawExtension{Raw: b}}
}

// TestTemplatesConverted: nvidia.com/gpu: 0.5 worked in a bare pod but a
// Deployment (or Job, StatefulSet, …) carrying it was refused by the API
// server ("must be an integer"), which validates templates after
// mutating admission. The templates webhook converts a template as the
// pod mutation converts a pod, and refuses with the template's field
// paths what its pods would be refused for.
func TestTemplatesConverted(t *testing.T) {
	adm := testAdmission()
	tmpl := func(res map[string]string) corev1.PodTemplateSpec {
		p := fixtures.MakePod().Container("main", res).Obj()
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "a"}}, Spec: p.Spec}
	}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "team"}, Spec: appsv1.DeploymentSpec{Template: tmpl(map[string]string{names().GPU: "0.5"})}}
	kind := metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
		r := adm.review(templateRequest(t, kind, op, d), true)
		if !r.Allowed || r.Patch == nil {
			t.Fatalf("%s: %+v", op, r.Result)
		}
		raw, _ := json.Marshal(d)
		patch, err := jsonpatch.DecodePatch(r.Patch)
		if err != nil {
			t.Fatal(err)
		}
		patched, err := patch.Apply(raw)
		if err != nil {
			t.Fatal(err)
		}
		var got appsv1.Deployment
		if err := json.Unmarshal(patched, &got); err != nil {
			t.Fatal(err)
		}
		c := got.Spec.Template.Spec.Containers[0]
		for n, want := range map[string]int64{names().GPU: 1, names().MemoryPercentage: 50, names().Cores: 50} {
			l, req := c.Resources.Limits[corev1.ResourceName(n)], c.Resources.Requests[corev1.ResourceName(n)]
			if l.String() != req.String() || l.Value() != want || l.String() != resource.NewQuantity(want, resource.DecimalSI).String() {
				t.Errorf("%s: %s limit %s request %s, want %d", op, n, l.String(), req.String(), want)
			}
		}
		if _, ok := c.Resources.Limits[QuotaMemoryResource]; ok || got.Spec.Template.Spec.SchedulerName != "" {
			t.Error("the template got what its pods get")
		}
	}
	// CronJob: the job template's pod template.
	cj := map[string]any{"apiVersion": "batch/v1", "kind": "CronJob", "metadata": map[string]any{"name": "w"}, "spec": map[string]any{"schedule": "* * * * *",
		"jobTemplate": map[string]any{"spec": map[string]any{"template": tmpl(map[string]string{names().GPU: "0.25"})}}}}
	r := adm.review(templateRequest(t, metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"}, admissionv1.Create, &unstructured.Unstructured{Object: cj}), true)
	if !r.Allowed || !strings.Contains(string(r.Patch), "/spec/jobTemplate/spec/template/spec/containers/0/resources") {
		t.Errorf("CronJob: %+v %s", r.Result, r.Patch)
	}
	// Refused with the template's paths and the workload named.
	bad := d.DeepCopy()
	bad.Spec.Template = tmpl(map[string]string{names().GPU: "1.5"})
	bad.Spec.Template.Spec.HostPID = true
	r = adm.review(templateRequest(t, kind, admissionv1.Create, bad), true)
	if r.Allowed || !strings.Contains(r.Result.Message, "Deployment w: its pods would be refused") ||
		!strings.Contains(r.Result.Message, "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]") ||
		!strings.Contains(r.Result.Message, "spec.template.spec.hostPID") {
		t.Errorf("%+v", r.Result)
	}
	// A template asking no GPU: its zeros stripped, nothing refused.
	z := d.DeepCopy()
	z.Spec.Template = tmpl(map[string]string{names().GPU: "0"})
	cm("")(&corev1.Pod{Spec: z.Spec.Template.Spec})
	if r := adm.review(templateRequest(t, kind, admissionv1.Create, z), true); !r.Allowed || !strings.Contains(string(r.Patch), "resources") {
		t.Errorf("zero template: %+v %s", r.Result, r.Patch)
	}
}

func testLogger(t *testing.T) klog.Logger { return ktesting.NewLogger(t, ktesting.NewConfig()) }

// TestDRAPodsUnderTheSameRules: DRA pods skipped the env and mount
// checks (the webhook validated only device-plugin resources). A pod
// holding GPUs through claims of a GPU class (or through claims not
// created yet, which may be) is held to the rules of GPU pods; one whose
// claims are of other classes is not.
func TestDRAPodsUnderTheSameRules(t *testing.T) {
	f := newFakeClaims()
	f.template("team", "gpu", memSpec(1, "4Gi"))
	nic := memSpec(1, "")
	nic.Devices.Requests[0].Exactly.DeviceClassName = "nic.example.com"
	f.template("team", "nic", nic)
	adm := claimAdmission(f)
	for name, mutate := range map[string]func(p *corev1.Pod){
		"env":         env("NVIDIA_VISIBLE_DEVICES"),
		"envFrom":     cm(""),
		"mount above": mount("/etc"),
		"hostPID":     func(p *corev1.Pod) { p.Spec.HostPID = true },
		"preload decl": func(p *corev1.Pod) {
			p.Annotations = map[string]string{api.AnnotationPreload: "/usr/lib/libjemalloc.so.2"}
		},
	} {
		for _, tpl := range []string{"gpu", "not-yet-created"} {
			p := claimsPod("team", tpl)
			mutate(p)
			r := adm.review(admissionRequest(t, "u", admissionv1.Create, "", p, nil), true)
			if r.Allowed {
				t.Errorf("%s (%s): admitted", name, tpl)
			}
		}
		p := claimsPod("team", "nic")
		mutate(p)
		if name == "preload decl" || name == "mount above" || name == "hostPID" {
			if r := adm.review(admissionRequest(t, "u", admissionv1.Create, "", p, nil), true); !r.Allowed {
				t.Errorf("%s on a NIC claim pod: %+v", name, r.Result)
			}
		}
	}
	// A plain GPU claims pod passes.
	if r := adm.review(admissionRequest(t, "u", admissionv1.Create, "", claimsPod("team", "gpu"), nil), true); !r.Allowed {
		t.Errorf("%+v", r.Result)
	}
}

// TestTemplateMatchConditionEvaluates: the templates hook's condition
// matches a workload whose template names a GPU resource, in every
// template kind, and evaluates without error on objects missing fields
// (an error would refuse them under failurePolicy Fail).
func TestTemplateMatchConditionEvaluates(t *testing.T) {
	prg := celProgram(t, TemplateMatchCondition(api.DefaultResourceNames))
	spec := func(res string) map[string]any {
		return map[string]any{"containers": []any{map[string]any{"name": "c", "resources": map[string]any{"limits": map[string]any{res: "1"}}}}}
	}
	for name, tc := range map[string]struct {
		obj  map[string]any
		want bool
	}{
		"deployment":          {map[string]any{"spec": map[string]any{"template": map[string]any{"spec": spec("nvidia.com/gpu")}}}, true},
		"deployment cpu":      {map[string]any{"spec": map[string]any{"template": map[string]any{"spec": spec("cpu")}}}, false},
		"cronjob":             {map[string]any{"spec": map[string]any{"jobTemplate": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": spec("nvidia.com/gpumem")}}}}}, true},
		"podtemplate":         {map[string]any{"template": map[string]any{"spec": spec("nvidia.com/mig-1g.5gb")}}, true},
		"no template":         {map[string]any{"spec": map[string]any{"replicas": 1}}, false},
		"no jobTemplate spec": {map[string]any{"spec": map[string]any{"jobTemplate": map[string]any{}}}, false},
		"no containers":       {map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{}}}}, false},
		"init container": {map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c"}},
			"initContainers": []any{map[string]any{"name": "i", "resources": map[string]any{"requests": map[string]any{"nvidia.com/gpu": "1"}}}}}}}}, true},
	} {
		out, _, err := prg.Eval(map[string]any{"object": tc.obj})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if out.Value() != tc.want {
			t.Errorf("%s: %v, want %v", name, out.Value(), tc.want)
		}
	}
}
