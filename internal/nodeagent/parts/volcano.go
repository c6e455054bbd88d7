package parts

// The volcano part: on a node whose profile says mode volcano, the node
// side of Volcano's vGPU protocol (docs/volcano.md). Volcano's scheduler
// places the pods; this part tells it the node's GPUs and checks what it
// granted before the device plugin of volcano.sh/vgpu-number (the Plugins
// part, with this part as its deviceplugin.Protocol) answers the kubelet
// with the limiter, from the same ledger and checks as Tessera's records.
//
// What it keeps on the Node while the mode is volcano:
//   - the registration annotation volcano.sh/node-vgpu-register, one entry
//     per offered GPU (split count = sharesPerGPU, NVML's memory, health);
//   - the handshake volcano.sh/node-vgpu-handshake, refreshed on a timer
//     (Volcano up to v1.15.0 drops a node whose device plugin does not
//     answer its "Requesting" within 60 s);
//   - volcano.sh/vgpu-memory (MiB) and volcano.sh/vgpu-cores (percent) as
//     the node's capacity, in its status: the kubelet admits pods against
//     them without a device list (HAMi's per-MiB devices outgrow the
//     kubelet's 4 MiB message on large GPUs), and Volcano's queue
//     accounting sees the node's real totals.
//
// When the node leaves mode volcano all three are removed.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/recordcheck"
	"github.com/tessera-gpu/tessera/internal/volcano"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// VolcanoOptions are what the volcano part needs.
type VolcanoOptions struct {
	NodeName string
	Client   kubernetes.Interface
	// State are the containers' state directories: which containers of a
	// pod were served (for the pod's bind phase, and the MIG instances
	// pods hold).
	State statedir.Dirs
	// Devices are the node's GPUs: their MIG geometry, in Volcano's mig
	// mode.
	Devices *Devices
	// DeviceConfig is Volcano's device configuration ConfigMap
	// (default: api.VolcanoDeviceConfigNamespace/Name), read in mig
	// mode for the MIG geometries Volcano's scheduler chooses from.
	DeviceConfig types.NamespacedName
	// Handshake is how often the handshake annotation is refreshed
	// (default 20s; Volcano's deadline is 60s).
	Handshake time.Duration
	Logger    klog.Logger
}

// Volcano is the volcano part.
type Volcano struct {
	opts VolcanoOptions
	wg   sync.WaitGroup

	mu       sync.Mutex
	nodes    corelisters.NodeLister
	pods     corelisters.PodLister
	recorder record.EventRecorder
	active   bool            // the node's mode is volcano
	migGPUs  map[string]bool // the GPUs registered in mode mig
	problem  string          // the last registration problem reported
	cfgCache deviceConfigCache
	gpus     map[string]migGPU // fixed at construction
}

// NewVolcano returns the volcano part.
func NewVolcano(opts VolcanoOptions) *Volcano {
	if opts.Handshake <= 0 {
		opts.Handshake = 20 * time.Second
	}
	if opts.DeviceConfig.Name == "" {
		opts.DeviceConfig = types.NamespacedName{Namespace: api.VolcanoDeviceConfigNamespace, Name: api.VolcanoDeviceConfigName}
	}
	return &Volcano{opts: opts, gpus: migGPUsOf(opts.Devices)}
}

// Start implements Part: the handshake timer.
func (v *Volcano) Start(ctx context.Context, c Cluster) error {
	v.mu.Lock()
	v.nodes, v.pods, v.recorder = c.Nodes, c.Pods, c.Recorder
	v.mu.Unlock()
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		t := time.NewTicker(v.opts.Handshake)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				v.handshake(ctx)
			}
		}
	}()
	return nil
}

// Stop implements Part.
func (v *Volcano) Stop() { v.wg.Wait() }

// Reconcile implements Part: the registration and the capacities follow
// the offer of volcano.sh/vgpu-number (its GPUs, their health and slots).
func (v *Volcano) Reconcile(ctx context.Context, n *Node) {
	v.mu.Lock()
	was := v.active
	v.active = n.Config.Mode == api.ModeVolcano
	active := v.active
	v.mu.Unlock()
	switch {
	case active:
		v.publish(ctx, n)
	case was || n.Configured:
		v.withdraw(ctx)
	}
}

