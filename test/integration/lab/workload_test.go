//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/status"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

// TestExamples applies examples/ with kubectl and follows every pod down
// the whole path: webhook → scheduler → kubelet admission → device plugin
// Allocate → the environment and mounts of the containers the runtime
// created.
func TestExamples(t *testing.T) {
	ctx := context.Background()
	out := kubectl(t, "apply", "-f", "examples/")
	t.Logf("kubectl apply -f examples/:\n%s", out)
	if err := status.WaitSettled(ctx, client, metav1.NamespaceDefault, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 14 { // 6 pods and 8 Deployment replicas
		t.Fatalf("%d pods in default, want 14", len(pods.Items))
	}
	// What each example asks for, per container: the number of GPUs and
	// the ask on each, as its manifest states it (a percentage of memory
	// is granted of the GPU the container lands on: the lab's nodes hold
	// A100-40GB and H100-80GB GPUs).
	type want struct {
		gpus int
		ask  gpushare.Ask
	}
	wants := map[string]want{
		"whole-gpu/train":           {1, gpushare.Ask{}},
		"fractional-explicit/infer": {1, gpushare.Ask{MemoryMiB: 10000, Cores: 30}},
		"fractional-half/notebook":  {1, gpushare.Ask{MemoryPercent: 50, Cores: 50}},
		"multi-gpu/finetune":        {2, gpushare.Ask{MemoryMiB: 16384, Cores: 50}},
		"multi-container/warmup":    {1, gpushare.Ask{MemoryMiB: 4096, Cores: 20}},
		"multi-container/model":     {1, gpushare.Ask{MemoryMiB: 8192, Cores: 40}},
		"multi-container/embedder":  {1, gpushare.Ask{MemoryPercent: 10, Cores: 10}},
		"hami-style/app":            {1, gpushare.Ask{MemoryPercent: 25, Cores: 25}},
		"inference/server":          {1, gpushare.Ask{MemoryPercent: 20, Cores: 20}},
	}
	gpuMemory := nodeGPUMemory(t)
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s is %s: %+v", p.Name, p.Status.Phase, p.Status.Conditions)
			continue
		}
		rec := record(t, &p)
		if len(rec.Containers) == 0 {
			t.Errorf("pod %s: record holds no container", p.Name)
		}
		for _, c := range rec.Containers {
			key := p.Name + "/" + c.Name
			if p.Labels["app"] == "inference" {
				key = "inference/" + c.Name
			}
			w, ok := wants[key]
			if !ok {
				t.Errorf("%s: unexpected container in the record", key)
				continue
			}
			if len(c.Devices) != w.gpus {
				t.Errorf("%s: %d GPUs, want %d", key, len(c.Devices), w.gpus)
			}
			for _, d := range c.Devices {
				mem, ok := gpuMemory[p.Spec.NodeName][d.UUID]
				if !ok {
					t.Errorf("%s: granted GPU %s, which node %s's inventory does not list", key, d.UUID, p.Spec.NodeName)
					continue
				}
				if g := w.ask.Grant(d.UUID, mem); d.MemoryMiB != g.MemoryMiB || d.Exclusive != g.Exclusive || d.Cores != g.Cores {
					t.Errorf("%s: granted %+v on a GPU of %d MiB, want %+v (ask %+v)", key, d, mem, g, w.ask)
				}
			}
			checkContainer(t, &p, c)
		}
	}
	shown := labCmd(t, "status")
	t.Logf("tessera-lab status:\n%s", shown)
	for _, s := range []string{"whole-gpu", "fractional-half", "lab-gpu-01", "A100-SXM4-40GB", "invariant checker: no GPU over"} {
		if !strings.Contains(shown, s) {
			t.Errorf("status does not mention %q", s)
		}
	}
	checkInvariant(t)
	kubectl(t, "delete", "-f", "examples/", "--grace-period=0", "--wait=false")
	testenv.WaitFor(t, "the examples' pods deleted", 2*time.Minute, func() bool {
		l, err := client.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
}

// nodeGPUMemory reads each node's published inventory: per node, each
// GPU's memory (MiB) by UUID.
func nodeGPUMemory(t *testing.T) map[string]map[string]int64 {
	t.Helper()
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, n := range nodes.Items {
		raw, ok := n.Annotations[api.AnnotationInventory]
		if !ok {
			continue
		}
		inv, err := api.DecodeInventory([]byte(raw))
		if err != nil {
			t.Fatalf("node %s's inventory: %v", n.Name, err)
		}
		out[n.Name] = map[string]int64{}
		for _, g := range inv.GPUs {
			out[n.Name][g.UUID] = g.MemoryMiB
		}
	}
	return out
}

func record(t *testing.T, p *corev1.Pod) *api.PodAllocation {
	t.Helper()
	rec, err := api.DecodeAllocation([]byte(p.Annotations[api.AnnotationAllocation]))
	if err != nil {
		t.Fatalf("pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	if rec.Node != p.Spec.NodeName {
		t.Fatalf("pod %s/%s bound to %s, record says %s", p.Namespace, p.Name, p.Spec.NodeName, rec.Node)
	}
	return rec
}

// checkContainer compares what the node's fake runtime was asked to
// create with the pod's allocation record: the GPUs exposed, the
// kubelet's devices, and, on shared GPUs, the read-only limits file the
// limiter enforces (when it exists, the limit variables are ignored:
// internal/limiterconf) with each GPU's granted memory and compute share.
// The device plugin's variables are checked where the pod does not set
// them itself: the kubelet puts the pod's own variables after the
// device plugin's, so the pod's value is the one the container sees.
func checkContainer(t *testing.T, p *corev1.Pod, c api.ContainerAllocation) *hollowkubelet.Container {
	t.Helper()
	got, err := dir.Node(p.Spec.NodeName).Container(p.Namespace, p.Name, c.Name)
	if err != nil {
		t.Errorf("%s/%s: %v", p.Name, c.Name, err)
		return nil
	}
	if got.PodUID != string(p.UID) {
		t.Errorf("%s/%s: recorded container belongs to pod UID %s, want %s", p.Name, c.Name, got.PodUID, p.UID)
	}
	podSets := map[string]bool{}
	for _, pc := range append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
		if pc.Name == c.Name {
			for _, e := range pc.Env {
				podSets[e.Name] = true
			}
		}
	}
	envIs := func(name, want string) {
		t.Helper()
		if v := got.Env[name]; !podSets[name] && v != want {
			t.Errorf("%s/%s: %s=%q, want %q", p.Name, c.Name, name, v, want)
		}
	}
	var uuids []string
	var wantLimits []limiterconf.Device
	shared := false
	for k, d := range c.Devices {
		uuids = append(uuids, d.UUID)
		if d.Exclusive {
			wantLimits = append(wantLimits, limiterconf.Device{UUID: d.UUID, SMPercent: d.Cores})
			continue
		}
		shared = true
		wantLimits = append(wantLimits, limiterconf.Device{UUID: d.UUID, MemoryMiB: uint64(d.MemoryMiB), SMPercent: d.Cores})
		envIs(fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", k), fmt.Sprintf("%dm", d.MemoryMiB))
		if d.Cores > 0 {
			envIs("CUDA_DEVICE_SM_LIMIT", fmt.Sprint(d.Cores))
		}
	}
	envIs(api.EnvVisibleDevices, strings.Join(uuids, ","))
	// The GPUs the runtime exposed, in the record's order, and the
	// kubelet's devices (app containers: the pod-resources API does not
	// list init containers).
	var exposed []string
	for _, g := range got.GPUs {
		exposed = append(exposed, g.UUID)
	}
	if strings.Join(exposed, ",") != strings.Join(uuids, ",") {
		t.Errorf("%s/%s: GPUs exposed %v, want %v", p.Name, c.Name, exposed, uuids)
	}
	isInit := false
	for _, ic := range p.Spec.InitContainers {
		isInit = isInit || ic.Name == c.Name
	}
	if !isInit {
		ids := 0
		for _, d := range got.Devices {
			if d.Resource == names.GPU {
				ids += len(d.IDs)
			}
		}
		if ids != len(c.Devices) {
			t.Errorf("%s/%s: the kubelet's devices %+v, want %d of %s", p.Name, c.Name, got.Devices, len(c.Devices), names.GPU)
		}
	}
	preload, limits := false, false
	for _, m := range got.Mounts {
		preload = preload || m.ContainerPath == "/etc/ld.so.preload" && m.ReadOnly
		if m.ContainerPath == limiterconf.Path && m.ReadOnly {
			limits = true
			checkLimitsFile(t, p.Name+"/"+c.Name, m.HostPath, wantLimits)
		}
	}
	if preload != shared || limits != shared {
		t.Errorf("%s/%s: limiter preloaded = %v, read-only limits file = %v, want %v (shared GPU)", p.Name, c.Name, preload, limits, shared)
	}
	if !shared && !podSets["CUDA_DEVICE_MEMORY_LIMIT_0"] && got.Env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "" {
		t.Errorf("%s/%s: whole GPU limited: %v", p.Name, c.Name, got.Env)
	}
	return got
}

// checkLimitsFile reads the limits file a container got (its host path)
// and compares its devices, in order, with the grant's.
func checkLimitsFile(t *testing.T, who, path string, want []limiterconf.Device) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%s: the limits file: %v", who, err)
		return
	}
	cfg, err := limiterconf.Parse(b)
	if err != nil {
		t.Errorf("%s: the limits file %s: %v", who, path, err)
		return
	}
	if !slices.Equal(cfg.Devices, want) {
		t.Errorf("%s: the limits file %s grants %+v, want %+v", who, path, cfg.Devices, want)
	}
}

