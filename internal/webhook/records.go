package webhook

// Only the scheduler may write allocation records. The API server enforces
// it twice: the ValidatingAdmissionPolicy shipped in deploy/ (CEL, inside
// the API server) and this webhook's records.pods.tessera.io, on pod
// create and update, the binding, status, ephemeral-containers and resize
// subresources, in every namespace. RecordWrittenByOthers is the one
// spelling of the condition; the policy's manifest is tested against it.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// DefaultSchedulerUser is the identity of the shipped scheduler: the
// ServiceAccount of deploy/scheduler/scheduler.yaml.
const DefaultSchedulerUser = "system:serviceaccount:tessera-system:tessera-scheduler"

// DefaultNodeAgentUser is the identity of the shipped node agents
// (deploy/node-agent/node-agent.yaml), the only writer of inventories.
const DefaultNodeAgentUser = "system:serviceaccount:tessera-system:tessera-node-agent"

// RecordSubresources are the pod subresources through which a record can
// be set or changed: the binding copies its annotations onto the pod, and
// status, ephemeral-container and resize updates carry the pod's metadata.
var RecordSubresources = []string{"pods", "pods/binding", "pods/status", "pods/ephemeralcontainers", "pods/resize"}

func celList(users []string) string {
	q := make([]string, len(users))
	for i, u := range users {
		q[i] = "'" + strings.ReplaceAll(u, "'", `\'`) + "'"
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// annotationCEL is the value of annotation key on obj, "" when absent.
func annotationCEL(obj, key string) string {
	return fmt.Sprintf("(%[1]s != null && has(%[1]s.metadata.annotations) && '%[2]s' in %[1]s.metadata.annotations ? %[1]s.metadata.annotations['%[2]s'] : '')", obj, key)
}

// AnnotationWrittenByOthers is the CEL condition, over an admission
// request, "someone other than users sets, changes or removes annotation
// key": the object's value differs from the old object's (a create has
// none).
func AnnotationWrittenByOthers(key string, users []string) string {
	return fmt.Sprintf("!(request.userInfo.username in %s) && %s != %s", celList(users), annotationCEL("object", key), annotationCEL("oldObject", key))
}

// RecordWrittenByOthers is AnnotationWrittenByOthers for the allocation
// record.
func RecordWrittenByOthers(users []string) string {
	return AnnotationWrittenByOthers(api.AnnotationAllocation, users)
}

func (p *Admission) schedulerUsers() []string {
	if len(p.SchedulerUsers) == 0 {
		return []string{DefaultSchedulerUser}
	}
	return p.SchedulerUsers
}

// recordWrite denies a request by anyone but the scheduler that sets,
// changes or removes the allocation record, whatever object carries it
// (a Pod, or a Binding whose annotations the API server copies onto the
// pod). It returns nil when the request leaves the record alone.
func (p *Admission) recordWrite(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if slices.Contains(p.schedulerUsers(), req.UserInfo.Username) {
		return nil
	}
	read := func(raw []byte) (string, bool, error) {
		if len(raw) == 0 {
			return "", false, nil
		}
		var obj struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return "", false, err
		}
		v, ok := obj.Metadata.Annotations[api.AnnotationAllocation]
		return v, ok, nil
	}
	now, has, err := read(req.Object.Raw)
	if err != nil {
		return deny(400, fmt.Sprintf("decoding the %s: %v", req.Kind.Kind, err))
	}
	was, had, err := read(req.OldObject.Raw)
	if err != nil {
		return deny(400, fmt.Sprintf("decoding the old %s: %v", req.Kind.Kind, err))
	}
	if now == was && has == had {
		return nil
	}
	what := "set"
	switch {
	case had && !has:
		what = "remove"
	case had:
		what = "change"
	}
	target := "pods"
	if req.SubResource != "" {
		target += "/" + req.SubResource
	}
	return forbid(fmt.Sprintf("metadata.annotations[%s]: only the Tessera scheduler (%s) may set, change or remove a pod's GPU allocation record; %q may not %s it (%s %s)",
		api.AnnotationAllocation, strings.Join(p.schedulerUsers(), ", "), req.UserInfo.Username, what, strings.ToLower(string(req.Operation)), target))
}

func forbid(msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden, Message: "tessera: " + msg},
	}
}
