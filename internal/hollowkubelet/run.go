package hollowkubelet

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clientset "k8s.io/client-go/kubernetes"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubemark"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
)

// Options describe one hollow kubelet.
type Options struct {
	NodeName string
	// Client talks to the API server (for the node and its pods).
	Client *clientset.Clientset
	// RootDir is the kubelet's root directory; the pod-resources socket is
	// RootDir/pod-resources/kubelet.sock.
	RootDir string
	// Port is the kubelet's API port (unique per kubelet on a machine).
	Port int
	// MaxPods caps pods on the node (default 110).
	MaxPods int
	// Cores and MemoryBytes describe the machine (default 1 core, 3.75 GiB:
	// the fake cAdvisor's machine).
	Cores       int
	MemoryBytes uint64
	// Labels are set on the Node at registration.
	Labels map[string]string
	// Taints are set on the Node at registration.
	Taints []v1.Taint
	// StatusEvery is how often the node status and pods sync (default 1s).
	StatusEvery time.Duration
	// RuntimeEndpoint is the CRI endpoint of the container runtime
	// (a Runtime served by another process, "unix:///path"). Empty: an
	// in-process Runtime that records containers without running them.
	RuntimeEndpoint string
	// OnCreate, if set, sees every container the in-process runtime is
	// asked to create.
	OnCreate func(Container)
	// PodLogsDir is where the kubelet places the containers' logs
	// (default: a temporary directory).
	PodLogsDir string
	// Serving is the kubelet's API: with a certificate it serves HTTPS and
	// authenticates clients by certificates of ClientCAFile or by tokens
	// (TokenReview), and authorizes them by SubjectAccessReview, as a
	// kubelet of a production cluster does; `kubectl logs` then works
	// through an API server given a client certificate of that CA.
	// Without one it serves plain HTTP to anyone.
	Serving Serving
}

// Serving is the kubelet's serving certificate and the CA of its clients.
type Serving struct {
	CertFile, KeyFile, ClientCAFile string
}

// Run starts the fake runtime and the hollow kubelet. A hollow kubelet
// cannot be stopped: Run returns once it has started, and the kubelet
// runs until the process exits.
func Run(ctx context.Context, o Options) error {
	if o.MaxPods == 0 {
		o.MaxPods = 110
	}
	if o.StatusEvery == 0 {
		o.StatusEvery = time.Second
	}
	endpoint := o.RuntimeEndpoint
	if endpoint == "" {
		var err error
		if endpoint, err = fakeremote.GenerateEndpoint(); err != nil {
			return err
		}
		rt := NewRuntime(RuntimeOptions{InitNames: initNamesFrom(o.Client), OnCreate: o.OnCreate, Logger: klog.FromContext(ctx)})
		serving := make(chan error, 1)
		go func() { serving <- rt.Serve(ctx, endpoint) }()
		if err := waitForSocket(endpoint, serving); err != nil {
			return fmt.Errorf("container runtime: %w", err)
		}
	}
	rs, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return err
	}
	is, err := remote.NewRemoteImageService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return err
	}
	cm, err := NewContainerManager()
	if err != nil {
		return err
	}
	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{NodeName: o.NodeName, KubeletPort: o.Port, MaxPods: o.MaxPods, NodeLabels: o.Labels, RegisterWithTaints: o.Taints})
	f.RootDirectory = o.RootDir
	// Dead containers go at the next collection, as with a kubelet's
	// defaults (kubemark keeps them a minute).
	f.MinimumGCAge.Duration = 0
	c.ContainerRuntimeEndpoint = endpoint
	if o.PodLogsDir != "" {
		c.PodLogsDir = o.PodLogsDir
	}
	c.NodeStatusUpdateFrequency.Duration = o.StatusEvery
	c.SyncFrequency.Duration = o.StatusEvery
	// The fake image service "pulls" instantly; a restarted kubelet pulls
	// every pod's image again at once, which the default 5 pulls/s would
	// turn into minutes of ImagePullBackOff.
	c.RegistryPullQPS, c.RegistryBurst = 0, 0
	c.SerializeImagePulls = false
	cadvisor := &machine{Fake: cadvisortest.Fake{NodeName: o.NodeName}, cores: o.Cores, memory: o.MemoryBytes}
	hk := kubemark.NewHollowKubelet(f, c, o.Client, o.Client, cadvisor, is, rs, cm)
	if o.Serving.CertFile != "" {
		if err := secure(ctx, hk, o); err != nil {
			return err
		}
	}
	go hk.Run(ctx)
	return nil
}

