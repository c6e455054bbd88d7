//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// The lab's sharing nodes (modes.SharingNodes) run NVIDIA's guides'
// configurations as written; these tests check what they offer and serve.

func allocatable(t *testing.T, node, res string) int64 {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q := n.Status.Allocatable[corev1.ResourceName(res)]
	return q.Value()
}

func waitAllocatable(t *testing.T, node, res string, want int64) {
	t.Helper()
	testenv.WaitFor(t, fmt.Sprintf("%s allocatable %s = %d", node, res, want), 2*time.Minute, func() bool {
		return allocatable(t, node, res) == want
	})
}

// TestGuideConfigsResources: time-slicing (replicas 4), MPS (replicas 10,
// renameByDefault) and mig-parted (all-1g.5gb, then all-2g.10gb through
// the node label) give the resources NVIDIA's plugin would, on one
// A100-40GB each.
func TestGuideConfigsResources(t *testing.T) {
	waitAllocatable(t, "lab-time-slicing", "nvidia.com/gpu", 4)
	waitAllocatable(t, "lab-mps", "nvidia.com/gpu.shared", 10)
	if v := allocatable(t, "lab-mps", "nvidia.com/gpu"); v != 0 {
		t.Errorf("lab-mps offers nvidia.com/gpu %d beside the renamed resource", v)
	}
	waitAllocatable(t, "lab-mig", "nvidia.com/mig-1g.5gb", 7)
	relabel(t, "lab-mig", api.LabelMIGConfig, "all-2g.10gb")
	defer relabel(t, "lab-mig", api.LabelMIGConfig, "all-1g.5gb")
	waitAllocatable(t, "lab-mig", "nvidia.com/mig-2g.10gb", 3)
	waitAllocatable(t, "lab-mig", "nvidia.com/mig-1g.5gb", 0)
	// The per-GPU report is a Node event.
	testenv.WaitFor(t, "a MIGLayoutApplied event for all-2g.10gb", time.Minute, func() bool {
		evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=lab-mig,reason=MIGLayoutApplied"})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "layout all-2g.10gb applied: 2g.10gb@0, 2g.10gb@2, 2g.10gb@4") {
				return true
			}
		}
		return false
	})
	relabel(t, "lab-mig", api.LabelMIGConfig, "all-1g.5gb")
	waitAllocatable(t, "lab-mig", "nvidia.com/mig-1g.5gb", 7)
}

