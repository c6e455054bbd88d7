package webhook

import (
	"context"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// Registration says how the API server reaches the webhook.
type Registration struct {
	// Name of both webhook configurations.
	Name string
	// Service is the webhook's Service (namespace/name, port); ignored if
	// URL is set.
	ServiceNamespace, ServiceName string
	ServicePort                   int32
	// URL is the webhook's base URL (tests, out-of-cluster runs).
	URL string
	// CABundle is the PEM CA that signed the serving certificate.
	CABundle []byte
	Names    api.ResourceNames
	// ExcludeNamespaces are never sent to the mutating and validating
	// webhooks (kube-system at least); the records webhook sees every
	// namespace.
	ExcludeNamespaces []string
	// SchedulerUsers may write allocation records (default
	// DefaultSchedulerUser); their requests never reach the records
	// webhook.
	SchedulerUsers []string
	// DeviceListStrategy is the node agents' ("" is envvar): where the
	// environment selects devices, pods that ask for no GPU but set a
	// device-selecting variable or import one through envFrom are sent too
	// (DeviceEnvCondition).
	DeviceListStrategy api.DeviceListStrategy
}

// MatchCondition is the CEL expression that sends a pod to the webhook
// only when one of its containers names a GPU resource in its limits or
// requests: pods that ask for no GPU are never affected by the webhook,
// even when it is down.
func MatchCondition(names api.ResourceNames) string {
	uses := gpuUses(names)
	return fmt.Sprintf("object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s)) || %s", uses, uses, claimsCondition)
}

// DeviceEnvCondition is the CEL expression that sends a pod some
// container of which (init and ephemeral ones too) sets a variable that
// selects devices (api.DeviceSelectionEnv) or imports variables through
// envFrom with a prefix that can form one (none, or e.g. "NVIDIA_"): on
// clusters whose runtime reads the environment, the webhook keeps such
// pods that ask for no GPU from selecting GPUs (isolation.go).
func DeviceEnvCondition() string {
	quoted := make([]string, 0, 4)
	for _, n := range api.DeviceSelectionEnv() {
		quoted = append(quoted, "'"+n+"'")
	}
	set := "[" + strings.Join(quoted, ", ") + "]"
	sets := fmt.Sprintf("((has(c.env) && c.env.exists(e, e.name in %s)) || (has(c.envFrom) && c.envFrom.exists(f, !has(f.prefix) || %s.exists(n, n.startsWith(f.prefix) && n != f.prefix))))", set, set)
	return fmt.Sprintf("object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s)) || (has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, %s))", sets, sets, sets)
}

// TemplateMatchCondition is the CEL expression that sends a workload
// whose pod template (TemplateKinds) names a GPU resource.
func TemplateMatchCondition(names api.ResourceNames) string {
	uses := gpuUses(names)
	// has() on every level: a field missing from an invalid object must
	// not make the condition an error (failurePolicy Fail would refuse it
	// with CEL's message instead of the API server's).
	at := func(path ...string) string {
		var out []string
		for i := range path {
			out = append(out, "has("+strings.Join(path[:i+1], ".")+")")
		}
		s := strings.Join(path, ".")
		return fmt.Sprintf("(%s && has(%s.containers) && (%s.containers.exists(c, %s) || (has(%s.initContainers) && %s.initContainers.exists(c, %s))))",
			strings.Join(out[1:], " && "), s, s, uses, s, s, uses)
	}
	return at("object", "spec", "template", "spec") + " || " + at("object", "spec", "jobTemplate", "spec", "template", "spec") + " || " + at("object", "template", "spec")
}

// gpuUses is the CEL test that container c names a GPU resource in its
// limits or requests.
func gpuUses(names api.ResourceNames) string {
	quoted := make([]string, 0, 4)
	for _, n := range names.All() {
		quoted = append(quoted, "'"+n+"'")
	}
	quoted = append(quoted, "'"+names.Shared(names.GPU)+"'")
	for _, n := range api.VolcanoResources() { // volcano.go
		quoted = append(quoted, "'"+n+"'")
	}
	set := "[" + strings.Join(quoted, ", ") + "]"
	// MIG device resources (mixed strategy): <prefix>/mig-<profile>.
	migPrefix := "'" + strings.TrimSuffix(names.MIG("x"), "x") + "'"
	match := fmt.Sprintf("r in %s || r.startsWith(%s)", set, migPrefix)
	return fmt.Sprintf("(has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, %s)) || (has(c.resources.requests) && c.resources.requests.exists(r, %s))))", match, match)
}

// claimsCondition sends pods that use ResourceClaims: the webhook charges
// their claims to the GPU memory quota (draquota.go).
const claimsCondition = "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)"

// ClaimMatchCondition is the CEL expression that sends a ResourceClaim's
// creation to the webhook only when one of its requests (or subrequests)
// names a DeviceClass of Tessera's driver.
func ClaimMatchCondition() string {
	quoted := make([]string, 0, 4)
	for _, c := range api.DeviceClasses() {
		quoted = append(quoted, "'"+c+"'")
	}
	set := "[" + strings.Join(quoted, ", ") + "]"
	return fmt.Sprintf("has(object.spec.devices) && has(object.spec.devices.requests) && object.spec.devices.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName in %s) || (has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in %s)))", set, set)
}

func (r *Registration) clientConfig(path string) admissionregistrationv1.WebhookClientConfig {
	if r.URL != "" {
		u := strings.TrimSuffix(r.URL, "/") + path
		return admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: r.CABundle}
	}
	port := r.ServicePort
	return admissionregistrationv1.WebhookClientConfig{
		Service:  &admissionregistrationv1.ServiceReference{Namespace: r.ServiceNamespace, Name: r.ServiceName, Path: &path, Port: &port},
		CABundle: r.CABundle,
	}
}

