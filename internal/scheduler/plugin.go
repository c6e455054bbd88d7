// Package scheduler is Tessera's kube-scheduler framework plugin: a thin
// adapter from Pods and Nodes to the placement core. PreFilter turns the
// pod into a compiled placement request, Filter asks the core per node,
// Score applies the node policy, Reserve/Unreserve charge and release the
// core's state, and Bind binds the pod with its allocation record in the
// Binding (or PreBind writes the record first, where another plugin binds).
//
// One file per concern: plugin.go builds the plugin and feeds it informer
// events; extensionpoints.go is the scheduling cycle; state.go the placement
// core fed from Node inventories and Pod records; record.go writes the
// record; metrics.go publishes the state; nominated.go keeps the nodes
// kube-scheduler adds pods to and removes pods from within a cycle
// (PreFilterExtensions) and charges nominated pods; preemption.go is the
// profile's preemption plugin, TesseraPreemption, and preemptclaims.go its
// victims for pods with ResourceClaims. What a node that does not
// fit says comes from the placement core's table (placement.ReasonKind.Text).
// The profile's NodeResourcesFit is package resourcesfit.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Name is the plugin's name in KubeSchedulerConfiguration.
const Name = "Tessera"

const stateKey fwk.StateKey = Name

// Plugin implements the framework extension points.
type Plugin struct {
	names  api.ResourceNames
	policy placement.Policy
	st     *state
	client kubernetes.Interface
	handle fwk.Handle
	// activate requeues pods this plugin found unschedulable once shares
	// are released (nil in unit tests).
	activate func(logger klog.Logger, pods map[string]*corev1.Pod)

	synced   atomic.Bool
	syncFns  []cache.InformerSynced
	waitMu   sync.Mutex
	waiting  map[string]*corev1.Pod
	scratchs sync.Pool
	// memo keeps each node's verdict and score per pod shape between
	// pods (candidates.go).
	memo *placement.Memo
	// dra is the placement core's model of Tessera's DRA GPUs
	// (dramodel.go).
	dra *draModel

	bindOnce  sync.Once
	bindsSelf bool // set once by recordInBinding

	// observed holds the UIDs of the unbound pods the policy has observed
	// (placement.Observer), so that a pod retried after it fit nowhere is
	// learned once: the workload a policy learns is the pods that arrive,
	// not the scheduling attempts. Entries go when the pod is bound or
	// deleted.
	obsMu    sync.Mutex
	observed map[types.UID]struct{}
	// widened holds the UIDs of the unbound pods whose candidates
	// (candidates.go) all failed a Filter: their next attempts look at
	// every node. Entries go when the pod is bound or deleted.
	widened map[types.UID]struct{}
	// trust signs the records the plugin writes and vouches for those it
	// reads back (trust.go).
	trust *trust

	// nom indexes the nodes pods are nominated to (nominated.go).
	nomMu sync.Mutex
	nom   nominations
	// plans are what preemption (preemption.go) chose for a pod: on the
	// node it nominated (plans), and per node during its dry run
	// (trials). A plan's record keeps the room its victims free for the
	// pod (putNominated). Entries go when the pod is bound or deleted.
	planMu sync.Mutex
	plans  map[types.UID]*preemptionPlan
	trials map[types.UID]map[string]*preemptionPlan
}

var (
	_ fwk.PreFilterPlugin     = (*Plugin)(nil)
	_ fwk.PreFilterExtensions = (*Plugin)(nil)
	_ fwk.FilterPlugin        = (*Plugin)(nil)
	_ fwk.PostFilterPlugin    = (*Plugin)(nil)
	_ fwk.PreScorePlugin      = (*Plugin)(nil)
	_ fwk.ScorePlugin         = (*Plugin)(nil)
	_ fwk.ReservePlugin       = (*Plugin)(nil)
	_ fwk.PreBindPlugin       = (*Plugin)(nil)
	_ fwk.BindPlugin          = (*Plugin)(nil)
)

// New is the plugin factory for app.WithPlugin, running the shipped
// placement policies (policies.All). Its arguments are a TesseraArgs
// (internal/scheduler/config; resourcePrefix, nodePolicy, gpuPolicy,
// placementPolicy, all optional), decoded strictly: an unknown key or
// value is an error that names it.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	return newWithPolicies(ctx, obj, h, policies.All())
}