// Registration is what the node registers with Volcano for an offer: each
// GPU of volcano.sh/vgpu-number, and the healthy GPUs' total memory and
// cores. A GPU the inventory shows in dynamic MIG (MIG mode on, its
// geometry known) is registered in Volcano's mig mode, the others in
// hami-core mode.
func Registration(n *Node) (gpus []volcano.RegisteredGPU, memoryMiB, cores int64) {
	models, modes := map[string]string{}, map[string]string{}
	if n.Inventory != nil {
		for _, g := range n.Inventory.GPUs {
			models[g.UUID] = g.Model
			modes[g.UUID] = api.VolcanoModeHAMiCore
			if g.Sharing == api.SharingMIGDynamic {
				modes[g.UUID] = api.VolcanoModeMIG
			}
		}
	}
	for _, g := range n.Offer[api.VolcanoVGPUNumber] {
		mode := modes[g.UUID]
		if mode == "" {
			mode = api.VolcanoModeHAMiCore
		}
		gpus = append(gpus, volcano.RegisteredGPU{
			UUID: g.UUID, Split: g.Slots, MemoryMiB: g.MemoryMiB, Model: models[g.UUID],
			Healthy: g.Healthy, Mode: mode,
		})
		if g.Healthy {
			memoryMiB += g.MemoryMiB
			cores += api.MaxCores
		}
	}
	return gpus, memoryMiB, cores
}

func (v *Volcano) node() *v1.Node {
	v.mu.Lock()
	l := v.nodes
	v.mu.Unlock()
	if l == nil {
		return nil
	}
	n, err := l.Get(v.opts.NodeName)
	if err != nil {
		return nil
	}
	return n
}

func (v *Volcano) publish(ctx context.Context, n *Node) {
	gpus, mem, cores := Registration(n)
	mig := map[string]bool{}
	for _, g := range gpus {
		if g.Mode == api.VolcanoModeMIG {
			mig[g.UUID] = true
		}
	}
	v.mu.Lock()
	v.migGPUs = mig
	v.mu.Unlock()
	v.checkGeometries(ctx, gpus)
	reg := volcano.EncodeRegister(gpus)
	node := v.node()
	if node == nil || node.Annotations[api.AnnotationVolcanoRegister] != reg {
		ann := map[string]any{api.AnnotationVolcanoRegister: reg}
		if node == nil || node.Annotations[api.AnnotationVolcanoHandshake] == "" {
			ann[api.AnnotationVolcanoHandshake] = reported()
		}
		if err := v.patch(ctx, map[string]any{"metadata": map[string]any{"annotations": ann}}, ""); err != nil {
			v.opts.Logger.Error(err, "Registering the GPUs with Volcano failed; will retry", "annotation", api.AnnotationVolcanoRegister)
		} else {
			v.opts.Logger.Info("GPUs registered with Volcano", "gpus", len(gpus), "annotation", api.AnnotationVolcanoRegister)
		}
	}
	if node == nil || !hasCapacity(node, api.VolcanoVGPUMemory, mem) || !hasCapacity(node, api.VolcanoVGPUCores, cores) {
		q := map[string]any{
			api.VolcanoVGPUMemory: resource.NewQuantity(mem, resource.DecimalSI).String(),
			api.VolcanoVGPUCores:  resource.NewQuantity(cores, resource.DecimalSI).String(),
		}
		if err := v.patch(ctx, map[string]any{"status": map[string]any{"capacity": q, "allocatable": q}}, "status"); err != nil {
			v.opts.Logger.Error(err, "Advertising the node's vGPU memory and cores failed; will retry")
		} else {
			v.opts.Logger.Info("vGPU memory and cores advertised", api.VolcanoVGPUMemory, mem, api.VolcanoVGPUCores, cores)
		}
	}
}

// hasCapacity reports whether the node's capacity and allocatable of res
// are want.
func hasCapacity(n *v1.Node, res string, want int64) bool {
	c, ok1 := n.Status.Capacity[v1.ResourceName(res)]
	a, ok2 := n.Status.Allocatable[v1.ResourceName(res)]
	return ok1 && ok2 && c.Value() == want && a.Value() == want
}

// withdraw removes the registration, the handshake and the capacities
// (the node no longer serves Volcano).
func (v *Volcano) withdraw(ctx context.Context) {
	node := v.node()
	if node == nil {
		return
	}
	_, reg := node.Annotations[api.AnnotationVolcanoRegister]
	_, hs := node.Annotations[api.AnnotationVolcanoHandshake]
	if reg || hs {
		ann := map[string]any{api.AnnotationVolcanoRegister: nil, api.AnnotationVolcanoHandshake: nil}
		if err := v.patch(ctx, map[string]any{"metadata": map[string]any{"annotations": ann}}, ""); err != nil {
			v.opts.Logger.Error(err, "Withdrawing the Volcano registration failed; will retry")
		} else {
			v.opts.Logger.Info("Volcano registration withdrawn: the node's mode is no longer volcano")
		}
	}
	_, m := node.Status.Capacity[api.VolcanoVGPUMemory]
	_, c := node.Status.Capacity[api.VolcanoVGPUCores]
	if m || c {
		q := map[string]any{api.VolcanoVGPUMemory: nil, api.VolcanoVGPUCores: nil}
		if err := v.patch(ctx, map[string]any{"status": map[string]any{"capacity": q, "allocatable": q}}, "status"); err != nil {
			v.opts.Logger.Error(err, "Withdrawing the vGPU memory and cores failed; will retry")
		}
	}
}