// shapes are the fractional requests of the load tests.
var shapes = []map[string]string{
	{names.GPU: "1", names.MemoryPercentage: "10", names.Cores: "10"},
	{names.GPU: "1", names.Memory: "2048", names.Cores: "5"},
	{names.GPU: "1", names.MemoryPercentage: "15", names.Cores: "15"},
	{names.GPU: "1", names.Memory: "3000"},
}

func fractionalPod(ns, name string, shape map[string]string) *corev1.Pod {
	return fixtures.MakePod().Namespace(ns).Name(name).ZeroTerminationGracePeriod().Container("c", shape).Obj()
}

// useNamespace creates the test's namespace and, when the test ends,
// deletes every pod in it and waits until they are gone, so the next test
// finds the lab's GPUs free.
func useNamespace(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the pods of %s: %v", ns, err)
			return
		}
		testenv.WaitFor(t, "the pods of "+ns+" deleted", 3*time.Minute, func() bool {
			l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0
		})
	})
}

// createAll creates the pods from 16 concurrent clients.
func createAll(t *testing.T, pods []*corev1.Pod) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(pods))
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(pods); i += 16 {
				if _, err := client.CoreV1().Pods(pods[i].Namespace).Create(context.Background(), pods[i], metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("creating %s: %w", pods[i].Name, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

const loadNS = "load"

// checkSettled asserts every pod of the namespace runs with its record
// in its containers, or is pending with a reason a user can act on, or
// has failed in a way mayFail (if not nil) accepts; it returns those.
func checkSettled(t *testing.T, ns string, mayFail func(*corev1.Pod) bool) (running, pending int, failed []corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if err := status.WaitSettled(ctx, client, ns, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		switch p.Status.Phase {
		case corev1.PodRunning:
			running++
			rec := record(t, &p)
			for _, c := range rec.Containers {
				checkContainer(t, &p, c)
			}
		case corev1.PodPending:
			pending++
			msg := ""
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled {
					msg = c.Message
				}
			}
			if !strings.Contains(msg, "nodes") {
				t.Errorf("pending pod %s: scheduling message %q does not say why per node group", p.Name, msg)
			}
		default:
			if mayFail != nil && mayFail(&p) {
				failed = append(failed, p)
				continue
			}
			t.Errorf("pod %s on %s is %s: %s %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
	}
	return running, pending, failed
}

// TestConcurrentFractionalPods creates 300 fractional pods at once on the
// fractional nodes' 40 GPUs.
func TestConcurrentFractionalPods(t *testing.T) {
	useNamespace(t, loadNS)
	var pods []*corev1.Pod
	for i := range 300 {
		pods = append(pods, fractionalPod(loadNS, fmt.Sprintf("p-%03d", i), shapes[i%len(shapes)]))
	}
	start := time.Now()
	createAll(t, pods)
	running, pending, _ := checkSettled(t, loadNS, nil)
	r := checkInvariant(t)
	k := r.Packing()
	t.Logf("300 pods created at once: %d running, %d pending after %v; %d of %d GPUs in use, %.1f%% of GPU memory allocated",
		running, pending, time.Since(start).Round(100*time.Millisecond), k.InUse, k.GPUs, 100*float64(k.UsedMiB)/float64(k.MemoryMiB))
	if running < 250 {
		t.Errorf("only %d of 300 pods running; the 40 GPUs hold more", running)
	}
}

// faultsNS holds TestFaults' pods.
const faultsNS = "faults"

// faultPods is how many pods TestFaults creates during the faults:
// TESSERA_FAULT_PODS, default 100 (CI); the full-size run is 200.
func faultPods(t *testing.T) int {
	n := 100
	if v := os.Getenv("TESSERA_FAULT_PODS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("TESSERA_FAULT_PODS=%q", v)
		}
	}
	return n
}

// TestFaults kills the scheduler, a node agent and a hollow kubelet with
// SIGKILL while pods are being created, and requires that nothing is lost:
// every killed component comes back, every pod placed before keeps its
// node and record, no pod runs without a record, no GPU is over-committed
// (by the records or by what the containers were given), and the kubelet
// rejects no pod. The last is what the kubelet shim is for: before it, a
// pod bound while its node's agent restarted met a device manager without
// a plugin and was rejected for good (UnexpectedAdmissionError "no healthy
// devices present") in about half of the runs.
func TestFaults(t *testing.T) {
	ctx := context.Background()
	useNamespace(t, faultsNS)
	n := faultPods(t)
	// Witnesses: pods placed before the faults, which must keep their
	// allocations through them.
	var witnesses []*corev1.Pod
	for i := range n / 2 {
		witnesses = append(witnesses, fractionalPod(faultsNS, fmt.Sprintf("w-%03d", i), shapes[i%len(shapes)]))
	}
	// Two witnesses pinned to lab-gpu-03, whose kubelet is killed: the
	// adoption check below is never vacuous, and that kubelet allocates
	// after the previous test deleted its pods. The kubelet's device
	// manager forgets a deleted pod's devices only when it next allocates
	// (and, after a restart, only once its pod sources are ready), so a
	// kubelet restarted before that reads them back from its checkpoint as
	// in use and refuses the first pods it is sent with "requested number
	// of devices unavailable" — the kubelet's behaviour, not Tessera's
	// (docs/operations.md), and not what this test is about.
	for i := range 2 {
		p := fractionalPod(faultsNS, fmt.Sprintf("w3-%d", i), shapes[0])
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "lab-gpu-03"}
		witnesses = append(witnesses, p)
	}
	createAll(t, witnesses)
	checkSettled(t, faultsNS, nil)
	before, err := client.CoreV1().Pods(faultsNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]corev1.Pod{}
	for _, p := range before.Items {
		if p.Spec.NodeName != "" {
			kept[p.Name] = p
		}
	}
	if len(kept) == 0 {
		t.Fatal("no witness pod was placed")
	}

	victims := []string{"scheduler", "node-agent/lab-gpu-02", "kubelet/lab-gpu-03"}
	st, err := lab.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The containers of lab-gpu-03 before its kubelet dies: they must
	// keep running (the node's runtime outlives the kubelet, as
	// containerd does) and be adopted by the restarted kubelet.
	running03 := map[string]*hollowkubelet.Container{}
	for name, p := range kept {
		if p.Spec.NodeName != "lab-gpu-03" {
			continue
		}
		c, err := dir.Node(p.Spec.NodeName).Container(p.Namespace, p.Name, "c")
		if err != nil || c.PID == 0 || !supervisor.ProcessAlive(c.PID) {
			t.Fatalf("pod %s on lab-gpu-03: container %+v, %v; want it running", name, c, err)
		}
		running03[name] = c
	}
	if len(running03) < 2 {
		t.Fatalf("%d witness pods run on lab-gpu-03; want the 2 pinned there at least", len(running03))
	}
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, fractionalPod(faultsNS, fmt.Sprintf("f-%03d", i), shapes[i%len(shapes)]))
	}
	killedAt := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		createAll(t, pods)
	}()
	for _, v := range victims {
		time.Sleep(700 * time.Millisecond)
		pid := st.Components[v].PID
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Errorf("killing %s (pid %d): %v", v, pid, err)
		}
		t.Logf("killed %s (pid %d) %v after the pods started coming", v, pid, time.Since(killedAt).Round(time.Millisecond))
	}
	<-done
	testenv.WaitFor(t, "the killed components restarted", time.Minute, func() bool {
		now, err := lab.ReadState(dir)
		if err != nil {
			return false
		}
		for _, v := range victims {
			if c := now.Components[v]; c.Restarts == 0 || c.PID == st.Components[v].PID || !supervisor.ProcessAlive(c.PID) {
				return false
			}
		}
		return true
	})
	// The restarted kubelet adopts the containers that ran on: the same
	// container, the same process.
	testenv.WaitFor(t, "lab-gpu-03's pods running again after its kubelet restart", 3*time.Minute, func() bool {
		for name := range running03 {
			p, err := client.CoreV1().Pods(faultsNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning || !podReady(p) {
				return false
			}
		}
		return true
	})
	for name, before := range running03 {
		now, err := dir.Node("lab-gpu-03").Container(faultsNS, name, "c")
		if err != nil {
			t.Errorf("pod %s: %v", name, err)
			continue
		}
		if now.ID != before.ID || now.PID != before.PID || !supervisor.ProcessAlive(now.PID) {
			t.Errorf("pod %s: container %s (pid %d) became %s (pid %d, alive %v) across the kubelet's restart; want it kept running",
				name, before.ID, before.PID, now.ID, now.PID, supervisor.ProcessAlive(now.PID))
		}
	}
	// No pod may fail: checkSettled accepts Running (with the record in
	// its containers) and Pending (with a reason) only. A pod bound
	// without a record fails the test in record().
	running, pending, _ := checkSettled(t, faultsNS, nil)
	checkInvariant(t)
	lost := 0
	for name, old := range kept {
		p, err := client.CoreV1().Pods(faultsNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s present before the faults: %v", name, err)
			lost++
			continue
		}
		if p.Spec.NodeName != old.Spec.NodeName || p.Annotations[api.AnnotationAllocation] != old.Annotations[api.AnnotationAllocation] {
			t.Errorf("pod %s: allocation changed across the faults: %s %s -> %s %s", name, old.Spec.NodeName, old.Annotations[api.AnnotationAllocation], p.Spec.NodeName, p.Annotations[api.AnnotationAllocation])
			lost++
		}
	}
	ph := checkPhysical(t)
	t.Logf("after killing %s while %d pods arrived: %d pods running, %d pending, 0 rejected by the kubelet; %d of %d earlier pods kept their allocation; %d running containers checked against NVML's GPUs",
		strings.Join(victims, ", "), n, running, pending, len(kept)-lost, len(kept), ph.Containers)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
