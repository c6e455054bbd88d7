//go:build integration

package nodeagent

// A hollow kubelet (k8s.io/kubernetes/pkg/kubemark) against a real
// kube-apiserver, with a container manager that hands device calls to the
// kubelet's real device manager, a fake CRI runtime, and the node agent on
// go-nvml's mock DGX A100. Pods are created bound to the node; the kubelet's
// own sync loop admits them, calls the plugin, and creates the containers
// with the plugin's environment, which the test reads from the CRI calls.
//
// A hollow kubelet cannot be stopped and owns the device-plugin socket, so
// the test re-runs itself in a child process (with its own mount
// namespace, see TestMain) and the parent checks the child's result.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	hollowChildEnv = "TESSERA_HOLLOW_CHILD"
	// hollowNode is the hollow kubelet's node.
	hollowNode = "gpu-hollow"
)

func TestHollowKubelet(t *testing.T) {
	if os.Getenv(hollowChildEnv) == "" {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^TestHollowKubelet$", "-test.v", "-test.count=1")
		var env []string
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, mountNSEnv+"=") {
				env = append(env, e)
			}
		}
		cmd.Env = append(env, hollowChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "hollow_integration_test.go") || strings.Contains(l, "Allocate refused") || strings.HasPrefix(strings.TrimSpace(l), "---") {
				t.Log(l)
			}
		}
		if err != nil {
			t.Fatalf("hollow kubelet child: %v\n%s", err, tail(string(out), 60))
		}
		return
	}
	hollowChild(t)
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func hollowChild(t *testing.T) {
	ctx := context.Background()
	cp := testenv.StartControlPlane(t)
	// The hollow kubelet cannot be stopped; cutting its connections before
	// the control plane stops spares the API server's 60 s wait for them.
	dialer := &killableDialer{}
	t.Cleanup(dialer.kill)
	kcfg := rest.CopyConfig(cp.RestConfig)
	kcfg.Dial = dialer.DialContext
	client, err := clientset.NewForConfig(kcfg)
	if err != nil {
		t.Fatal(err)
	}

	runtime := &createdContainers{byName: map[string]hollowkubelet.Container{}}
	port, err := freeTCPPort()
	if err != nil {
		t.Fatal(err)
	}
	if err := hollowkubelet.Run(ctx, hollowkubelet.Options{NodeName: hollowNode, Client: client, RootDir: kubeletRoot, Port: port, OnCreate: runtime.add}); err != nil {
		t.Fatal(err)
	}

	n := nvmltest.DGXA100()
	agent := startAgent(t, n, client, hollowNode, t.TempDir()+"/containers")
	t.Cleanup(func() { agent.stop(t) })
	gpus := make([]string, len(agent.Devices()))
	for i, d := range agent.Devices() {
		gpus[i] = d.GPU.UUID
	}

	start := time.Now()
	testenv.WaitFor(t, "nvidia.com/gpu in the Node's allocatable", 60*time.Second, func() bool {
		nd, err := client.CoreV1().Nodes().Get(ctx, hollowNode, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q := nd.Status.Allocatable[gpuRes]
		return q.Value() == 80
	})
	t.Logf("hollow kubelet registered, plugin slots in Node allocatable after %v", time.Since(start))

	// Pods bound to the node at once, written by 8 concurrent clients.
	const count = 16
	var pods []*v1.Pod
	for i := 0; i < count; i++ {
		var init, app [][]api.DeviceGrant
		app = append(app, []api.DeviceGrant{{UUID: gpus[i%8], MemoryMiB: int64(2000 + i), Cores: 10 + i}})
		if i%4 == 0 {
			init = append(init, []api.DeviceGrant{{UUID: gpus[(i+1)%8], MemoryMiB: int64(700 + i), Cores: 5}})
		}
		if i%5 == 0 {
			app = append(app, []api.DeviceGrant{{UUID: gpus[(i+2)%8], MemoryMiB: int64(300 + i), Cores: 7}, {UUID: gpus[(i+3)%8], MemoryMiB: int64(300 + i), Cores: 7}})
		}
		pods = append(pods, grantedPod("default", hollowNode, fmt.Sprintf("h%02d", i), init, app))
	}
	rogue := grantedPod("default", hollowNode, "rogue", nil, [][]api.DeviceGrant{{{UUID: gpus[0], MemoryMiB: 1, Cores: 1}}})
	delete(rogue.Annotations, api.AnnotationAllocation)
	pods = append(pods, rogue)
	start = time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(pods); i += 8 {
				created, err := client.CoreV1().Pods("default").Create(ctx, pods[i], metav1.CreateOptions{})
				if err != nil {
					t.Error(err)
					continue
				}
				pods[i] = created
			}
		}(w)
	}
	wg.Wait()

	var states []string
	defer func() {
		if t.Failed() {
			t.Logf("pod states: %s", strings.Join(states, "; "))
		}
	}()
	testenv.WaitFor(t, "every GPU pod running and the rogue pod rejected", 180*time.Second, func() bool {
		list, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		done := 0
		states = states[:0]
		for _, p := range list.Items {
			if p.Name == "rogue" && p.Status.Phase == v1.PodFailed || p.Name != "rogue" && p.Status.Phase == v1.PodRunning {
				done++
			}
			states = append(states, fmt.Sprintf("%s %s %s %s", p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message))
		}
		return done == len(pods)
	})
	t.Logf("%d pods bound at once: all running after %v; last GPU container created after %v", count, time.Since(start), runtime.lastCreate().Sub(start))

	got, err := client.CoreV1().Pods("default").Get(ctx, "rogue", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Reason != "UnexpectedAdmissionError" || !strings.Contains(got.Status.Message, "has no tessera.io/allocation annotation") {
		t.Errorf("rogue pod status %q: %q", got.Status.Reason, got.Status.Message)
	} else {
		t.Logf("rogue pod refused: %s", got.Status.Message)
	}

	for _, p := range pods[:count] {
		rec, err := api.DecodeAllocation([]byte(p.Annotations[api.AnnotationAllocation]))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range rec.Containers {
			cfg := runtime.config(p.Name, c.Name)
			if cfg == nil {
				t.Errorf("%s/%s: never created", p.Name, c.Name)
				continue
			}
			env := cfg.Env
			var uuids []string
			for k, d := range c.Devices {
				uuids = append(uuids, d.UUID)
				if env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", k)] != fmt.Sprintf("%dm", d.MemoryMiB) {
					t.Errorf("%s/%s: env %v does not carry device %d of %+v", p.Name, c.Name, env, k, c.Devices)
				}
			}
			if env[api.EnvVisibleDevices] != strings.Join(uuids, ",") {
				t.Errorf("%s/%s: %s=%q, want %q", p.Name, c.Name, api.EnvVisibleDevices, env[api.EnvVisibleDevices], strings.Join(uuids, ","))
			}
			mounts := map[string]bool{}
			for _, m := range cfg.Mounts {
				mounts[m.ContainerPath] = true
			}
			if !mounts["/etc/ld.so.preload"] || !mounts["/tessera/state"] {
				t.Errorf("%s/%s: mounts %v", p.Name, c.Name, cfg.Mounts)
			}
		}
	}
}

// killableDialer dials TCP and can close every connection it made and
// refuse new ones.
type killableDialer struct {
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (d *killableDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, fmt.Errorf("test over: not dialing %s", addr)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *killableDialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// createdContainers remembers every container the fake runtime created.
type createdContainers struct {
	mu     sync.Mutex
	byName map[string]hollowkubelet.Container // "pod/container"
	last   time.Time                          // of the last creation
}

func (r *createdContainers) add(c hollowkubelet.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byName[c.Pod+"/"+c.Name] = c
	r.last = c.Created
}

func (r *createdContainers) lastCreate() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func (r *createdContainers) config(pod, container string) *hollowkubelet.Container {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.byName[pod+"/"+container]
	if !ok {
		return nil
	}
	return &c
}
