// Package testenv is Tessera's test harness (tests only; shipped code must
// not import it): a real Kubernetes control plane inside a test process,
// etcd 3.6 (embedded, internal/lab/etcd) and kube-apiserver (in-process,
// from the pinned k8s.io/kubernetes module); the one wait helper
// (WaitFor, from package poll); and builds of the binaries tests run (Build, BuildEtcd,
// BuildKubectl). No kubelet runs; tests create Node objects whose status
// and annotations describe the machines (see package fixtures).
//
//	cp := testenv.StartControlPlane(t)
//	cp.Client.CoreV1().Nodes().Create(ctx, fixtures.Node(...), metav1.CreateOptions{})
//	// cp.RestConfig and cp.Kubeconfig give other components access.
//
// The control plane stops when the test ends (or at cp.Stop()). Starting
// one takes a few seconds; it is meant for tests built with the
// "integration" tag.
package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	apiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"

	"github.com/tessera-gpu/tessera/internal/lab/etcd"
	"github.com/tessera-gpu/tessera/internal/testenv/poll"
	"github.com/tessera-gpu/tessera/internal/version"
)

// ControlPlane is a running etcd + kube-apiserver.
type ControlPlane struct {
	// Client is a clientset with cluster-admin rights.
	Client kubernetes.Interface
	// RestConfig is the configuration Client was built from (high QPS).
	RestConfig *rest.Config
	// Kubeconfig is a kubeconfig file for RestConfig, for components
	// configured by file (kube-scheduler's --config, --kubeconfig).
	Kubeconfig string
	// EtcdURL is the client URL of the embedded etcd.
	EtcdURL string

	stopOnce sync.Once
	stop     func()
}

// Options tune StartControlPlane; the zero value is fine.
type Options struct {
	// APIServerFlags are extra kube-apiserver flags.
	APIServerFlags []string
}

// StartControlPlane starts etcd and kube-apiserver for the test and stops
// them when it ends. It fails the test if either does not come up.
func StartControlPlane(t testing.TB, opts ...Options) *ControlPlane {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	dir := t.TempDir()
	etcdURL, stopEtcd, err := etcd.Start(filepath.Join(dir, "etcd"))
	if err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	storage := storagebackend.NewDefaultConfig("/registry-"+randSuffix(), nil)
	storage.Transport.ServerList = []string{etcdURL}
	flags := append([]string{
		// No controller manager or kubelet runs: nothing would create
		// the "default" ServiceAccount that ServiceAccount waits for, or
		// lift the not-ready taint TaintNodesByCondition puts on new Nodes.
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
	}, o.APIServerFlags...)
	ts, err := apiservertesting.StartTestServer(t, apiservertesting.NewDefaultTestServerOptions(), flags, storage)
	if err != nil {
		stopEtcd()
		t.Fatalf("starting kube-apiserver: %v", err)
	}
	cfg := rest.CopyConfig(ts.ClientConfig)
	cfg.QPS, cfg.Burst = 5000, 10000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		ts.TearDownFn()
		stopEtcd()
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, cfg); err != nil {
		ts.TearDownFn()
		stopEtcd()
		t.Fatal(err)
	}
	cp := &ControlPlane{Client: client, RestConfig: cfg, Kubeconfig: kubeconfig, EtcdURL: etcdURL}
	cp.stop = func() {
		ts.TearDownFn()
		stopEtcd()
	}
	t.Cleanup(cp.Stop)
	if err := cp.waitReady(); err != nil {
		t.Fatal(err)
	}
	return cp
}

// As returns a rest config for the control plane with a bearer token
// instead of the admin's credentials.
func (cp *ControlPlane) As(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(cp.RestConfig)
	cfg.BearerToken = token
	cfg.QPS, cfg.Burst = cp.RestConfig.QPS, cp.RestConfig.Burst
	return cfg
}

// KubeconfigAs writes a kubeconfig for the control plane with a bearer
// token (a ServiceAccount's) into the test's temporary directory.
func (cp *ControlPlane) KubeconfigAs(t testing.TB, name, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := writeKubeconfig(path, cp.As(token)); err != nil {
		t.Fatal(err)
	}
	return path
}

// Stop shuts the control plane down; it is safe to call more than once.
func (cp *ControlPlane) Stop() { cp.stopOnce.Do(cp.stop) }

// waitReady waits until the default namespace exists (the apiserver's
// bootstrap controllers have run).
func (cp *ControlPlane) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready within a minute: %w", err)
	}
	return nil
}

func randSuffix() string { return fmt.Sprintf("%d", time.Now().UnixNano()) }

