package webhook

// Pod templates of the workloads users deploy. The API server validates a
// Deployment's (or Job's, …) pod template as it validates a pod, and
// refuses a fractional extended resource there ("must be an integer") in
// object validation, after mutating admission: so the fractional form
// (nvidia.com/gpu: 0.5) that the mutating webhook converts in pods would
// be unusable in the objects users deploy. The templates webhook converts
// a template's GPU resources as Mutate converts a pod's (without the
// quota charge and the scheduler name, which its pods get when they are
// created) and checks the template by the pod rules, so a template its
// pods would be refused for is refused when it is applied, with the
// template's field paths. Custom resources (PyTorchJob, RayCluster, …)
// are not validated that way by the API server; their pods are converted
// when the operator creates them.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// templateKind is a workload resource whose objects carry a pod template.
type templateKind struct {
	Group, Version, Resource, Kind string
	// Pointer is the JSON pointer of the pod template in the object.
	Pointer string
}

// TemplateKinds are the workload resources of Kubernetes whose pod
// templates the API server validates as pods.
func TemplateKinds() []templateKind {
	return []templateKind{
		{"apps", "v1", "deployments", "Deployment", "/spec/template"},
		{"apps", "v1", "statefulsets", "StatefulSet", "/spec/template"},
		{"apps", "v1", "daemonsets", "DaemonSet", "/spec/template"},
		{"apps", "v1", "replicasets", "ReplicaSet", "/spec/template"},
		{"batch", "v1", "jobs", "Job", "/spec/template"},
		{"batch", "v1", "cronjobs", "CronJob", "/spec/jobTemplate/spec/template"},
		{"", "v1", "replicationcontrollers", "ReplicationController", "/spec/template"},
		{"", "v1", "podtemplates", "PodTemplate", "/template"},
	}
}

// templatePaths maps each template kind to its pointer.
var templatePaths = func() map[string]string {
	m := map[string]string{}
	for _, k := range TemplateKinds() {
		m[k.Kind] = k.Pointer
	}
	return m
}()

// templateAt returns the value at a JSON pointer of a decoded object.
func templateAt(obj map[string]any, pointer string) (any, bool) {
	var cur any = obj
	for _, part := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// reviewTemplate converts and checks the pod template of a workload.
func (p *Admission) reviewTemplate(req *admissionv1.AdmissionRequest, mutate bool) *admissionv1.AdmissionResponse {
	pointer := templatePaths[req.Kind.Kind]
	if req.SubResource != "" || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var obj map[string]any
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return deny(http.StatusBadRequest, fmt.Sprintf("decoding the %s: %v", req.Kind.Kind, err))
	}
	raw, ok := templateAt(obj, pointer)
	if !ok {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return deny(http.StatusBadRequest, err.Error())
	}
	var tmpl corev1.PodTemplateSpec
	if err := json.Unmarshal(b, &tmpl); err != nil {
		return deny(http.StatusBadRequest, fmt.Sprintf("decoding the pod template of the %s: %v", req.Kind.Kind, err))
	}
	pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	pod.Namespace = req.Namespace
	pod.Name = req.Name
	// Events about the template go to the workload.
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: groupVersion(req.Kind), Kind: req.Kind.Kind, Name: req.Name, UID: req.UID, Controller: ptrTrue()}}
	claimGPU, err := p.claimsHoldGPUs(pod)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	errs, findings := p.check(pod, claimGPU)
	if !claimGPU && !p.asksGPU(pod) {
		// A template that asks for no GPU (nvidia.com/gpu: 0): its pods'
		// environment is made safe when they are created (voidDeviceEnv).
		findings = nil
	}
	prefix := strings.ReplaceAll(strings.TrimPrefix(pointer, "/"), "/", ".") + "."
	at := func(list field.ErrorList) field.ErrorList {
		out := make(field.ErrorList, len(list))
		for i, e := range list {
			c := *e
			c.Field = prefix + c.Field
			out[i] = &c
		}
		return out
	}
	r := p.verdict(pod, at(errs), at(findings), nil)
	if !r.Allowed || !mutate {
		if !r.Allowed {
			r.Result.Message = strings.Replace(r.Result.Message, "tessera: ", fmt.Sprintf("tessera: %s %s: its pods would be refused: ", req.Kind.Kind, req.Name), 1)
		}
		return r
	}
	out := pod.DeepCopy()
	changed, warnings, err := p.mutateResources(out, false)
	if err != nil {
		return deny(http.StatusUnprocessableEntity, err.Error())
	}
	for i := range warnings {
		warnings[i] = strings.Replace(warnings[i], "tessera: spec.", "tessera: "+prefix+"spec.", 1)
	}
	r.Warnings = append(r.Warnings, warnings...)
	if !changed {
		return r
	}
	ops, err := containerOps(nil, pointer+"/spec", &pod.Spec, &out.Spec)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	pt := admissionv1.PatchTypeJSONPatch
	r.Patch, r.PatchType = patch, &pt
	return r
}

func groupVersion(k metav1.GroupVersionKind) string {
	if k.Group == "" {
		return k.Version
	}
	return k.Group + "/" + k.Version
}

func ptrTrue() *bool { t := true; return &t }
