package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// created with GPU resources is validated (and mutated); ephemeral
// containers added to a GPU pod are held to the same rules as its others.
func (p *Admission) review(req *admissionv1.AdmissionRequest, mutate bool) *admissionv1.AdmissionResponse {
	if req.Kind.Kind == "Pod" || req.Kind.Kind == "Binding" {
		if r := p.recordWrite(req); r != nil {
			return r
		}
	}
	if req.Kind.Kind == "ResourceClaim" && req.Kind.Group == "resource.k8s.io" && !mutate {
		return p.reviewClaim(req) // draquota.go
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
		if !kubeobj.RequestsGPU(&pod, p.Names) && !volcano.RequestsVGPU(&pod) {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
		errs := append(p.injectionErrors(&pod), p.isolationErrors(&pod)...)
		if len(errs) > 0 {
			return deny(http.StatusUnprocessableEntity, Message(errs))
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	case req.SubResource != "" || req.Operation != admissionv1.Create:
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if volcano.RequestsVGPU(&pod) {
		return p.reviewVolcano(&pod) // volcano.go
	}
	if pod.Spec.SchedulerName == api.VolcanoSchedulerName && !kubeobj.RequestsGPU(&pod, p.Names) {
		return p.reviewVolcanoClaims(&pod, mutate) // volcano.go
	}
	if !kubeobj.RequestsGPU(&pod, p.Names) {
		// A pod whose GPUs come through ResourceClaims (the match
		// condition sends pods with spec.resourceClaims): only the
		// quota charge of its claims is Tessera's business.
		if !mutate {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
		out := pod.DeepCopy()
		changed, err := p.mutateClaims(out)
		return patchResponse(&pod, out, changed, err)
	}
	if errs := p.Validate(&pod); len(errs) > 0 {
		return deny(http.StatusUnprocessableEntity, Message(errs))
	}
	if !mutate {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	out, changed, err := p.Mutate(&pod)
	return patchResponse(&pod, out, changed, err)
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

// patchFor replaces the scheduler name and the resources of each changed
// container: whole-field replacements keep the patch simple and exact.
func patchFor(old, pod *corev1.Pod) ([]byte, error) {
	var ops []jsonPatchOp
	if old.Spec.SchedulerName != pod.Spec.SchedulerName {
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/schedulerName", Value: pod.Spec.SchedulerName})
	}
	add := func(kind string, olds, news []corev1.Container) error {
		for i := range news {
			a, err := json.Marshal(olds[i].Resources)
			if err != nil {
				return err
			}
			b, err := json.Marshal(news[i].Resources)
			if err != nil {
				return err
			}
			if string(a) != string(b) {
				ops = append(ops, jsonPatchOp{Op: "add", Path: fmt.Sprintf("/spec/%s/%d/resources", kind, i), Value: news[i].Resources})
			}
		}
		return nil
	}
	if err := add("initContainers", old.Spec.InitContainers, pod.Spec.InitContainers); err != nil {
		return nil, err
	}
	if err := add("containers", old.Spec.Containers, pod.Spec.Containers); err != nil {
		return nil, err
	}
	return json.Marshal(ops)
}
