package scheduler

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/podrequest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// state is the plugin's view of the cluster: the placement core fed from
// Node inventories and Pod allocation records. The core does no locking:
// fit checks and scoring take mu for reading, everything that changes the
// core (informer events, Reserve, Unreserve) takes it for writing.
type state struct {
	mu      sync.RWMutex
	cluster *placement.Cluster
	// obs learns of every node whose GPU usage changed (the plugin's
	// per-GPU metrics), under mu.
	obs usageObserver
	// inventory is the last allocatable CPU and memory and inventory
	// annotation applied per node, so that other Node updates cost nothing.
	inventory map[string]string
	// holders maps a pod key to the UID of the pod whose allocation the
	// core holds under that key (a pod recreated under the same name is a
	// different pod).
	holders map[string]types.UID
	// slot gives every node seen a stable dense index, so a scheduling
	// cycle can keep per-node results in a flat slice instead of a map.
	slot map[string]int
	// mode holds how each node whose inventory decoded serves its GPUs:
	// api.ModeDRA (the core holds it without GPUs; dra.go) or
	// api.ModeDevicePlugin. A node without a valid inventory has none.
	mode map[string]api.NodeMode
	// trust decides which records read from pods are charged (nil: all
	// that decode).
	trust *trust
	// rejected holds, per bound pod whose record was not charged, the
	// hash of that annotation value (recordHash): the pod's later updates
	// with the same value are not looked at again (no release, requeue,
	// log or count at every status change); a new value is.
	rejected map[types.UID]uint64
	// freedSeq counts the changes that may let a waiting pod fit (a pod
	// released, a node's inventory or allocatable changed) and freedLog
	// remembers the nodes of the last of them (freedSince).
	freedSeq uint64
	freedLog [freedLogSize]freedEntry
}

// freedLogSize is how many changes freedLog remembers.
const freedLogSize = 256

type freedEntry struct {
	seq  uint64
	node string
}

// freedLocked notes a change on the node that may let a waiting pod fit.
// The caller holds mu for writing.
func (s *state) freedLocked(node string) {
	s.freedSeq++
	s.freedLog[s.freedSeq%freedLogSize] = freedEntry{seq: s.freedSeq, node: node}
}

