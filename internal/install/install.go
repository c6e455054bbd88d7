// Package install puts into a cluster what deploy/ ships besides the
// components themselves: the scheduler's and the node agents'
// ServiceAccounts with their RBAC, and the admission policies that let
// only the scheduler write allocation records and only the agents write
// inventories. The emulated cluster (internal/lab) and the integration
// harness run the scheduler and the agents under these identities, with
// tokens from the TokenRequest API, so the policies are exercised for
// real.
package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Namespace is where the shipped ServiceAccounts live.
const Namespace = "tessera-system"

// The shipped ServiceAccounts.
const (
	SchedulerAccount = "tessera-scheduler"
	NodeAgentAccount = "tessera-node-agent"
)

// Identities creates the namespace, the ServiceAccounts and RBAC of
// deploy/'s scheduler and node-agent manifests (not their Deployment and
// DaemonSets) and, unless withoutPolicies, deploy/admission/policy.yaml,
// and waits until the record policy is in force.
func Identities(ctx context.Context, client kubernetes.Interface, withoutPolicies bool) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	manifests := [][]byte{deploy.SchedulerManifest, deploy.NodeAgentManifest}
	if !withoutPolicies {
		manifests = append(manifests, deploy.AdmissionPolicy)
	}
	if err := installManifests(ctx, client, manifests...); err != nil {
		return err
	}
	if withoutPolicies {
		return nil
	}
	return WaitPolicyEffective(ctx, client)
}

// Token is a token of ServiceAccount Namespace/account, valid for a year.
func Token(ctx context.Context, client kubernetes.Interface, account string) (string, error) {
	year := int64(365 * 24 * 3600)
	tr, err := client.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &year}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for ServiceAccount %s/%s: %w", Namespace, account, err)
	}
	return tr.Status.Token, nil
}

// decodeManifest returns the identity and policy objects of a manifest.
func decodeManifest(b []byte) ([]runtime.Object, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []runtime.Object
	for {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 || string(raw.Raw) == "null" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw.Raw, nil, nil)
		if err != nil {
			return nil, err
		}
		switch obj.(type) {
		case *corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *rbacv1.Role, *rbacv1.RoleBinding,
			*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			out = append(out, obj)
		}
	}
}

func createOrReplace(ctx context.Context, c kubernetes.Interface, obj runtime.Object) error {
	var err error
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = c.RbacV1().ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.Role:
		_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = c.RbacV1().Roles(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.RoleBinding:
		_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		api := c.AdmissionregistrationV1().ValidatingAdmissionPolicies()
		if old, gerr := api.Get(ctx, o.Name, metav1.GetOptions{}); gerr == nil {
			o.ResourceVersion = old.ResourceVersion
			_, err = api.Update(ctx, o, metav1.UpdateOptions{})
		} else {
			_, err = api.Create(ctx, o, metav1.CreateOptions{})
		}
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("installing %T: %w", obj, err)
	}
	return nil
}

// WaitPolicyEffective waits until the API server refuses a record
// written by the caller (a dry run): the admission policy is in force.
func WaitPolicyEffective(ctx context.Context, client kubernetes.Interface) error {
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "tessera-policy-probe", Annotations: map[string]string{api.AnnotationAllocation: "{}"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	})
	if err != nil {
		return fmt.Errorf("the admission policy %s is not in force after a minute: %w", "tessera-allocation-records", err)
	}
	return nil
}

// Volcano installs deploy/volcano: the node agents' RBAC on nodes in mode
// volcano and the admission policy that lets only Volcano's scheduler
// write Volcano's vGPU annotations.
func Volcano(ctx context.Context, client kubernetes.Interface) error {
	return installManifests(ctx, client, deploy.VolcanoNodeAgentRBAC, deploy.VolcanoAdmission)
}

// installManifests creates (or replaces) the identity and policy objects
// of the manifests.
func installManifests(ctx context.Context, client kubernetes.Interface, manifests ...[]byte) error {
	for _, m := range manifests {
		objs, err := decodeManifest(m)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if err := createOrReplace(ctx, client, o); err != nil {
				return err
			}
		}
	}
	return nil
}