// writeKubeconfig renders cfg (host, CA, credentials) as a kubeconfig file.
func writeKubeconfig(path string, cfg *rest.Config) error {
	cluster := &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
		TLSServerName:            cfg.ServerName,
		InsecureSkipTLSVerify:    cfg.Insecure,
	}
	if cfg.CAFile != "" && len(cfg.CAData) == 0 {
		data, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return err
		}
		cluster.CertificateAuthorityData = data
	}
	user := &clientcmdapi.AuthInfo{
		Token:                 cfg.BearerToken,
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		ClientCertificate:     cfg.CertFile,
		ClientKey:             cfg.KeyFile,
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = cluster
	kc.AuthInfos["test"] = user
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

// RepoRoot returns the repository root (the directory holding go.mod),
// so tests can use shipped files such as deploy/scheduler/config.yaml.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// BuildEtcd builds etcd 3.6 from the pinned module (./etcdbin) into dir
// and returns the binary's path. Harnesses that exec "etcd" themselves
// (scheduler_perf) find it once dir is put first in PATH. It needs the go
// command; the build cache makes every build after the first quick.
func BuildEtcd(dir string) (string, error) {
	return Build(dir, "etcd", "./internal/testenv/etcdbin")
}

// BuildKubectl builds kubectl from the pinned module (./kubectlbin, no
// cgo, like the released kubectl) into dir and returns its path.
func BuildKubectl(dir string) (string, error) {
	return BuildWith(dir, "kubectl", "./internal/testenv/kubectlbin", KubernetesBuildFlags(), "CGO_ENABLED=0")
}

// Make runs make with args in the directory dir of the repository ("" for
// its root), as the Makefiles build what is not Go (the lab's tools, the
// fake GPU); it needs make and gcc.
func Make(dir string, args ...string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("make", append([]string{"-s", "-C", filepath.Join(root, dir)}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make -C %s %s: %v\n%s", dir, strings.Join(args, " "), err, out)
	}
	return nil
}

// KubernetesVersion is the k8s.io/kubernetes version go.mod pins (`go
// list -m`, as the Makefile reads it; a test binary does not carry its
// dependencies' versions).
func KubernetesVersion() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m k8s.io/kubernetes: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// KubernetesBuildFlags are the `go build` flags that make a binary's
// Kubernetes components (kubectl, the lab's control plane) report the
// pinned Kubernetes version (version.KubernetesLDFlags), as the Makefile
// builds them; none when the version cannot be read.
func KubernetesBuildFlags() []string {
	v, err := KubernetesVersion()
	if err != nil {
		return nil
	}
	flags, err := version.KubernetesLDFlags(v)
	if err != nil {
		return nil
	}
	return []string{"-ldflags", strings.Join(flags, " ")}
}

// HelmVersion is the helm the tests and CI run, pinned in hack/tools.
const HelmVersion = "v3.22.0"

// BuildHelm builds helm from the module pinned in hack/tools (a module of
// its own, so helm's dependencies stay out of Tessera's go.mod) into dir,
// with hack/tools/build-helm.sh.
func BuildHelm(dir string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "helm")
	// The script sets the Kubernetes version helm assumes without a
	// cluster, as helm's release builds do (.ci/run builds with it too).
	cmd := exec.Command("bash", filepath.Join(root, "hack", "tools", "build-helm.sh"), out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building helm %s in hack/tools: %v\n%s", HelmVersion, err, msg)
	}
	return out, nil
}

// BuildVolcano builds Volcano's scheduler and controller manager from the
// release pinned in hack/volcano (a module of its own: Volcano carries
// its own Kubernetes version and replace block) into dir, with the
// release's CRDs, as hack/volcano/build.sh does (docs/volcano.md).
func BuildVolcano(dir string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", "volcano", "build.sh"), dir)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building Volcano in hack/volcano: %v\n%s", err, msg)
	}
	return nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above %s", dir)
		}
		dir = parent
	}
}

// WaitFor is poll.Until (package poll, the one wait helper of Tessera's
// tests, for packages that do not link the control plane): it polls cond
// until it holds, failing the test (naming what) when timeout passes
// first.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.Until(t, what, timeout, cond)
}

// Build builds the Go package pkg (relative to the repository root, e.g.
// "./cmd/tessera") into dir/name and returns the binary's path; env is
// added to the go command's environment. The build cache makes every
// build after the first quick.
func Build(dir, name, pkg string, env ...string) (string, error) {
	return BuildWith(dir, name, pkg, nil, env...)
}

// BuildWith is Build with flags for `go build` (e.g. -ldflags).
func BuildWith(dir, name, pkg string, flags []string, env ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", append(append([]string{"build", "-o", out}, flags...), pkg)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", pkg, err, msg)
	}
	return out, nil
}
