// Package testenv starts a real Kubernetes control plane inside a test
// process: etcd 3.6 (embedded) and kube-apiserver (in-process, from the
// pinned k8s.io/kubernetes module). No kubelet runs; tests create Node
// objects whose status and annotations describe the machines (see
// package fixtures).
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
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	apiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
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
	etcdURL, stopEtcd, err := StartEtcd(filepath.Join(dir, "etcd"))
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

// StartEtcd starts an embedded single-member etcd 3.6 with its data in
// dir, on free loopback ports, and returns its client URL and a function
// that stops it. Besides StartControlPlane, harnesses that expect an etcd
// at KUBE_INTEGRATION_ETCD_URL (scheduler_perf) use it.
func StartEtcd(dir string) (url string, stop func(), err error) {
	e, u, err := startEtcd(dir)
	if err != nil {
		return "", nil, err
	}
	return u, e.Close, nil
}

func startEtcd(dir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	// Shutting down logs harmless "server closed" errors; keep them with
	// the data rather than on the caller's output.
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Tests create and delete thousands of objects; keep the history short.
	cfg.AutoCompactionMode = "revision"
	cfg.AutoCompactionRetention = "1000"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		e.Close()
		return nil, "", fmt.Errorf("etcd not ready within a minute")
	}
	return e, cu.String(), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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
	return buildTool(dir, "etcd", "./internal/testenv/etcdbin", nil)
}

// BuildKubectl builds kubectl from the pinned module (./kubectlbin, no
// cgo, like the released kubectl) into dir and returns its path.
func BuildKubectl(dir string) (string, error) {
	return buildTool(dir, "kubectl", "./internal/testenv/kubectlbin", []string{"CGO_ENABLED=0"})
}

func buildTool(dir, name, pkg string, env []string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", name, err, msg)
	}
	return out, nil
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