// handshake answers Volcano's "Requesting" (or a "Deleted" left while the
// agent was away) with "Reported", on a timer: answering every change at
// once would race Volcano's scheduler, which writes "Requesting" each time
// it reads the Node.
func (v *Volcano) handshake(ctx context.Context) {
	v.mu.Lock()
	active := v.active
	v.mu.Unlock()
	if !active {
		return
	}
	ann := map[string]any{api.AnnotationVolcanoHandshake: reported()}
	if err := v.patch(ctx, map[string]any{"metadata": map[string]any{"annotations": ann}}, ""); err != nil {
		v.opts.Logger.Error(err, "Refreshing the Volcano handshake failed; will retry", "annotation", api.AnnotationVolcanoHandshake)
	}
}

// reported is the handshake value of a device plugin that is alive.
func reported() string { return "Reported_" + time.Now().Format("2006.01.02 15:04:05") }

func (v *Volcano) patch(ctx context.Context, body map[string]any, sub string) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	var subs []string
	if sub != "" {
		subs = []string{sub}
	}
	_, err = v.opts.Client.CoreV1().Nodes().Patch(ctx, v.opts.NodeName, types.MergePatchType, b, metav1.PatchOptions{}, subs...)
	return err
}

// Record implements deviceplugin.Protocol: the pod's grants from
// Volcano's annotations; a MIG position becomes a grant of the instance
// it names (empty when it names none: Check says why).
func (v *Volcano) Record(pod *v1.Pod) (*api.PodAllocation, error) {
	return volcano.Record(pod, func(d volcano.Device) api.MIGGrant {
		in, _, _, err := v.instance(context.Background(), d)
		if err != nil {
			return api.MIGGrant{}
		}
		return api.MIGGrant{Profile: in.Profile, Start: in.Start}
	})
}

// Check implements deviceplugin.Protocol: the annotations grant exactly
// what Volcano gives the pod's spec, on GPUs of this node; a MIG
// position names an instance of Volcano's geometries for the GPU with at
// least the memory asked, which no other pod this node serves holds or
// overlaps.
func (v *Volcano) Check(pod *v1.Pod, _ *api.PodAllocation, gpu recordcheck.Lookup) error {
	v.mu.Lock()
	mig := v.migGPUs
	v.mu.Unlock()
	err := volcano.Match(pod, func(uuid string) (volcano.GPUInfo, bool) {
		g, ok := gpu(uuid)
		return volcano.GPUInfo{MemoryMiB: g.MemoryMiB, MIG: mig[uuid]}, ok
	}, func(d volcano.Device) error { return v.checkInstance(pod, d) })
	if err != nil {
		return fmt.Errorf("the Volcano annotations do not match the pod's request: %v", err)
	}
	return nil
}

// Served implements deviceplugin.Protocol: once every vGPU container of
// the pod has been answered, its bind phase is "success" (Volcano then
// leaves the annotations alone).
func (v *Volcano) Served(ctx context.Context, t *deviceplugin.Target) {
	for _, c := range t.Record.Containers {
		if !v.opts.State.Served(t.Pod.UID, c.Name) {
			return
		}
	}
	v.bindPhase(ctx, t.Pod, api.VolcanoBindSuccess)
}

// Refused implements deviceplugin.Protocol: the bind phase is "failed".
func (v *Volcano) Refused(ctx context.Context, pod *v1.Pod, _ string) {
	v.bindPhase(ctx, pod, api.VolcanoBindFailed)
}

func (v *Volcano) bindPhase(ctx context.Context, pod *v1.Pod, phase string) {
	if pod.Annotations[api.AnnotationVolcanoBindPhase] == phase {
		return
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationVolcanoBindPhase: phase}}})
	if err == nil {
		_, err = v.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, b, metav1.PatchOptions{})
	}
	if err != nil {
		v.opts.Logger.Error(err, "Writing the pod's Volcano bind phase failed", "pod", kubeobj.Key(pod), "phase", phase)
	}
}

var _ deviceplugin.Protocol = (*Volcano)(nil)
