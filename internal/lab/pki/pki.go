// Package pki is the emulated cluster's credentials: a CA and the API
// server's serving certificate, the API server's client certificate for
// the kubelets, the service-account signing key, one admin token, and
// the kubelets' serving certificates issued from the CA. Everything is
// kept in one directory (the lab's pki/), so a lab started again there
// keeps the kubeconfigs it handed out.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"

	"github.com/tessera-gpu/tessera/internal/webhook"
)

// PKI is the lab's credentials in a directory: a CA and the API server's
// serving certificate, the API server's client certificate for the
// kubelets, the service-account signing key, and one admin token that
// every component and the user's kubeconfig use (a lab, not a production
// cluster). The kubelets' serving certificates are issued from the CA
// when they start (KubeletServing), for the host's current addresses.
type PKI struct {
	dir   string
	token string
}

// File is one of the credentials' files: ca.crt, ca.key, apiserver.crt,
// apiserver.key, kubelet-client.crt, kubelet-client.key, sa.key,
// tokens.csv (the API server's --token-auth-file), token.
func (p PKI) File(name string) string { return filepath.Join(p.dir, name) }

// CAFile is the CA certificate of the credentials in dir.
func CAFile(dir string) string { return PKI{dir: dir}.File("ca.crt") }

// ServingHosts are the names and addresses the API server's certificate
// is made for, besides those Ensure is given: this machine's loopback, the
// in-cluster names of the kubernetes Service and its ClusterIP in the
// lab's Service range (what a pod's client dials).
var ServingHosts = []string{"127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "10.96.0.1"}

// Ensure creates the credentials in dir once; a lab started again in the
// same directory keeps them, so kubeconfigs handed out stay valid. hosts
// are further names or addresses of the API server's certificate (an
// address it listens on besides loopback), used when the credentials are
// made.
func Ensure(dir string, hosts ...string) (PKI, error) {
	p := PKI{dir: dir}
	if b, err := os.ReadFile(p.File("token")); err == nil {
		if _, err := os.Stat(p.File("kubelet-client.key")); err == nil {
			p.token = string(b)
			return p, nil
		}
		// Made by a lab that kept no CA key: made anew.
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	ca, err := webhook.NewCA("tessera-lab-ca")
	if err != nil {
		return p, err
	}
	serving, err := ca.ServingCert(append(append([]string(nil), ServingHosts...), hosts...))
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
	kcCert, kcKey, err := issueClientCert(ca, "kube-apiserver-kubelet-client", []string{"system:masters"})
	if err != nil {
		return p, err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return p, err
	}
	p.token = hex.EncodeToString(raw)
	files := map[string][]byte{
		"ca.crt":             ca.CertPEM,
		"ca.key":             ca.KeyPEM,
		"kubelet-client.crt": kcCert,
		"kubelet-client.key": kcKey,
		"apiserver.crt":      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serving.Certificate[0]}),
		"apiserver.key":      pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
		"sa.key":             pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}),
		"tokens.csv":         fmt.Appendf(nil, "%s,lab-admin,lab-admin,\"system:masters\"\n", p.token),
		"token":              []byte(p.token), // last, after kubelet-client.key: their presence marks the set complete
	}
	for _, name := range []string{"ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "kubelet-client.crt", "sa.key", "tokens.csv", "kubelet-client.key", "token"} {
		if err := os.WriteFile(p.File(name), files[name], 0o600); err != nil {
			return p, err
		}
	}
	return p, nil
}

// WriteKubeconfig writes a cluster-admin kubeconfig for the API server.
func (p PKI) WriteKubeconfig(path, server string) error {
	return p.WriteKubeconfigFor(path, server, "tessera-lab-admin", p.token)
}

// WriteKubeconfigFor writes a kubeconfig for the API server with a user's
// token.
func (p PKI) WriteKubeconfigFor(path, server, user, token string) error {
	ca, err := os.ReadFile(p.File("ca.crt"))
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

// WriteCertKubeconfig writes a kubeconfig for the API server whose user
// is a client certificate of the CA for cn in the groups orgs (a real
// kubelet as system:node:<name> in system:nodes, kube-proxy as
// system:kube-proxy), with its key and certificate inline.
func (p PKI) WriteCertKubeconfig(path, server, cn string, orgs ...string) error {
	ca, err := p.loadCA()
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := issueClientCert(ca, cn, orgs)
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["tessera-lab"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca.CertPEM}
	kc.AuthInfos[cn] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kc.Contexts["tessera-lab"] = &clientcmdapi.Context{Cluster: "tessera-lab", AuthInfo: cn}
	kc.CurrentContext = "tessera-lab"
	return clientcmd.WriteToFile(*kc, path)
}

// loadCA reads the CA (certificate and key).
func (p PKI) loadCA() (*webhook.CA, error) {
	certPEM, err := os.ReadFile(p.File("ca.crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(p.File("ca.key"))
	if err != nil {
		return nil, err
	}
	return webhook.ParseCA(certPEM, keyPEM)
}

// issueClientCert issues a one-year client certificate from the CA.
func issueClientCert(ca *webhook.CA, cn string, orgs []string) (certPEM, keyPEM []byte, err error) {
	certs, err := certutil.ParseCertsPEM(ca.CertPEM)
	if err != nil {
		return nil, nil, err
	}
	caKey, err := keyutil.ParsePrivateKeyPEM(ca.KeyPEM)
	if err != nil {
		return nil, nil, err
	}
	signer, ok := caKey.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("CA key of type %T cannot sign", caKey)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, certs[0], &key.PublicKey, signer)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// KubeletServing writes a serving certificate for a kubelet into dir,
// issued by the CA of the credentials in pkiDir, for its node name,
// localhost and every address of this machine (the kubelet reports one of
// them as the node's address, which the API server dials), and returns
// the certificate and key files.
func KubeletServing(pkiDir, dir, node string) (certFile, keyFile string, err error) {
	ca, err := PKI{dir: pkiDir}.loadCA()
	if err != nil {
		return "", "", err
	}
	hosts := []string{node, "localhost", "127.0.0.1", "::1"}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", "", err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			hosts = append(hosts, ipn.IP.String())
		}
	}
	cert, err := ca.ServingCert(hosts)
	if err != nil {
		return "", "", err
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "kubelet.crt"), filepath.Join(dir, "kubelet.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600)
}