func podRule(ops []admissionregistrationv1.OperationType, resources ...string) admissionregistrationv1.RuleWithOperations {
	scope := admissionregistrationv1.NamespacedScope
	return admissionregistrationv1.RuleWithOperations{
		Operations: ops,
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: resources, Scope: &scope},
	}
}

// templateRules are the rules of the templates webhook: CREATE and
// UPDATE of every TemplateKinds resource.
func templateRules() []admissionregistrationv1.RuleWithOperations {
	var out []admissionregistrationv1.RuleWithOperations
	for _, k := range TemplateKinds() {
		out = append(out, admissionregistrationv1.RuleWithOperations{
			Operations: createUpdate,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{k.Group}, APIVersions: []string{k.Version}, Resources: []string{k.Resource}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
		})
	}
	return out
}

var (
	create       = []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
	update       = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	createUpdate = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
)

func (r *Registration) common() (rules []admissionregistrationv1.RuleWithOperations, ns *metav1.LabelSelector, conds []admissionregistrationv1.MatchCondition) {
	rules = []admissionregistrationv1.RuleWithOperations{podRule(create, "pods")}
	excluded := append([]string{"kube-system"}, r.ExcludeNamespaces...)
	ns = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: excluded,
	}}}
	cond := MatchCondition(r.Names)
	if r.DeviceListStrategy.EnvSelectsDevices() {
		cond += " || " + DeviceEnvCondition()
	}
	conds = []admissionregistrationv1.MatchCondition{{Name: "requests-gpu", Expression: cond}}
	return rules, ns, conds
}

// Configurations returns the mutating and validating configurations.
// failurePolicy is Fail: a GPU pod is not admitted while the webhook is
// down (it would otherwise escape validation); the namespace selector and
// the match condition keep every other pod out of the webhook's reach.
func (r *Registration) Configurations() (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	rules, ns, conds := r.common()
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(5)
	reinvoke := admissionregistrationv1.IfNeededReinvocationPolicy
	equivalent := admissionregistrationv1.Equivalent
	m := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "mutate.pods.tessera.io",
			ClientConfig:            r.clientConfig(MutatePath),
			Rules:                   rules,
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       ns,
			MatchConditions:         conds,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      &reinvoke,
		}, {
			// Pod templates of workloads: the fractional form converted
			// before the API server validates the template (templates.go).
			Name:                    "templates.tessera.io",
			ClientConfig:            r.clientConfig(MutatePath),
			Rules:                   templateRules(),
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       ns,
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "template-requests-gpu", Expression: TemplateMatchCondition(r.Names)}},
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      &reinvoke,
		}},
	}
	users := r.SchedulerUsers
	if len(users) == 0 {
		users = []string{DefaultSchedulerUser}
	}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "validate.pods.tessera.io",
			ClientConfig: r.clientConfig(ValidatePath),
			// Pods created, and ephemeral containers added to GPU pods.
			Rules:                   append(rules, podRule(update, "pods/ephemeralcontainers")),
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       ns,
			MatchConditions:         conds,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}, {
			// ResourceClaims of Tessera's classes created after their
			// pods were charged (draquota.go).
			Name:         "claims.tessera.io",
			ClientConfig: r.clientConfig(ValidatePath),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: create,
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"resource.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"resourceclaims"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
			}},
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       ns,
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "tessera-classes", Expression: ClaimMatchCondition()}},
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}, {
			// Defence in depth beside the ValidatingAdmissionPolicy of
			// deploy/: every write of an allocation record by anyone but
			// the scheduler, in every namespace. The condition sends only
			// such writes, so neither the scheduler nor anything else
			// waits for this webhook or fails when it is down.
			Name:                    "records.pods.tessera.io",
			ClientConfig:            r.clientConfig(ValidatePath),
			Rules:                   []admissionregistrationv1.RuleWithOperations{podRule(createUpdate, RecordSubresources...)},
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       &metav1.LabelSelector{},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "record-written-by-others", Expression: RecordWrittenByOthers(users)}},
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	return m, v
}

// Apply creates or updates both configurations.
func (r *Registration) Apply(ctx context.Context, client kubernetes.Interface) error {
	m, v := r.Configurations()
	api := client.AdmissionregistrationV1()
	if err := createOrUpdate(ctx, api.MutatingWebhookConfigurations(), m, "MutatingWebhookConfiguration"); err != nil {
		return err
	}
	return createOrUpdate(ctx, api.ValidatingWebhookConfigurations(), v, "ValidatingWebhookConfiguration")
}

// objectClient is the part of a typed client that createOrUpdate uses.
type objectClient[T metav1.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// mergeMaps is a with b's entries added (b wins); nil when both are empty.
func mergeMaps(a, b map[string]string) map[string]string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// createOrUpdate writes obj, replacing the stored object of its name if
// there is one.
func createOrUpdate[T metav1.Object](ctx context.Context, c objectClient[T], obj T, kind string) error {
	old, err := c.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case err == nil:
		obj.SetResourceVersion(old.GetResourceVersion())
		// Keep what others put on the object (a Helm release's labels and
		// annotations: the chart owns the configurations, docs/operations.md).
		obj.SetLabels(mergeMaps(old.GetLabels(), obj.GetLabels()))
		obj.SetAnnotations(mergeMaps(old.GetAnnotations(), obj.GetAnnotations()))
		if _, err := c.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating %s %s: %w", kind, obj.GetName(), err)
		}
	case apierrors.IsNotFound(err):
		if _, err := c.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating %s %s: %w", kind, obj.GetName(), err)
		}
	default:
		return fmt.Errorf("reading %s %s: %w", kind, obj.GetName(), err)
	}
	return nil
}
