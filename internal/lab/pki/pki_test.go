package pki

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
)

// TestEnsureKeepsAndIssues: credentials made once are kept by a second
// Ensure (kubeconfigs handed out stay valid), a kubeconfig carries the CA
// and the admin token, and a kubelet's serving certificate verifies
// against the CA for its node name.
func TestEnsureKeepsAndIssues(t *testing.T) {
	dir := t.TempDir()
	p, err := Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := os.ReadFile(CAFile(dir))
	again, err := Ensure(dir)
	if err != nil || again.token != p.token || p.token == "" {
		t.Fatalf("second Ensure: token %q then %q, %v", p.token, again.token, err)
	}
	if ca2, _ := os.ReadFile(CAFile(dir)); string(ca2) != string(ca) {
		t.Error("a second Ensure made a new CA")
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := p.WriteKubeconfig(kc, "https://127.0.0.1:6443"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil || cfg.BearerToken != p.token || string(cfg.CAData) != string(ca) || cfg.Host != "https://127.0.0.1:6443" {
		t.Fatalf("kubeconfig: %+v, %v", cfg, err)
	}
	certFile, _, err := KubeletServing(dir, t.TempDir(), "lab-gpu-01")
	if err != nil {
		t.Fatal(err)
	}
	certs, err := certutil.CertsFromFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := certutil.NewPool(CAFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: "lab-gpu-01"}); err != nil {
		t.Errorf("the kubelet's certificate: %v", err)
	}
}
