package parts

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/volcano"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const (
	vNode   = "volcano-node"
	vGPUMiB = 40960
)

func vUUID(i int) string { return fmt.Sprintf("GPU-%08d-1111-2222-3333-444444444444", i) }

// vKubelet plays the kubelet's pod-resources API: the pods it admits, with
// the devices it has assigned so far.
type vKubelet struct {
	mu   sync.Mutex
	pods []deviceplugin.KubeletPod
}

func (k *vKubelet) List(context.Context) ([]deviceplugin.KubeletPod, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]deviceplugin.KubeletPod(nil), k.pods...), nil
}

// vEnv is the vgpu-number device plugin of a volcano node (2 GPUs of
// 40960 MiB, 10 slots each) with the agent's checks, the volcano part as
// its protocol and a fake API server.
type vEnv struct {
	t       *testing.T
	client  *fake.Clientset
	plugin  *deviceplugin.Plugin
	kubelet *vKubelet
	state   statedir.Dirs
	// gpus are the node's GPU UUIDs, in the order a container's devices
	// are allocated.
	gpus    []string
	mu      sync.Mutex
	refused map[string]string
}

func newVEnv(t *testing.T) *vEnv {
	root := t.TempDir()
	paths := deviceplugin.DefaultPaths()
	paths.StateRoot, paths.PreloadHost = filepath.Join(root, "state"), filepath.Join(root, "preload")
	e := &vEnv{t: t, client: fake.NewClientset(), kubelet: &vKubelet{}, state: statedir.Dirs{Root: paths.StateRoot}, refused: map[string]string{}}
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	vol := NewVolcano(VolcanoOptions{NodeName: vNode, Client: e.client, State: e.state, Logger: logger})
	pods := PodGetter{Client: e.client}
	guard := &deviceplugin.Guard{
		Names: api.DefaultResourceNames,
		NodePods: func() []*v1.Pod {
			l, _ := e.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
			var out []*v1.Pod
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			return out
		},
		Refused: e.noteRefused,
	}
	e.plugin = deviceplugin.New(deviceplugin.Options{
		Resource: api.VolcanoVGPUNumber, Paths: paths, PluginDir: root, Guard: guard,
		Matcher: &deviceplugin.Matcher{Node: vNode, Resource: api.VolcanoVGPUNumber, Kubelet: e.kubelet, Pods: pods, State: e.state, Protocol: vol},
	}, logger)
	var gpus []deviceplugin.GPU
	for i := range 2 {
		gpus = append(gpus, deviceplugin.GPU{UUID: vUUID(i), Healthy: true, Slots: 10, MemoryMiB: vGPUMiB, MemoryCapMiB: vGPUMiB})
		e.gpus = append(e.gpus, vUUID(i))
	}
	e.plugin.SetGPUs(gpus, api.SharingShared)
	return e
}