// secure sets up the kubelet's HTTPS serving, authentication and
// authorization from its configuration, as the kubelet's own command does.
func secure(ctx context.Context, hk *kubemark.HollowKubelet, o Options) error {
	c := hk.KubeletConfiguration
	c.TLSCertFile, c.TLSPrivateKeyFile = o.Serving.CertFile, o.Serving.KeyFile
	c.Authentication.X509.ClientCAFile = o.Serving.ClientCAFile
	c.Authentication.Webhook.Enabled = true
	c.Authentication.Anonymous.Enabled = false
	c.Authorization.Mode = kubeletconfig.KubeletAuthorizationModeWebhook
	tlsOpts, err := kubeletapp.InitializeTLS(ctx, hk.KubeletFlags, c)
	if err != nil {
		return fmt.Errorf("kubelet TLS: %w", err)
	}
	auth, runCAReload, err := kubeletapp.BuildAuth(types.NodeName(o.NodeName), o.Client, *c)
	if err != nil {
		return fmt.Errorf("kubelet authentication: %w", err)
	}
	runCAReload(ctx.Done())
	hk.KubeletDeps.TLSOptions, hk.KubeletDeps.Auth = tlsOpts, auth
	return nil
}

// waitForSocket waits until a runtime serves on a unix endpoint.
func waitForSocket(endpoint string, serving <-chan error) error {
	path := strings.TrimPrefix(endpoint, "unix://")
	for range 500 {
		select {
		case err := <-serving:
			return fmt.Errorf("stopped: %w", err)
		default:
		}
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("not serving on %s after 5s", endpoint)
}

// machine is the fake cAdvisor with a configurable machine size.
type machine struct {
	cadvisortest.Fake
	cores  int
	memory uint64
}

func (m *machine) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	info, err := m.Fake.MachineInfo()
	if err != nil {
		return nil, err
	}
	if m.cores > 0 {
		info.NumCores = m.cores
	}
	if m.memory > 0 {
		info.MemoryCapacity = m.memory
	}
	return info, nil
}

// VersionInfo is the host's kernel and OS, which the node reports.
func (m *machine) VersionInfo() (*cadvisorapi.VersionInfo, error) {
	info, err := m.Fake.VersionInfo()
	if err != nil {
		return nil, err
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		info.KernelVersion = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				info.ContainerOsVersion = strings.Trim(v, `"`)
			}
		}
	}
	return info, nil
}

// initNamesFrom reads init container names from the API server, once per
// pod.
func initNamesFrom(client clientset.Interface) InitNames {
	var mu sync.Mutex
	cache := map[types.UID]sets.Set[string]{}
	return func(ctx context.Context, ns, name, uid string) (sets.Set[string], error) {
		mu.Lock()
		s, ok := cache[types.UID(uid)]
		mu.Unlock()
		if ok {
			return s, nil
		}
		pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		s = sets.New[string]()
		for i := range pod.Spec.InitContainers {
			if c := &pod.Spec.InitContainers[i]; !kubeobj.IsSidecar(c) {
				s.Insert(c.Name) // sidecars keep running
			}
		}
		mu.Lock()
		cache[pod.UID] = s
		mu.Unlock()
		return s, nil
	}
}
