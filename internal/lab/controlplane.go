package lab

// The lab's control plane alone, for a real node: what `make e2e` installs
// Tessera's chart on (test/e2e, internal/realnode). No Tessera
// component, identity, policy or profile is set up: the chart brings them.

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/lab/component"
	"github.com/tessera-gpu/tessera/internal/lab/etcd"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/pki"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
)

// realNodeControllers are the controllers a real node needs besides the
// lab's: Services reach pods (endpoint slices, for kube-proxy), pods get
// their ServiceAccount's token and the cluster's CA (service accounts,
// kube-root-ca.crt), and a new Node loses its not-ready taint once its
// kubelet reports Ready (node lifecycle).
var realNodeControllers = []string{
	"endpointslice-controller", "serviceaccount-controller", "root-ca-certificate-publisher-controller",
	"node-lifecycle-controller",
}

// ControlPlaneConfig is what StartControlPlane starts.
type ControlPlaneConfig struct {
	Dir labdir.Dir
	// Exe is the tessera-lab binary the components run from.
	Exe string
	// Address is where the API server listens and what it advertises: an
	// address of this machine that the node's pods reach (the kubernetes
	// Service's endpoint). Port is its port (6443 when 0).
	Address string
	Port    int
	// PodSecurity is the Pod Security level enforced in every namespace
	// that sets none (privileged, baseline or restricted; empty:
	// privileged, the API server's default), also for its warnings and
	// audit annotations.
	PodSecurity string
	// Out receives progress lines.
	Out io.Writer
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	// Dir is its state directory (logs, credentials).
	Dir labdir.Dir
	// APIServer is its URL; Kubeconfig the cluster admin's kubeconfig.
	APIServer, Kubeconfig string
	PKI                   pki.PKI
	Client                kubernetes.Interface
	// Supervisor runs its components (and may run the node's).
	Supervisor *supervisor.Supervisor
	stopEtcd   func()
}

// StartControlPlane starts etcd, the kube-apiserver (Node and RBAC
// authorization, ServiceAccount tokens, PodSecurity), the
// kube-controller-manager with the lab's controllers and
// realNodeControllers, and the stock kube-scheduler. Stop stops them.
func StartControlPlane(ctx context.Context, cfg ControlPlaneConfig) (_ *ControlPlane, err error) {
	d := cfg.Dir
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	if cfg.Address == "" {
		return nil, fmt.Errorf("control plane: no address to serve at")
	}
	if cfg.Port == 0 {
		cfg.Port = 6443
	}
	for _, p := range []string{d.Logs(), d.PKI()} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	p, err := pki.Ensure(d.PKI(), cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	etcdURL, stopEtcd, err := etcd.Start(d.Etcd())
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	cp := &ControlPlane{Dir: d, APIServer: fmt.Sprintf("https://%s:%d", cfg.Address, cfg.Port), Kubeconfig: d.Kubeconfig(), PKI: p, stopEtcd: stopEtcd}
	cp.Supervisor = supervisor.New(cfg.Exe, d.Log, klog.FromContext(ctx).WithName("control-plane"), nil)
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if err := p.WriteKubeconfig(d.Kubeconfig(), cp.APIServer); err != nil {
		return nil, err
	}
	admission, err := podSecurityAdmission(cfg.PodSecurity)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(d.AdmissionConfig(), admission, 0o644); err != nil {
		return nil, err
	}
	if cp.Client, err = startAPIServer(ctx, cp.Supervisor, d, p, apiServerFlags{
		etcdURL: etcdURL, address: cfg.Address, port: cfg.Port, realNode: true, admissionConfig: d.AdmissionConfig(),
	}); err != nil {
		return nil, err
	}
	step("kube-apiserver serving at %s", cp.APIServer)
	if err := startControllerManager(cp.Supervisor, d, append(append([]string(nil), controllers...), realNodeControllers...),
		"--root-ca-file="+p.File("ca.crt"), "--service-account-private-key-file="+p.File("sa.key")); err != nil {
		return nil, err
	}
	if err := cp.Supervisor.Start(component.KubeScheduler, component.Args(component.KubeScheduler,
		"--kubeconfig="+d.Kubeconfig(), "--leader-elect=false", "--secure-port=0"), nil, false); err != nil {
		return nil, err
	}
	step("started kube-controller-manager and kube-scheduler")
	return cp, nil
}

// Stop stops every component the supervisor runs, then etcd.
func (c *ControlPlane) Stop() {
	c.Supervisor.StopAll(10 * time.Second)
	c.stopEtcd()
}

// podSecurityAdmission is the API server's admission configuration: the
// PodSecurity plugin enforcing level where a namespace sets none.
func podSecurityAdmission(level string) ([]byte, error) {
	switch level {
	case "":
		level = "privileged"
	case "privileged", "baseline", "restricted":
	default:
		return nil, fmt.Errorf("the Pod Security level %q: want privileged, baseline or restricted", level)
	}
	return yaml.Marshal(map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1",
		"kind":       "AdmissionConfiguration",
		"plugins": []any{map[string]any{
			"name": "PodSecurity",
			"configuration": map[string]any{
				"apiVersion": "pod-security.admission.config.k8s.io/v1",
				"kind":       "PodSecurityConfiguration",
				"defaults": map[string]any{
					"enforce": level, "enforce-version": "latest",
					"audit": level, "audit-version": "latest",
					"warn": level, "warn-version": "latest",
				},
				"exemptions": map[string]any{"usernames": []string{}, "runtimeClasses": []string{}, "namespaces": []string{}},
			},
		}},
	})
}
