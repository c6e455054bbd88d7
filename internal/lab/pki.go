package lab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tessera-gpu/tessera/internal/webhook"
)

// pki is the lab's credentials: a CA and the API server's serving
// certificate, the service-account signing key, and one admin token that
// every component and the user's kubeconfig use (a lab, not a production
// cluster).
type pki struct {
	dir   string
	token string
}

func (p pki) file(name string) string { return filepath.Join(p.dir, name) }

// ensurePKI creates the credentials once; a lab started again in the same
// directory keeps them, so kubeconfigs handed out stay valid.
func ensurePKI(dir string) (pki, error) {
	p := pki{dir: dir}
	if b, err := os.ReadFile(p.file("token")); err == nil {
		p.token = string(b)
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	ca, err := webhook.NewCA("tessera-lab-ca")
	if err != nil {
		return p, err
	}
	serving, err := ca.ServingCert([]string{"127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return p, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(serving.PrivateKey)
	if err != nil {
		return p, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return p, err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return p, err
	}
	p.token = hex.EncodeToString(raw)
	files := map[string][]byte{
		"ca.crt":        ca.CertPEM,
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serving.Certificate[0]}),
		"apiserver.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
		"sa.key":        pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}),
		"tokens.csv":    fmt.Appendf(nil, "%s,lab-admin,lab-admin,\"system:masters\"\n", p.token),
		"token":         []byte(p.token), // last: its presence marks the set complete
	}
	for _, name := range []string{"ca.crt", "apiserver.crt", "apiserver.key", "sa.key", "tokens.csv", "token"} {
		if err := os.WriteFile(p.file(name), files[name], 0o600); err != nil {
			return p, err
		}
	}
	return p, nil
}

// writeKubeconfig writes a cluster-admin kubeconfig for the API server.
func (p pki) writeKubeconfig(path, server string) error {
	return p.writeKubeconfigFor(path, server, "tessera-lab-admin", p.token)
}

// writeKubeconfigFor writes a kubeconfig for the API server with a user's
// token.
func (p pki) writeKubeconfigFor(path, server, user, token string) error {
	ca, err := os.ReadFile(p.file("ca.crt"))
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["tessera-lab"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["tessera-lab"] = &clientcmdapi.Context{Cluster: "tessera-lab", AuthInfo: user}
	kc.CurrentContext = "tessera-lab"
	return clientcmd.WriteToFile(*kc, path)
}
