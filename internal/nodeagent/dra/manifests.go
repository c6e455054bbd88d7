package dra

import (
	"context"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// ApplyManifests creates the objects of deploy/dra's manifests
// (DeviceClasses, the claims' ValidatingAdmissionPolicy and its binding);
// objects that exist are left as they are. For the lab and tests: a
// cluster applies the files with kubectl or the chart.
func ApplyManifests(ctx context.Context, client kubernetes.Interface, docs ...[]byte) error {
	for _, doc := range docs {
		for _, part := range strings.Split(string(doc), "\n---\n") {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(part), &meta); err != nil {
				return fmt.Errorf("DRA manifests: %w", err)
			}
			var err error
			switch meta.Kind {
			case "DeviceClass":
				var o resourceapi.DeviceClass
				if err = yaml.UnmarshalStrict([]byte(part), &o); err == nil {
					_, err = client.ResourceV1().DeviceClasses().Create(ctx, &o, metav1.CreateOptions{})
				}
			case "ValidatingAdmissionPolicy":
				var o admissionv1.ValidatingAdmissionPolicy
				if err = yaml.UnmarshalStrict([]byte(part), &o); err == nil {
					_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &o, metav1.CreateOptions{})
				}
			case "ValidatingAdmissionPolicyBinding":
				var o admissionv1.ValidatingAdmissionPolicyBinding
				if err = yaml.UnmarshalStrict([]byte(part), &o); err == nil {
					_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &o, metav1.CreateOptions{})
				}
			default:
				err = fmt.Errorf("unexpected kind %q", meta.Kind)
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("DRA manifests: %s: %w", meta.Kind, err)
			}
		}
	}
	return nil
}
