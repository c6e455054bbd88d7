package webhook

// The ValidatingAdmissionPolicies shipped in deploy/admission/: the API
// server itself refuses a write of an allocation record by anyone but the
// scheduler, and of a node inventory by anyone but the node agents, with
// no webhook involved. Policies builds them; deploy/admission/policy.yaml
// is tested to be exactly these objects.

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// Names of the shipped policies (and of their bindings).
const (
	RecordPolicyName    = "tessera-allocation-records"
	InventoryPolicyName = "tessera-gpu-inventories"
)

// Policies returns the policy that only schedulerUsers may write
// allocation records (pods and the subresources in RecordSubresources,
// every namespace) and the one that only agentUsers may write node
// inventories, each with its binding (action Deny).
func Policies(schedulerUsers, agentUsers []string) ([]*admissionregistrationv1.ValidatingAdmissionPolicy, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	fail := admissionregistrationv1.Fail
	equivalent := admissionregistrationv1.Equivalent
	forbidden := metav1.StatusReasonForbidden
	policy := func(name, key, what string, users []string, group string, resources []string) *admissionregistrationv1.ValidatingAdmissionPolicy {
		return &admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: &fail,
				MatchConstraints: &admissionregistrationv1.MatchResources{
					MatchPolicy: &equivalent,
					ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
						RuleWithOperations: admissionregistrationv1.RuleWithOperations{
							Operations: createUpdate,
							Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: resources},
						},
					}},
				},
				Variables: []admissionregistrationv1.Variable{
					{Name: "writer", Expression: fmt.Sprintf("request.userInfo.username in %s", celList(users))},
					{Name: "value", Expression: annotationCEL("object", key)},
					{Name: "oldValue", Expression: annotationCEL("oldObject", key)},
				},
				Validations: []admissionregistrationv1.Validation{{
					Expression: "variables.writer || variables.value == variables.oldValue",
					MessageExpression: fmt.Sprintf("'tessera: only %s may set, change or remove the %s annotation (%s); ' + request.userInfo.username + ' may not'",
						strings.ReplaceAll(strings.Join(users, " or "), "'", `\'`), key, what),
					Reason: &forbidden,
				}},
			},
		}
	}
	binding := func(name string) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        name,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		}
	}
	pols := []*admissionregistrationv1.ValidatingAdmissionPolicy{
		policy(RecordPolicyName, api.AnnotationAllocation, "the GPU allocation record of a pod", schedulerUsers, "", RecordSubresources),
		policy(InventoryPolicyName, api.AnnotationInventory, "the GPU inventory of a node", agentUsers, "", []string{"nodes", "nodes/status"}),
	}
	return pols, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{binding(RecordPolicyName), binding(InventoryPolicyName)}
}