func relabel(t *testing.T, node, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitRunning(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	testenv.WaitFor(t, ns+"/"+name+" running", 2*time.Minute, func() bool {
		var err error
		p, err = client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	return p
}

// TestMIGDevicePod: a pod asking nvidia.com/mig-1g.5gb: 1, as NVIDIA's
// mixed strategy users write it, runs on lab-mig with a MIG device's UUID.
func TestMIGDevicePod(t *testing.T) {
	const ns = "mig-static"
	useNamespace(t, ns)
	waitAllocatable(t, "lab-mig", "nvidia.com/mig-1g.5gb", 7)
	createAll(t, []*corev1.Pod{fixtures.MakePod().Namespace(ns).Name("mig").ZeroTerminationGracePeriod().Container("c", map[string]string{"nvidia.com/mig-1g.5gb": "1"}).Obj()})
	p := waitRunning(t, ns, "mig")
	rec := record(t, p)
	g := rec.Containers[0].Devices[0]
	if p.Spec.NodeName != "lab-mig" || g.MIG == nil || g.MIG.Profile != "1g.5gb" || !strings.HasPrefix(g.MIG.Device, "MIG-") {
		t.Fatalf("pod on %s with grant %+v %+v", p.Spec.NodeName, g, g.MIG)
	}
	c, err := dir.Node(p.Spec.NodeName).Container(ns, "mig", "c")
	if err != nil {
		t.Fatal(err)
	}
	if c.Env[api.EnvVisibleDevices] != g.MIG.Device || c.Env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "" {
		t.Errorf("container env %v, want %s=%s and no limiter", c.Env, api.EnvVisibleDevices, g.MIG.Device)
	}
	checkInvariant(t)
}

// TestMPSClients: MPS pods get the GPU's control-daemon pipe directory and
// their own limits: a pod asking 30 % and 8 GiB gets those, a plain
// replica gets 1/10; the daemon's server bound is the largest client's.
func TestMPSClients(t *testing.T) {
	const ns = "mps"
	useNamespace(t, ns)
	waitAllocatable(t, "lab-mps", "nvidia.com/gpu.shared", 10)
	createAll(t, []*corev1.Pod{
		fixtures.MakePod().Namespace(ns).Name("big").ZeroTerminationGracePeriod().Container("c", map[string]string{"nvidia.com/gpu.shared": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30"}).Obj(),
		fixtures.MakePod().Namespace(ns).Name("replica").ZeroTerminationGracePeriod().Container("c", map[string]string{"nvidia.com/gpu.shared": "1"}).Obj(),
	})
	want := map[string][2]string{"big": {"30", "0=8192M"}, "replica": {"10", "0=4096M"}}
	for name, w := range want {
		p := waitRunning(t, ns, name)
		c, err := dir.Node(p.Spec.NodeName).Container(ns, name, "c")
		if err != nil {
			t.Fatal(err)
		}
		if c.Env[deviceplugin.EnvMPSThreadPercentage] != w[0] || c.Env[deviceplugin.EnvMPSPinnedDeviceMemory] != w[1] || c.Env[deviceplugin.EnvMPSPipeDirectory] == "" {
			t.Errorf("%s: MPS env %v, want %s and %s", name, c.Env, w[0], w[1])
		}
		mem := map[string]string{"big": "8192m", "replica": "4096m"}[name]
		if c.Env["CUDA_DEVICE_MEMORY_LIMIT_0"] != mem || c.Env[api.EnvSMLimit] != "" {
			t.Errorf("%s: limiter env %v, want memory %s and no SM pacing", name, c.Env, mem)
		}
		pipe := ""
		for _, m := range c.Mounts {
			if m.ContainerPath == c.Env[deviceplugin.EnvMPSPipeDirectory] {
				pipe = m.HostPath
			}
		}
		if _, err := os.Stat(filepath.Join(pipe, "control")); err != nil {
			t.Errorf("%s: the pipe directory mounted (%q) has no control daemon socket: %v", name, pipe, err)
		}
	}
	// The control daemon bounds every client by the largest share (30 %).
	logs, _ := filepath.Glob(filepath.Join(dir.Node("lab-mps").MPS(), "*", "log", "control.log"))
	testenv.WaitFor(t, "the MPS daemon told the largest client's share", time.Minute, func() bool {
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			if strings.Contains(string(b), "Cmd:set_default_active_thread_percentage 30") && strings.Contains(string(b), "Cmd:set_default_device_pinned_mem_limit 0 8192M") {
				return true
			}
		}
		return false
	})
	checkInvariant(t)
}

// dynamicPod asks memory and compute on the dynamic-MIG node.
func dynamicPod(ns, name string, res map[string]string) *corev1.Pod {
	p := fixtures.MakePod().Namespace(ns).Name(name).ZeroTerminationGracePeriod().Container("c", res).Obj()
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "lab-mig-dynamic"}
	p.Spec.Tolerations = []corev1.Toleration{{Key: modes.SharingTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	return p
}

// TestDynamicMIG: seven 1g pods fill the A100's seven slices; a 3g pod
// then waits with a reason naming the blocking instances; deleting the
// pods on slices 0-3 frees them and the 3g pod runs.
func TestDynamicMIG(t *testing.T) {
	const ns = "mig-dynamic"
	useNamespace(t, ns)
	ctx := context.Background()
	var small []*corev1.Pod
	for i := range 7 {
		small = append(small, dynamicPod(ns, fmt.Sprintf("small-%d", i), map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "10"}))
	}
	createAll(t, small)
	starts := map[int]string{}
	for _, p := range small {
		r := waitRunning(t, ns, p.Name)
		g := record(t, r).Containers[0].Devices[0]
		if g.MIG == nil || g.MIG.Profile != "1g.5gb" {
			t.Fatalf("%s: grant %+v", p.Name, g)
		}
		c, err := dir.Node(r.Spec.NodeName).Container(ns, p.Name, "c")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(c.Env[api.EnvVisibleDevices], "MIG-") {
			t.Errorf("%s: %s=%q, want a MIG device", p.Name, api.EnvVisibleDevices, c.Env[api.EnvVisibleDevices])
		}
		starts[g.MIG.Start] = p.Name
	}
	if len(starts) != 7 {
		t.Fatalf("seven pods on %d distinct slices: %v", len(starts), starts)
	}
	createAll(t, []*corev1.Pod{dynamicPod(ns, "big", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "18000", "nvidia.com/gpucores": "30"})})
	var msg string
	testenv.WaitFor(t, "the 3g pod's scheduling failure naming the blocking instances (1g.5gb@…)", time.Minute, func() bool {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				msg = c.Message
			}
		}
		return strings.Contains(msg, "1g.5gb@")
	})
	if !strings.Contains(msg, "3g.20gb") {
		t.Errorf("reason %q does not name the profile", msg)
	}
	t.Logf("3g pod waits: %s", msg)
	var victims []string
	for s := 0; s < 4; s++ {
		victims = append(victims, starts[s])
	}
	sort.Strings(victims)
	zero := int64(0)
	for _, v := range victims {
		if err := client.CoreV1().Pods(ns).Delete(ctx, v, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	testenv.WaitFor(t, "the deleted pods' instances destroyed", time.Minute, func() bool {
		n, err := client.CoreV1().Nodes().Get(ctx, "lab-mig-dynamic", metav1.GetOptions{})
		if err != nil {
			return false
		}
		inv, err := api.DecodeInventory([]byte(n.Annotations[api.AnnotationInventory]))
		if err != nil || len(inv.GPUs) != 1 {
			return false
		}
		for _, d := range inv.GPUs[0].MIG.Devices {
			if d.Profile == "1g.5gb" && d.Start < 4 {
				return false
			}
		}
		return true
	})
	t.Logf("the deleted pods' MIG instances destroyed and the inventory republished %v after the deletion", time.Since(start).Round(100*time.Millisecond))
	p := waitRunning(t, ns, "big")
	g := record(t, p).Containers[0].Devices[0]
	if g.MIG == nil || g.MIG.Profile != "3g.20gb" || g.MIG.Start != 0 {
		t.Errorf("3g grant %+v", g.MIG)
	}
	t.Logf("3g pod running %v after the 1g pods on slices 0-3 were deleted", time.Since(start).Round(100*time.Millisecond))
	checkInvariant(t)
}

// TestConfigFieldRefused: a field that changes what a container gets and
// is not implemented is refused naming it, and the node keeps its last
// good profile; a plugin-only field is accepted and logged.
func TestConfigFieldRefused(t *testing.T) {
	ctx := context.Background()
	cms := client.CoreV1().ConfigMaps("tessera-system")
	cm, err := cms.Get(ctx, modes.NodeConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orig := cm.Data["mps"]
	defer func() {
		cm, err := cms.Get(ctx, modes.NodeConfigMap, metav1.GetOptions{})
		if err == nil {
			cm.Data["mps"] = orig
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Error(err)
		}
	}()
	agentLog := dir.Log("node-agent/lab-mps")
	set := func(doc string) {
		cm, err := cms.Get(ctx, modes.NodeConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["mps"] = doc
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set(orig + "flags:\n  plugin:\n    deviceIDStrategy: index\n")
	testenv.WaitFor(t, "the agent refusing deviceIDStrategy", time.Minute, func() bool {
		b, _ := os.ReadFile(agentLog)
		return strings.Contains(string(b), `flags.plugin.deviceIDStrategy \"index\" is not supported`)
	})
	if v := allocatable(t, "lab-mps", "nvidia.com/gpu.shared"); v != 10 {
		t.Errorf("lab-mps after a refused profile: nvidia.com/gpu.shared %d, want the last good 10", v)
	}
	set(orig + "flags:\n  failOnInitError: true\n")
	testenv.WaitFor(t, "the agent logging failOnInitError", time.Minute, func() bool {
		b, _ := os.ReadFile(agentLog)
		return strings.Contains(string(b), "flags.failOnInitError=true accepted and not used")
	})
}