// freedSince returns the nodes changed (freedLocked) after change seq,
// each once; all is true when more changed than freedLog remembers. The
// caller holds mu.
func (s *state) freedSince(seq uint64) (nodes []string, all bool) {
	if s.freedSeq-seq > freedLogSize {
		return nil, true
	}
	for i := seq + 1; i <= s.freedSeq; i++ {
		if n := s.freedLog[i%freedLogSize].node; !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	return nodes, false
}

// usageObserver is told, under the state's lock, of every node whose GPU
// usage may have changed and of every node removed.
type usageObserver interface {
	nodeChanged(n *placement.Node)
	nodeRemoved(n *placement.Node)
}

func newState(obs usageObserver) *state {
	return &state{
		obs:       obs,
		cluster:   placement.NewCluster(),
		inventory: map[string]string{},
		holders:   map[string]types.UID{},
		slot:      map[string]int{},
		mode:      map[string]api.NodeMode{},
		rejected:  map[types.UID]uint64{},
	}
}

// upsertNode applies a Node's inventory annotation. It reports whether the
// core changed. A missing or invalid inventory (kubeobj.Inventory) leaves
// the node without GPUs (logged), so GPU pods never land on GPUs nobody
// described.
func (s *state) upsertNode(logger klog.Logger, node *corev1.Node) bool {
	raw := node.Annotations[api.AnnotationInventory]
	cpu, mem := allocatable(node)
	seen := fmt.Sprintf("%d/%d/%s", cpu, mem, raw)
	s.mu.RLock()
	prev, known := s.inventory[node.Name]
	s.mu.RUnlock()
	if known && prev == seen {
		return false
	}
	inv, err := kubeobj.Inventory(node)
	if err != nil {
		logger.Error(err, "Ignoring the node's GPU inventory", "node", klog.KObj(node))
	}
	dra := inv != nil && inv.Mode == api.ModeDRA
	if dra {
		inv = nil
	}
	n, err := placement.NewNode(node.Name, cpu, mem, inv)
	if err != nil {
		logger.Error(err, "Ignoring the node's GPU inventory", "node", klog.KObj(node))
		if n, err = placement.NewNode(node.Name, cpu, mem, nil); err != nil {
			return false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inventory[node.Name] = seen
	switch {
	case dra:
		s.mode[node.Name] = api.ModeDRA
	case inv != nil:
		s.mode[node.Name] = api.ModeDevicePlugin
	default:
		delete(s.mode, node.Name)
	}
	if _, ok := s.slot[node.Name]; !ok {
		s.slot[node.Name] = len(s.slot)
	}
	s.cluster.UpsertNode(n)
	s.publishLocked(node.Name)
	s.freedLocked(node.Name)
	return true
}

// allocatable is the node's allocatable CPU (millicores) and memory
// (MiB, rounded down), what NodeResourcesFit places pods against, so that
// the policy weighs the CPU and memory a node has left as the simulator
// does. A node that states neither (none the kubelet registers) limits
// nothing (placement.Unlimited).
func allocatable(node *corev1.Node) (cpuMilli, memMiB int64) {
	cpuMilli, memMiB = placement.Unlimited, placement.Unlimited
	if q, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		cpuMilli = q.MilliValue()
	}
	if q, ok := node.Status.Allocatable[corev1.ResourceMemory]; ok {
		memMiB = q.Value() >> 20
	}
	return cpuMilli, memMiB
}

func (s *state) removeNode(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.cluster.Node(name); n != nil {
		s.obs.nodeRemoved(n)
	}
	delete(s.inventory, name)
	delete(s.mode, name)
	s.cluster.RemoveNode(name)
}

// observePod charges or releases a pod seen by the informer. Bound pods
// with a record for their node are charged (after a restart this rebuilds
// the state before the first pod is scheduled); terminated pods release.
// Pods the plugin reserved itself are already charged. It reports whether
// something was released.
// onDRANode reports whether pod holds its GPUs through ResourceClaims:
// the extended-resource claim the scheduler made for it (set before the
// pod is bound, so it holds whatever order the informers deliver Nodes
// and Pods in), or a node in mode dra. A node known to serve its GPUs
// through the device plugin (its inventory says so) overrides the pod's
// status: no claim serves GPUs there, and a status is no licence to hold
// them without a record.
func (s *state) onDRANode(pod *corev1.Pod) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mode[pod.Spec.NodeName] == api.ModeDevicePlugin {
		return false
	}
	return pod.Status.ExtendedResourceClaimStatus != nil || s.isDRA(pod.Spec.NodeName)
}

func (s *state) observePod(logger klog.Logger, pod *corev1.Pod) bool {
	key := kubeobj.Key(pod)
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		s.forgetRejected(pod.UID)
		return s.release(key, pod.UID)
	}
	if pod.Spec.NodeName == "" {
		// Unbound pods with a record were annotated by a PreBind whose
		// binding never happened; they will be scheduled again.
		return false
	}
	raw, hasRecord := pod.Annotations[api.AnnotationAllocation]
	var sum uint64
	if hasRecord {
		sum = recordHash(raw)
	}
	s.mu.RLock()
	uid, held := s.holders[key]
	cpuOnly := held && uid == pod.UID && len(s.cluster.Allocation(key).Containers) == 0
	prev, wasRejected := s.rejected[pod.UID]
	s.mu.RUnlock()
	if held && uid == pod.UID && (!(hasRecord && cpuOnly) || wasRejected && prev == sum) {
		// Charged already, or charged without its record, which is
		// the one that was rejected before.
		return false
	}
	// What the pod holds: its CPU and memory on the node, as
	// NodeResourcesFit counts them, whatever placed it; and the GPUs of
	// its record, if it has one that is charged.
	cpu, mem := podrequest.EffectiveCPUMemory(pod)
	rec := &api.PodAllocation{Node: pod.Spec.NodeName}
	rejected := false
	switch {
	case !hasRecord:
		// A pod on a node in mode dra holds its GPUs through a
		// ResourceClaim and has no record.
		if s.trust != nil && pod.Spec.SchedulerName == api.SchedulerName && asksGPU(pod, s.trust.names) && !s.onDRANode(pod) {
			s.trust.warn(logger, pod, ReasonRecordMissing, fmt.Sprintf(
				"bound to node %s without a %s annotation: what it holds there cannot be charged, and the node agent serves no GPU without a record (was the record removed? docs/security.md)",
				pod.Spec.NodeName, api.AnnotationAllocation))
		}
	default:
		if r := s.chargeableRecord(logger, pod); r != nil {
			rec = r
		} else {
			rejected = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rejected {
		s.rejected[pod.UID] = sum
	} else {
		delete(s.rejected, pod.UID)
	}
	released := false
	if held {
		// The key now names a new pod (or the pod's record arrived after
		// its CPU and memory were charged); what was charged is free.
		released = s.releaseLocked(key)
	}
	if err := s.cluster.AssignRecord(key, cpu, mem, rec); err != nil {
		logger.Error(err, "Cannot charge the pod's GPU allocation record", "pod", klog.KObj(pod))
		return released
	}
	s.holders[key] = pod.UID
	s.publishLocked(rec.Node)
	return released
}

// chargeableRecord is the pod's allocation record if it decodes, names
// the pod's node and is trusted (trust.go), else nil (logged, warned).
func (s *state) chargeableRecord(logger klog.Logger, pod *corev1.Pod) *api.PodAllocation {
	rec, err := kubeobj.Record(pod)
	if err != nil {
		logger.Error(err, "Ignoring the pod's GPU allocation record", "pod", klog.KObj(pod))
		return nil
	}
	if rec.Node != pod.Spec.NodeName {
		logger.Error(nil, "Ignoring a GPU allocation record for another node", "pod", klog.KObj(pod), "recordNode", rec.Node, "node", pod.Spec.NodeName)
		return nil
	}
	note, err := s.trust.check(pod, rec, s.gpusOf(rec.Node))
	if err != nil {
		s.trust.warn(logger, pod, ReasonRecordIgnored, fmt.Sprintf("GPU allocation record not charged: %v", err))
		return nil
	}
	if note != "" {
		s.trust.warn(logger, pod, ReasonRecordUnverified, note)
	}
	return rec
}

// deletePod releases a deleted pod; obj may be a tombstone.
func (s *state) deletePod(obj any) bool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return false
	}
	s.trust.forget(pod.UID)
	s.forgetRejected(pod.UID)
	return s.release(kubeobj.Key(pod), pod.UID)
}

// recordHash identifies an allocation annotation's value (state.rejected).
func recordHash(raw string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(raw))
	return h.Sum64()
}

func (s *state) forgetRejected(uid types.UID) {
	s.mu.Lock()
	delete(s.rejected, uid)
	s.mu.Unlock()
}

// release drops what the pod with this key and UID holds.
func (s *state) release(key string, uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if held, ok := s.holders[key]; !ok || held != uid {
		return false
	}
	return s.releaseLocked(key)
}

func (s *state) releaseLocked(key string) bool {
	rec := s.cluster.Allocation(key)
	delete(s.holders, key)
	if !s.cluster.Release(key) {
		return false
	}
	if rec != nil {
		s.publishLocked(rec.Node)
		s.freedLocked(rec.Node)
	}
	return true
}

// publishLocked tells the observer that the node's usage changed.
func (s *state) publishLocked(node string) {
	if n := s.cluster.Node(node); n != nil {
		s.obs.nodeChanged(n)
	}
}