// vgpuPod is a pod of Volcano's: containers asking vGPU limits, and the
// annotations Volcano's scheduler wrote (ids, for node).
func vgpuPod(name, node, ids string, containers ...map[string]string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{NodeName: vNode, SchedulerName: api.VolcanoSchedulerName},
	}
	if ids != "" {
		p.Annotations = map[string]string{
			api.AnnotationVolcanoNode: node, api.AnnotationVolcanoIDs: ids, api.AnnotationVolcanoToAllocate: ids,
			api.AnnotationVolcanoBindPhase: api.VolcanoBindAllocating, api.AnnotationVolcanoTime: "1790000000",
		}
	}
	for i, res := range containers {
		c := v1.Container{Name: fmt.Sprintf("c%d", i), Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
		for k, v := range res {
			c.Resources.Limits[v1.ResourceName(k)] = resource.MustParse(v)
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

// admit plays the kubelet admitting p: each container asking vgpu-number
// is allocated in order; the first error ends it.
func (e *vEnv) admit(p *v1.Pod) (map[string]*pluginapi.ContainerAllocateResponse, error) {
	ctx := context.Background()
	if _, err := e.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	e.kubelet.mu.Lock()
	e.kubelet.pods = append(e.kubelet.pods, deviceplugin.KubeletPod{Namespace: p.Namespace, Name: p.Name, Devices: map[string][]string{}})
	kp := &e.kubelet.pods[len(e.kubelet.pods)-1]
	e.kubelet.mu.Unlock()
	out := map[string]*pluginapi.ContainerAllocateResponse{}
	for _, c := range p.Spec.Containers {
		q, ok := c.Resources.Limits[api.VolcanoVGPUNumber]
		if !ok {
			continue
		}
		var ids []string
		for k := range int(q.Value()) {
			ids = append(ids, deviceplugin.SlotID(e.gpus[k], 9))
		}
		resp, err := e.plugin.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
		if err != nil {
			// The kubelet fails the pod: it is no longer active.
			e.kubelet.mu.Lock()
			e.kubelet.pods = e.kubelet.pods[:len(e.kubelet.pods)-1]
			e.kubelet.mu.Unlock()
			return nil, err
		}
		e.kubelet.mu.Lock()
		kp.Devices[c.Name] = ids
		e.kubelet.mu.Unlock()
		out[c.Name] = resp.ContainerResponses[0]
	}
	return out, nil
}

// noteRefused is the guard's Refused: the agent's event on the pod.
func (e *vEnv) noteRefused(p *v1.Pod, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refused[p.Name] = reason
}

func (e *vEnv) bindPhase(name string) string {
	p, err := e.client.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Annotations[api.AnnotationVolcanoBindPhase]
}

func (e *vEnv) expectRefused(p *v1.Pod, want string, event bool) {
	e.t.Helper()
	_, err := e.admit(p)
	if err == nil || !strings.Contains(err.Error(), want) {
		e.t.Fatalf("pod %s: %v, want a refusal mentioning %q", p.Name, err, want)
	}
	e.mu.Lock()
	reason := e.refused[p.Name]
	e.mu.Unlock()
	if event && !strings.Contains(reason, want) {
		e.t.Errorf("pod %s: the refusal is not in its events (%q)", p.Name, reason)
	}
	if event && e.bindPhase(p.Name) != api.VolcanoBindFailed {
		e.t.Errorf("pod %s: bind phase %q, want %q", p.Name, e.bindPhase(p.Name), api.VolcanoBindFailed)
	}
	for _, c := range p.Spec.Containers {
		if e.state.Served(p.UID, c.Name) {
			e.t.Errorf("pod %s: refused container %s recorded as served", p.Name, c.Name)
		}
	}
}

// TestVolcanoServesItsAnnotations: Volcano's example of several containers
// (vgpu-case03: two vGPU containers around one without), annotated as
// Volcano's scheduler annotates it, is served container by container with
// the limiter at the annotated memory; the bind phase turns "success"
// after the last one, and every grant is in the node's ledger.
func TestVolcanoServesItsAnnotations(t *testing.T) {
	e := newVEnv(t)
	ids := volcano.EncodePodDevices([][]volcano.Device{
		{{UUID: vUUID(0), Type: "NVIDIA", MemoryMiB: 2000}, {UUID: vUUID(1), Type: "NVIDIA", MemoryMiB: 2000}},
		{{UUID: vUUID(0), Type: "NVIDIA", MemoryMiB: 3000}, {UUID: vUUID(1), Type: "NVIDIA", MemoryMiB: 3000}},
	})
	p := vgpuPod("case03", vNode, ids,
		map[string]string{api.VolcanoVGPUNumber: "2", api.VolcanoVGPUMemory: "2000"},
		map[string]string{},
		map[string]string{api.VolcanoVGPUNumber: "2", api.VolcanoVGPUMemory: "3000"})
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	for c, mem := range map[string]string{"c0": "2000m", "c2": "3000m"} {
		r := out[c]
		if r == nil || r.Envs["CUDA_DEVICE_MEMORY_LIMIT_0"] != mem || r.Envs["CUDA_DEVICE_MEMORY_LIMIT_1"] != mem || r.Envs[api.EnvVisibleDevices] != vUUID(0)+","+vUUID(1) {
			t.Errorf("container %s: %+v, want %s on both GPUs", c, r, mem)
			continue
		}
		found := false
		for _, m := range r.Mounts {
			found = found || (m.ContainerPath == limiterconf.Path && m.ReadOnly)
		}
		if !found {
			t.Errorf("container %s: no read-only limits file in %+v", c, r.Mounts)
		}
	}
	if got := e.bindPhase("case03"); got != api.VolcanoBindSuccess {
		t.Errorf("bind phase %q, want %q", got, api.VolcanoBindSuccess)
	}
	es, err := e.state.Entries()
	if err != nil || len(es) != 2 {
		t.Fatalf("ledger %+v, %v", es, err)
	}
	// Volcano rebuilds its usage from vgpu-ids-new: the agent leaves it.
	got, _ := e.client.CoreV1().Pods("ns").Get(context.Background(), "case03", metav1.GetOptions{})
	if got.Annotations[api.AnnotationVolcanoIDs] != ids {
		t.Errorf("%s changed to %q", api.AnnotationVolcanoIDs, got.Annotations[api.AnnotationVolcanoIDs])
	}
}

// TestVolcanoForgedAnnotationsRefused: annotations that grant more than
// the pod asks, another node's, none at all, or a GPU past its memory
// beside what the node serves (a misbehaving scheduler's over-commit) are
// refused, with the reason in the pod's events where the pod's grants were
// read, and nothing enters the ledger.
func TestVolcanoForgedAnnotationsRefused(t *testing.T) {
	e := newVEnv(t)
	ask := func(mem string) map[string]string {
		return map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: mem}
	}
	one := func(uuid string, mem int64, cores int) string {
		return volcano.EncodePodDevices([][]volcano.Device{{{UUID: uuid, Type: "NVIDIA", MemoryMiB: mem, Cores: cores}}})
	}
	e.expectRefused(vgpuPod("more-memory", vNode, one(vUUID(0), 30000, 0), ask("2000")), "granted 30000 MiB, the container asks for 2000 MiB", true)
	e.expectRefused(vgpuPod("more-cores", vNode, one(vUUID(0), 2000, 100), ask("2000")), "granted 100 percent of the cores, the container asks for 0", true)
	e.expectRefused(vgpuPod("other-node", "node-b", one(vUUID(0), 2000, 0), ask("2000")), `record is for node "node-b"`, false)
	e.expectRefused(vgpuPod("self-bound", vNode, "", ask("2000")), "has no volcano.sh/vgpu-node", false)
	e.expectRefused(vgpuPod("not-here", vNode, one("GPU-99999999-1111-2222-3333-444444444444", 2000, 0), ask("2000")), "not a GPU of this node", true)
	e.expectRefused(vgpuPod("mig", vNode, vUUID(0)+"[group1-0],NVIDIA,5120,0:", ask("5120")), "MIG position", false)

	// Over-commit: each pod's annotation matches its request, but the
	// second would put GPU 0 past its 40960 MiB.
	if _, err := e.admit(vgpuPod("big-1", vNode, one(vUUID(0), 30000, 0), ask("30000"))); err != nil {
		t.Fatal(err)
	}
	e.expectRefused(vgpuPod("big-2", vNode, one(vUUID(0), 30000, 0), ask("30000")), "would be over its memory: 60000 MiB of 40960", true)
	if es, _ := e.state.Entries(); len(es) != 1 {
		t.Errorf("ledger holds %d grants, want big-1's alone", len(es))
	}
	// The same pod on the other GPU fits.
	if _, err := e.admit(vgpuPod("big-3", vNode, one(vUUID(1), 30000, 0), ask("30000"))); err != nil {
		t.Errorf("big-3 on GPU 1: %v", err)
	}
}

// TestVolcanoRegistration: what the node registers with Volcano for its
// offer, in Volcano's format, and the capacities it advertises.
func TestVolcanoRegistration(t *testing.T) {
	n := &Node{
		Inventory: &api.NodeInventory{GPUs: []api.GPU{{UUID: vUUID(0), Model: "NVIDIA A100-SXM4-40GB"}, {UUID: vUUID(1), Model: "NVIDIA A100-SXM4-40GB"}}},
		Offer: Offer{api.VolcanoVGPUNumber: {
			{UUID: vUUID(0), Healthy: true, Slots: 10, MemoryMiB: vGPUMiB},
			{UUID: vUUID(1), Healthy: false, Slots: 10, MemoryMiB: vGPUMiB},
		}},
	}
	gpus, mem, cores := Registration(n)
	want := vUUID(0) + ",10,40960,NVIDIA-NVIDIA A100-SXM4-40GB,true,hami-core:" + vUUID(1) + ",10,40960,NVIDIA-NVIDIA A100-SXM4-40GB,false,hami-core:"
	if got := volcano.EncodeRegister(gpus); got != want {
		t.Errorf("registration\n%s\nwant\n%s", got, want)
	}
	if mem != vGPUMiB || cores != 100 {
		t.Errorf("capacity: %d MiB, %d cores; want the healthy GPU's 40960 and 100", mem, cores)
	}
}
