package lab

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/lab/component"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/pki"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
)

// ServiceCIDR is the range of the lab's Service ClusterIPs; the
// kubernetes Service is its first address (pki.ServingHosts).
const ServiceCIDR = "10.96.0.0/16"

// apiServerFlags are what differs between the lab's API server and the
// one beside a real node (StartControlPlane).
type apiServerFlags struct {
	etcdURL string
	// address is where it listens and what it advertises (the kubernetes
	// Service's endpoint).
	address string
	port    int
	// realNode: pods get ServiceAccount tokens, kubelets are authorized
	// as nodes (Node authorizer, NodeRestriction), new Nodes get the
	// not-ready taint (the node lifecycle controller lifts it), and
	// admissionConfig configures the admission plugins (PodSecurity).
	realNode        bool
	admissionConfig string
}

// startAPIServer starts the kube-apiserver and waits until it serves.
func startAPIServer(ctx context.Context, sup *supervisor.Supervisor, d labdir.Dir, p pki.PKI, f apiServerFlags) (kubernetes.Interface, error) {
	args := []string{
		"--etcd-servers=" + f.etcdURL,
		"--bind-address=" + f.address, "--advertise-address=" + f.address, fmt.Sprintf("--secure-port=%d", f.port),
		"--cert-dir=" + filepath.Join(d.PKI(), "apiserver-generated"),
		"--tls-cert-file=" + p.File("apiserver.crt"), "--tls-private-key-file=" + p.File("apiserver.key"),
		"--token-auth-file=" + p.File("tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.File("sa.key"), "--service-account-signing-key-file=" + p.File("sa.key"),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--allow-privileged=true",
		// kubectl logs: the kubelets authenticate the API server by this
		// certificate; it verifies theirs with the lab CA.
		"--kubelet-client-certificate=" + p.File("kubelet-client.crt"), "--kubelet-client-key=" + p.File("kubelet-client.key"),
		"--kubelet-certificate-authority=" + p.File("ca.crt"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--profiling=false",
	}
	if f.realNode {
		// Kubelets and kube-proxy authenticate by client certificates of
		// the lab CA (pki.WriteCertKubeconfig).
		args = append(args, "--client-ca-file="+p.File("ca.crt"),
			"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction")
		if f.admissionConfig != "" {
			args = append(args, "--admission-control-config-file="+f.admissionConfig)
		}
	} else {
		args = append(args, "--authorization-mode=RBAC",
			// No pod gets a service-account token volume (the hollow
			// kubelet has nothing to mount it with), and no controller
			// lifts the not-ready taint a new Node would get.
			"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition")
	}
	if err := sup.Start(component.APIServer, component.Args(component.APIServer, args...), nil, false); err != nil {
		return nil, err
	}
	client, err := component.Client(d.Kubeconfig())
	if err != nil {
		return nil, err
	}
	if err := poll.Until(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		if !sup.Alive(component.APIServer) {
			return false, fmt.Errorf("kube-apiserver exited; see %s", d.Log(component.APIServer))
		}
		_, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return nil, fmt.Errorf("kube-apiserver not ready: %w", err)
	}
	return client, nil
}

// startControllerManager starts the kube-controller-manager with these
// controllers, as the lab's admin.
func startControllerManager(sup *supervisor.Supervisor, d labdir.Dir, controllers []string, flags ...string) error {
	return sup.Start(component.ControllerManager, component.Args(component.ControllerManager, append([]string{
		"--kubeconfig=" + d.Kubeconfig(), "--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false", "--use-service-account-credentials=false", "--secure-port=0",
	}, flags...)...), nil, false)
}
