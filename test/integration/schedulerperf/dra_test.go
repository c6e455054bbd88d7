//go:build integration

package schedulerperf

// The DRA test cases (performance-config.yaml, DRA*): nodes in mode dra
// whose ResourceSlices are built by the driver's own code, the
// DeviceClasses and admission policy of deploy/dra, and a check after
// every workload that the claims the scheduler allocated fit the GPUs.

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	k8sscheduler "k8s.io/kubernetes/pkg/scheduler"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
	"k8s.io/kubernetes/test/utils/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draOptions are the scheduler_perf hooks: those of the DRA test cases
// (the other test cases have no node in mode dra and no claim, for which
// they do nothing) and, through prepare (preempt_test.go), the check of
// the allocation records after every workload.
func draOptions() []perf.SchedulerPerfOption {
	return []perf.SchedulerPerfOption{
		perf.WithPrepareFn(prepare),
		perf.WithNodeUpdateFn(publishSlices),
	}
}

// prepareDRA arranges for the allocations to be checked after the
// workload, and for the workload's report (report_test.go): where its
// time went, and the API writes per bound pod (apiwrites_test.go).
func prepareDRA(tCtx ktesting.TContext) error {
	w := startWorkload()
	writes := startCounting(tCtx)
	// Runs after the workload, before the API server stops.
	tCtx.CleanupCtx(func(tCtx ktesting.TContext) {
		w.finished()
		if line := writes.stop(); line != "" {
			tCtx.Log(line)
		}
		summary, err := checkAllocations(tCtx)
		if err != nil {
			tCtx.Error(err)
			return
		}
		if summary != "" {
			tCtx.Log(summary)
		}
		tCtx.Log(w.timing())
	})
	return nil
}

// draSystem is what the driver reads from NVML for the slice beyond the
// inventory: an A100's architecture and brand, the driver's versions.
var draSystem = dra.System{DriverVersion: "550.54.15", CUDAVersion: 12040}

// nodeSlice is the ResourceSlice the node agent publishes for a node in
// mode dra: the devices from dra.Devices (the driver's code) for the
// node's inventory, in one pool named after the node, owned by the Node,
// as the kubelet plugin's ResourceSlice controller writes it. Nil for a
// node in another mode.
func nodeSlice(node *corev1.Node) (*resourceapi.ResourceSlice, error) {
	inv, err := kubeobj.Inventory(node)
	if err != nil || inv == nil || inv.Mode != api.ModeDRA {
		return nil, err
	}
	gpus := make([]dra.GPU, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		gpus = append(gpus, dra.GPU{GPU: g, Architecture: dra.Architecture(nvml.DEVICE_ARCH_AMPERE), Brand: dra.Brand(nvml.BRAND_NVIDIA)})
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: node.Name + "-" + api.DRADriverName + "-",
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptr.To(true),
			}},
		},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   api.DRADriverName,
			Pool:     resourceapi.ResourcePool{Name: node.Name, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node.Name),
			Devices:  dra.Devices(gpus, draSystem),
		},
	}, nil
}

// nodeParams are the workload parameters that have the node hook make
// that many nodes of a template (createNodesAtOnce).
var nodeParams = []struct{ param, template string }{
	{"draNodes", "templates/gpu-dra-node.yaml"},
	{"gpuNodes", "templates/gpu-node.yaml"},
}

// createNodesAtOnce makes the nodes the workload's nodeParams ask (none
// if it has none of them) from 30 clients at once, as scheduler_perf's
// createNodes would make them one at a time (named after the template's
// generateName, labelled kubernetes.io/hostname), one create request
// after the other, each waiting for the API server, before anything is
// measured.
func createNodesAtOnce(tCtx ktesting.TContext, w *perf.Workload) ([]corev1.Node, error) {
	if w == nil {
		return nil, nil
	}
	var out []corev1.Node
	for _, np := range nodeParams {
		count, err := w.GetParam(np.param)
		if err != nil || count == 0 {
			continue // no such parameter
		}
		made, err := createNodesOf(tCtx, np.template, count)
		if err != nil {
			return nil, err
		}
		out = append(out, made...)
	}
	return out, nil
}

