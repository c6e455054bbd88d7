package hollowkubelet

import (
	"context"
	"fmt"
	v1 "k8s.io/api/core/v1"
	"sync"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"go.opentelemetry.io/otel/trace/noop"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clientset "k8s.io/client-go/kubernetes"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
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
	// OnCreate, if set, sees every container the runtime is asked to create.
	OnCreate func(Container)
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
	endpoint, err := fakeremote.GenerateEndpoint()
	if err != nil {
		return err
	}
	fakeRuntime := fakeremote.NewFakeRemoteRuntime()
	if err := fakeRuntime.Start(endpoint); err != nil {
		return fmt.Errorf("fake container runtime: %w", err)
	}
	rs, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return err
	}
	runtime := &recordingRuntime{
		RuntimeService: rs, fake: fakeRuntime.RuntimeService, onCreate: o.OnCreate,
		initOf: initNamesFrom(o.Client), byID: map[string]Container{},
	}
	cm, err := NewContainerManager()
	if err != nil {
		return err
	}
	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{NodeName: o.NodeName, KubeletPort: o.Port, MaxPods: o.MaxPods, NodeLabels: o.Labels, RegisterWithTaints: o.Taints})
	f.RootDirectory = o.RootDir
	c.NodeStatusUpdateFrequency.Duration = o.StatusEvery
	c.SyncFrequency.Duration = o.StatusEvery
	// The fake image service "pulls" instantly; a restarted kubelet pulls
	// every pod's image again at once, which the default 5 pulls/s would
	// turn into minutes of ImagePullBackOff.
	c.RegistryPullQPS, c.RegistryBurst = 0, 0
	c.SerializeImagePulls = false
	cadvisor := &machine{Fake: cadvisortest.Fake{NodeName: o.NodeName}, cores: o.Cores, memory: o.MemoryBytes}
	hk := kubemark.NewHollowKubelet(f, c, o.Client, o.Client, cadvisor, fakeRuntime.ImageService, runtime, cm)
	go hk.Run(ctx)
	return nil
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