// newWithPolicies is New running the placement policies of cat.
func newWithPolicies(ctx context.Context, obj runtime.Object, h fwk.Handle, cat policies.Catalogue) (fwk.Plugin, error) {
	args, err := decodeArgs(obj, cat.Names())
	if err != nil {
		return nil, err
	}
	cfg := args.ClusterConfig()
	p, err := newPlugin(cfg, cat)
	if err != nil {
		return nil, err
	}
	registerMetrics()
	p.client = h.ClientSet()
	p.handle = h
	p.activate = h.Activate
	logger := klog.FromContext(ctx).WithName(Name)
	p.trust.recorder = h.EventRecorder()
	if rs := cfg.RecordSigning; !rs.Disabled {
		store := recordsig.Store{Namespace: rs.Namespace, Secret: rs.KeySecret, PublicKeys: rs.PublicKeys}
		if p.trust.signer, p.trust.keys, err = store.LoadOrCreate(ctx, p.client); err != nil {
			return nil, fmt.Errorf("%s plugin: the key allocation records are signed with: %w", Name, err)
		}
		logger.Info("Signing GPU allocation records", "key", p.trust.signer.ID(), "keys", p.trust.keys.IDs())
	} else {
		logger.Info("GPU allocation records are NOT signed (recordSigning.disabled): node agents must accept unsigned records")
	}
	nodeReg, err := h.SharedInformerFactory().Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onNode(logger, obj) },
		UpdateFunc: func(_, obj any) { p.onNode(logger, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				p.st.removeNode(n.Name)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching nodes: %w", err)
	}
	podReg, err := h.SharedInformerFactory().Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onPod(logger, obj) },
		UpdateFunc: func(_, obj any) { p.onPod(logger, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				if pod, ok := t.Obj.(*corev1.Pod); ok {
					p.forget(pod.UID)
				}
			} else if pod, ok := obj.(*corev1.Pod); ok {
				p.forget(pod.UID)
			}
			if p.st.deletePod(obj) {
				p.requeue(logger)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching pods: %w", err)
	}
	// Tessera's DRA GPUs (dramodel.go), with DynamicResourceAllocation
	// on, as kube-scheduler's DynamicResources. Only the narrowing of
	// claims waits for the slices (draReady), never the device-plugin
	// pods.
	if utilfeature.DefaultFeatureGate.Enabled(features.DynamicResourceAllocation) {
		sliceReg, err := h.SharedInformerFactory().Resource().V1().ResourceSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { p.onSlice(logger, obj) },
			UpdateFunc: func(_, obj any) { p.onSlice(logger, obj) },
			DeleteFunc: func(obj any) {
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					p.dra.onSlice(logger, t.Key, nil) // cluster-scoped: the key is the name
				} else if s, ok := obj.(*resourceapi.ResourceSlice); ok {
					p.dra.onSlice(logger, s.Name, nil)
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("watching ResourceSlices: %w", err)
		}
		p.dra.synced = sliceReg.HasSynced
	}
	p.syncFns = []cache.InformerSynced{nodeReg.HasSynced, podReg.HasSynced}
	logger.Info("Tessera plugin ready", "resourcePrefix", cfg.ResourcePrefix, "policy", p.policy.Name(), "gpuPolicy", cfg.GPUPolicy)
	return p, nil
}

// newPlugin builds a plugin running a policy of cat, without informers
// (unit tests feed it directly).
func newPlugin(cfg api.ClusterConfig, cat policies.Catalogue) (*Plugin, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
	}
	names, err := api.NewResourceNames(cfg.ResourcePrefix)
	if err != nil {
		return nil, err
	}
	st := newState(gpuGauges{})
	st.cluster.DefaultGPUPolicy = cfg.GPUPolicy
	pol, err := cat.New(cfg.PlacementPolicy, st.cluster, 1)
	if err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
	}
	p := &Plugin{names: names, policy: pol, st: st, waiting: map[string]*corev1.Pod{}, observed: map[types.UID]struct{}{}, widened: map[types.UID]struct{}{}, trust: &trust{names: names}}
	st.trust = p.trust
	p.scratchs.New = func() any { return new(scratch) }
	p.memo = placement.NewMemo()
	p.dra = newDRAModel(cfg.GPUPolicy)
	return p, nil
}

type scratch struct {
	s placement.Scratch
	p placement.Placement
}

func (p *Plugin) Name() string { return Name }

func (p *Plugin) onNode(logger klog.Logger, obj any) {
	if n, ok := obj.(*corev1.Node); ok && p.st.upsertNode(logger, n) {
		p.requeue(logger)
	}
}

func (p *Plugin) onSlice(logger klog.Logger, obj any) {
	if s, ok := obj.(*resourceapi.ResourceSlice); ok {
		p.dra.onSlice(logger, s.Name, s)
	}
}

func (p *Plugin) onPod(logger klog.Logger, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if pod.Spec.NodeName != "" {
		p.forget(pod.UID)
	} else {
		p.observeNomination(pod)
	}
	if p.st.observePod(logger, pod) {
		p.requeue(logger)
	}
}

// firstAttempt reports whether the pod has not been observed yet, and
// notes it as observed.
func (p *Plugin) firstAttempt(uid types.UID) bool {
	p.obsMu.Lock()
	defer p.obsMu.Unlock()
	if _, seen := p.observed[uid]; seen {
		return false
	}
	p.observed[uid] = struct{}{}
	return true
}

// forget drops a bound or deleted pod from the observed set, and its
// nomination and preemption plans.
func (p *Plugin) forget(uid types.UID) {
	p.obsMu.Lock()
	delete(p.observed, uid)
	delete(p.widened, uid)
	p.obsMu.Unlock()
	p.nominate(uid, "")
	p.dropPlans(uid)
}

// requeue moves the GPU pods this plugin last found unschedulable back to
// the active queue: kube-scheduler requeues them on cluster events itself,
// but may do so before this plugin's handler has released the shares.
func (p *Plugin) requeue(logger klog.Logger) {
	p.waitMu.Lock()
	pods := p.waiting
	p.waiting = map[string]*corev1.Pod{}
	p.waitMu.Unlock()
	if len(pods) > 0 && p.activate != nil {
		p.activate(logger, pods)
	}
}

// waitSynced blocks until the informers have delivered every existing
// Node and Pod to the plugin, so that a restarted scheduler has rebuilt
// its state from the allocation records before it places anything.
func (p *Plugin) waitSynced(ctx context.Context) error {
	if p.synced.Load() || len(p.syncFns) == 0 {
		return nil
	}
	if !cache.WaitForCacheSync(ctx.Done(), p.syncFns...) {
		return errors.New("GPU state not yet rebuilt from node inventories and pod records")
	}
	p.synced.Store(true)
	return nil
}