// createNodesOf makes count nodes of the template from 30 clients.
func createNodesOf(tCtx ktesting.TContext, path string, count int) ([]corev1.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var template corev1.Node
	if err := yaml.UnmarshalStrict(data, &template); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	made := make([]corev1.Node, count)
	err = inParallel(tCtx, count, func(i int) error {
		n := template.DeepCopy()
		n.Name = fmt.Sprintf("%s%05d", template.GenerateName, i)
		n.GenerateName = ""
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[corev1.LabelHostname] = n.Name
		created, err := tCtx.Client().CoreV1().Nodes().Create(tCtx, n, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		made[i] = *created
		return nil
	})
	if err != nil {
		return nil, err
	}
	return made, nil
}

// inParallel runs f for 0..n-1 from 30 goroutines and returns the first
// error.
func inParallel(tCtx ktesting.TContext, n int, f func(i int) error) error {
	var (
		mu       sync.Mutex
		firstErr error
	)
	workqueue.ParallelizeUntil(tCtx, 30, n, func(i int) {
		if err := f(i); err != nil {
			mu.Lock()
			defer mu.Unlock()
			if firstErr == nil {
				firstErr = err
			}
		}
	})
	return firstErr
}

// publishSlices publishes the ResourceSlice of every node in mode dra
// that has none yet (createNodes ran), then waits until the scheduler's
// DRA manager sees them all, as createResourceDriver does. With the first
// DRA node it applies deploy/dra's DeviceClasses (Tessera's and the
// compatibility ones) and the claims' admission policy: only then, so
// that the class mapping nvidia.com/gpu leaves the device-plugin test
// cases as they were.
func publishSlices(tCtx ktesting.TContext, sched *k8sscheduler.Scheduler, w *perf.Workload, nodes *corev1.NodeList) error {
	current.nodesOpDone()
	made, err := createNodesAtOnce(tCtx, w)
	if err != nil {
		return err
	}
	nodes.Items = append(nodes.Items, made...)
	current.nodesCreated(len(nodes.Items))
	defer current.nodesReady()
	existing, err := tCtx.Client().ResourceV1().ResourceSlices().List(tCtx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, s := range existing.Items {
		if s.Spec.NodeName != nil && s.Spec.Driver == api.DRADriverName {
			have[*s.Spec.NodeName] = true
		}
	}
	var slices []*resourceapi.ResourceSlice
	for i := range nodes.Items {
		s, err := nodeSlice(&nodes.Items[i])
		if err != nil {
			return err
		}
		if s != nil && !have[nodes.Items[i].Name] {
			slices = append(slices, s)
		}
	}
	if len(slices) == 0 {
		return nil
	}
	if err := dra.ApplyManifests(tCtx, tCtx.Client(), deploy.DRADeviceClasses, deploy.DRACompatDeviceClasses, deploy.DRAAdmission); err != nil {
		return err
	}
	err = inParallel(tCtx, len(slices), func(i int) error {
		if _, err := tCtx.Client().ResourceV1().ResourceSlices().Create(tCtx, slices[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node %s: creating its ResourceSlice: %w", *slices[i].Spec.NodeName, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	want := len(slices) + len(have)
	fw, ok := sched.Profiles[api.SchedulerName]
	if !ok || fw.SharedDRAManager() == nil {
		return fmt.Errorf("the scheduler has no %s profile with a DRA manager (feature gate DynamicResourceAllocation?)", api.SchedulerName)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		seen, err := fw.SharedDRAManager().ResourceSlices().ListWithDeviceTaintRules()
		if err != nil {
			return err
		}
		if len(seen) >= want {
			tCtx.Logf("published %d ResourceSlices of driver %s (%d devices each)", len(slices), api.DRADriverName, len(slices[0].Spec.Devices))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the scheduler sees %d ResourceSlices after a minute, want %d", len(seen), want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkAllocations checks the claims the workload's scheduler allocated
// on Tessera's devices: every claim is allocated and reserved for a pod
// bound to the node of its device; on every GPU the capacity the claims
// consumed (memory, cores, shares) stays within the GPU's; a GPU given
// whole (no share ID) is given to one claim only. It returns a summary of
// how the claims were spread ("" when the workload made no claim).
func checkAllocations(tCtx ktesting.TContext) (string, error) {
	slices, err := tCtx.Client().ResourceV1().ResourceSlices().List(tCtx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	type deviceID struct{ pool, device string }
	capacity := map[deviceID]map[resourceapi.QualifiedName]resource.Quantity{}
	for _, s := range slices.Items {
		if s.Spec.Driver != api.DRADriverName {
			continue
		}
		for _, d := range s.Spec.Devices {
			c := map[resourceapi.QualifiedName]resource.Quantity{}
			for name, dc := range d.Capacity {
				c[name] = dc.Value
			}
			capacity[deviceID{s.Spec.Pool.Name, d.Name}] = c
		}
	}
	claims, err := tCtx.Client().ResourceV1().ResourceClaims("").List(tCtx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	if len(claims.Items) == 0 {
		return "", nil
	}
	pods, err := tCtx.Client().CoreV1().Pods("").List(tCtx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	podNode := map[string]string{}
	for _, p := range pods.Items {
		podNode[string(p.UID)] = p.Spec.NodeName
	}

	var problems []string
	consumed := map[deviceID]map[resourceapi.QualifiedName]resource.Quantity{}
	claimsOn := map[deviceID]int{}
	whole := map[deviceID]int{}
	// What the shared claims consume in all and one GPU's capacity (the
	// nodes' GPUs are alike), for the fewest GPUs that could hold them.
	sharedTotal := map[resourceapi.QualifiedName]*resource.Quantity{}
	perGPU := map[resourceapi.QualifiedName]resource.Quantity{}
	wholeClaims := 0
	for _, c := range claims.Items {
		name := c.Namespace + "/" + c.Name
		if c.Status.Allocation == nil {
			problems = append(problems, fmt.Sprintf("claim %s is not allocated", name))
			continue
		}
		if len(c.Status.ReservedFor) == 0 {
			problems = append(problems, fmt.Sprintf("claim %s is reserved for no pod", name))
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != api.DRADriverName {
				continue
			}
			id := deviceID{r.Pool, r.Device}
			if _, ok := capacity[id]; !ok {
				problems = append(problems, fmt.Sprintf("claim %s: device %s/%s is in no ResourceSlice", name, r.Pool, r.Device))
				continue
			}
			for _, ref := range c.Status.ReservedFor {
				if n := podNode[string(ref.UID)]; n != r.Pool {
					problems = append(problems, fmt.Sprintf("claim %s: device %s/%s, but pod %s is bound to node %q", name, r.Pool, r.Device, ref.Name, n))
				}
			}
			claimsOn[id]++
			if r.ShareID == nil {
				whole[id]++
				wholeClaims++
			} else {
				for cn, q := range r.ConsumedCapacity {
					if sharedTotal[cn] == nil {
						sharedTotal[cn] = resource.NewQuantity(0, q.Format)
					}
					sharedTotal[cn].Add(q)
					perGPU[cn] = capacity[id][cn]
				}
			}
			if consumed[id] == nil {
				consumed[id] = map[resourceapi.QualifiedName]resource.Quantity{}
			}
			for cn, q := range r.ConsumedCapacity {
				sum := consumed[id][cn]
				sum.Add(q)
				consumed[id][cn] = sum
			}
		}
	}
	most := 0
	for id, n := range claimsOn {
		most = max(most, n)
		if whole[id] > 0 && n > 1 {
			problems = append(problems, fmt.Sprintf("GPU %s/%s is allocated whole and to %d claims", id.pool, id.device, n))
		}
		for cn, q := range consumed[id] {
			if limit, ok := capacity[id][cn]; !ok {
				problems = append(problems, fmt.Sprintf("GPU %s/%s: claims consumed %s of %s, which it does not have", id.pool, id.device, q.String(), cn))
			} else if q.Cmp(limit) > 0 {
				problems = append(problems, fmt.Sprintf("GPU %s/%s: claims consumed %s of %s, more than its %s", id.pool, id.device, q.String(), cn, limit.String()))
			}
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 20 {
			problems = append(problems[:20], fmt.Sprintf("(and %d more)", len(problems)-20))
		}
		return "", fmt.Errorf("the scheduler's DRA allocations do not fit the GPUs:\n%s", strings.Join(problems, "\n"))
	}
	nodes := map[string]bool{}
	for id := range claimsOn {
		nodes[id.pool] = true
	}
	fewest := wholeClaims + fewestGPUs(sharedTotal, perGPU)
	return fmt.Sprintf("%d claims allocated on %d GPUs of %d nodes, at most %d claims on one GPU, none beyond its capacity; packing: %d GPUs used, at least %d needed (%+.1f %%)",
		len(claims.Items), len(claimsOn), len(nodes), most, len(claimsOn), fewest, 100*float64(len(claimsOn)-fewest)/float64(max(fewest, 1))), nil
}

// fewestGPUs is a lower bound on the GPUs of capacity perGPU that hold
// total: for each capacity, the total over one GPU's, rounded up; the
// largest of these.
func fewestGPUs(total map[resourceapi.QualifiedName]*resource.Quantity, perGPU map[resourceapi.QualifiedName]resource.Quantity) int {
	n := 0
	for cn, q := range total {
		c := perGPU[cn]
		if c.IsZero() || q.IsZero() {
			continue
		}
		qm, cm := q.MilliValue(), c.MilliValue()
		n = max(n, int((qm+cm-1)/cm))
	}
	return n
}
