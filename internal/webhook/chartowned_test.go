package webhook

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestApplyKeepsOwnersMetadata: writing the configurations keeps the
// labels and annotations a Helm release put on them (the chart owns
// them; the webhook only fills in its CA).
func TestApplyKeepsOwnersMetadata(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	reg := Registration{Name: "tessera-webhook", ServiceNamespace: "tessera-system", ServiceName: "tessera-webhook", ServicePort: 443, Names: api.DefaultResourceNames}
	m, v := reg.Configurations()
	helmMeta := func(o *metav1.ObjectMeta) {
		o.Labels = map[string]string{"app.kubernetes.io/managed-by": "Helm"}
		o.Annotations = map[string]string{"meta.helm.sh/release-name": "tessera"}
	}
	helmMeta(&m.ObjectMeta)
	helmMeta(&v.ObjectMeta)
	if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, m, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, v, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reg.CABundle = []byte("CA")
	if err := reg.Apply(ctx, client); err != nil {
		t.Fatal(err)
	}
	got, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "tessera-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["app.kubernetes.io/managed-by"] != "Helm" || got.Annotations["meta.helm.sh/release-name"] != "tessera" {
		t.Errorf("Helm's metadata lost: %v %v", got.Labels, got.Annotations)
	}
	if string(got.Webhooks[0].ClientConfig.CABundle) != "CA" {
		t.Errorf("caBundle not written")
	}
}

// TestLoadCAFromCertManager: a CA Certificate issued by cert-manager
// (tls.crt, tls.key, ca.crt) is the webhook's CA.
func TestLoadCAFromCertManager(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera-system", Name: "tessera-webhook-ca"},
		Data: map[string][]byte{"tls.crt": ca.CertPEM, "tls.key": ca.KeyPEM, "ca.crt": ca.CertPEM}}
	got, err := LoadOrCreateCA(context.Background(), fake.NewClientset(s), "tessera-system", "tessera-webhook-ca")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.CertPEM) != string(ca.CertPEM) {
		t.Error("a different CA was loaded")
	}
}
