package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/volcano"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Paths the webhook serves.
const (
	MutatePath   = "/mutate"
	ValidatePath = "/validate"
)

// maxReviewBytes bounds a request body (the API server caps objects at
// a few MiB).
const maxReviewBytes = 8 << 20

// Handler serves AdmissionReview requests for Pods.
func (p *Admission) Handler(logger klog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(MutatePath, func(w http.ResponseWriter, r *http.Request) { p.serve(logger, w, r, true) })
	mux.HandleFunc(ValidatePath, func(w http.ResponseWriter, r *http.Request) { p.serve(logger, w, r, false) })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	return mux
}

func (p *Admission) serve(logger klog.Logger, w http.ResponseWriter, r *http.Request, mutate bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	if err != nil || len(body) > maxReviewBytes {
		http.Error(w, fmt.Sprintf("reading the AdmissionReview: body over %d bytes or unreadable", maxReviewBytes), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "request body is not an AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	resp := p.review(review.Request, mutate)
	resp.UID = review.Request.UID
	if !resp.Allowed {
		logger.V(2).Info("Rejected pod", "namespace", review.Request.Namespace, "name", review.Request.Name, "mutate", mutate, "reason", resp.Result.Message)
	}
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		logger.Error(err, "Writing the AdmissionReview response")
	}
}

// review decides one admission request: a write of the allocation record
// by anyone but the scheduler is refused whatever carries it; a pod
// created with GPU resources or GPU claims is validated (and mutated), as
// is one that holds none where its environment selects devices; ephemeral
// containers added to a pod are held to the same rules as its others; a
// workload's pod template naming GPU resources is converted and checked
// as its pods will be (templates.go).
func (p *Admission) review(req *admissionv1.AdmissionRequest, mutate bool) *admissionv1.AdmissionResponse {
	if req.Kind.Kind == "Pod" || req.Kind.Kind == "Binding" {
		if r := p.recordWrite(req); r != nil {
			return r
		}
	}
	if req.Kind.Kind == "ResourceClaim" && req.Kind.Group == "resource.k8s.io" && !mutate {
		return p.reviewClaim(req) // draquota.go
	}
	if _, ok := templatePaths[req.Kind.Kind]; ok && req.Kind.Kind != "Pod" {
		return p.reviewTemplate(req, mutate) // templates.go
	}
	if req.Kind.Kind != "Pod" {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny(http.StatusBadRequest, fmt.Sprintf("decoding the pod: %v", err))
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	if pod.Name == "" {
		pod.Name = req.Name
	}
	switch {
	case req.SubResource == "ephemeralcontainers":
		claimGPU, err := p.claimsHoldGPUs(&pod)
		if err != nil {
			return deny(http.StatusInternalServerError, err.Error())
		}
		var findings field.ErrorList
		if p.asksGPU(&pod) || claimGPU || volcano.RequestsVGPU(&pod) {
			findings = append(p.injectionErrors(&pod), p.isolationErrors(&pod)...)
		} else {
			findings = p.deviceEnvFindings(&pod)
		}
		return p.verdict(&pod, nil, findings, nil)
	case req.SubResource != "" || req.Operation != admissionv1.Create:
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if volcano.RequestsVGPU(&pod) {
		// Volcano places it and the webhook changes nothing (volcano.go).
		errs, findings := p.checkVolcano(&pod)
		return p.verdict(&pod, errs, findings, nil)
	}
	claimGPU, err := p.claimsHoldGPUs(&pod)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	// In the mutating pass, a pod that asks for no GPU is checked as the
	// mutation will make it (NVIDIA_VISIBLE_DEVICES=void where envFrom
	// could set it: voidDeviceEnv); the validating pass sees it so.
	checked := &pod
	if mutate && !claimGPU && !p.asksGPU(&pod) {
		checked = pod.DeepCopy()
		p.voidDeviceEnv(checked)
	}
	errs, findings := p.check(checked, claimGPU)
	r := p.verdict(&pod, errs, findings, nil)
	if !r.Allowed || !mutate {
		return r
	}
	if claimGPU && pod.Spec.SchedulerName == api.VolcanoSchedulerName && !kubeobj.RequestsGPU(&pod, p.Names) {
		return withWarnings(p.reviewVolcanoClaims(&pod), r.Warnings) // volcano.go
	}
	out, changed, warnings, err := p.mutate(&pod, claimGPU)
	return withWarnings(patchResponse(&pod, out, changed, err), append(r.Warnings, warnings...))
}

// verdict decides on what check found: refused with errs; refused with
// the isolation findings unless in audit mode, where they are warnings
// (with the mutation's warnings); every finding is reported (audit.go).
func (p *Admission) verdict(pod *corev1.Pod, errs, findings field.ErrorList, warnings []string) *admissionv1.AdmissionResponse {
	if len(findings) > 0 && p.Report != nil {
		p.Report(pod, findings, p.Audit && len(errs) == 0)
	}
	if !p.Audit {
		errs = append(errs, findings...)
	}
	if len(errs) > 0 {
		return deny(http.StatusUnprocessableEntity, Message(errs))
	}
	var w []string
	for _, f := range findings {
		w = append(w, "tessera (audit mode, would be refused): "+f.Error())
	}
	return &admissionv1.AdmissionResponse{Allowed: true, Warnings: append(w, warnings...)}
}

// withWarnings adds warnings to an admitting response.
func withWarnings(r *admissionv1.AdmissionResponse, w []string) *admissionv1.AdmissionResponse {
	if r.Allowed {
		r.Warnings = append(r.Warnings, w...)
	}
	return r
}

// patchResponse admits a pod with the JSON patch from pod to out: denied
// with the mutation's error, admitted unchanged when nothing changed.
func patchResponse(pod, out *corev1.Pod, changed bool, err error) *admissionv1.AdmissionResponse {
	if err != nil {
		return deny(http.StatusUnprocessableEntity, err.Error())
	}
	if !changed {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	patch, err := patchFor(pod, out)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt}
}

func deny(code int32, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: metav1.StatusReasonInvalid, Message: "tessera: " + msg},
	}
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// patchFor replaces the scheduler name and the resources and environment
// of each changed container: whole-field replacements keep the patch
// simple and exact.
func patchFor(old, pod *corev1.Pod) ([]byte, error) {
	var ops []jsonPatchOp
	if old.Spec.SchedulerName != pod.Spec.SchedulerName {
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/schedulerName", Value: pod.Spec.SchedulerName})
	}
	ops, err := containerOps(ops, "/spec", &old.Spec, &pod.Spec)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ops)
}

// containerOps appends the operations that turn the containers of spec
// old (at the JSON pointer base) into those of spec new: each changed
// resources and env field replaced whole.
func containerOps(ops []jsonPatchOp, base string, old, new *corev1.PodSpec) ([]jsonPatchOp, error) {
	add := func(kind string, olds, news []corev1.Container) error {
		for i := range news {
			for _, f := range []struct {
				name string
				a, b any
			}{{"resources", olds[i].Resources, news[i].Resources}, {"env", olds[i].Env, news[i].Env}} {
				a, err := json.Marshal(f.a)
				if err != nil {
					return err
				}
				b, err := json.Marshal(f.b)
				if err != nil {
					return err
				}
				if string(a) != string(b) {
					ops = append(ops, jsonPatchOp{Op: "add", Path: fmt.Sprintf("%s/%s/%d/%s", base, kind, i, f.name), Value: f.b})
				}
			}
		}
		return nil
	}
	if err := add("initContainers", old.InitContainers, new.InitContainers); err != nil {
		return nil, err
	}
	if err := add("containers", old.Containers, new.Containers); err != nil {
		return nil, err
	}
	return ops, nil
}
