package deviceplugin

// The node's own checks of a record before Allocate answers from it
// (docs/security.md, "On the node"). The scheduler and the admission
// policy decide what a pod gets; the agent does not take their word for
// it: the record must carry the scheduler's signature, grant exactly what
// the pod's own spec asks, fit the GPUs NVML reports (not the inventory
// annotation, which a node's credentials can rewrite), and fit beside
// everything this node has already served (its ledger on the host, not
// the records on pods, which can be removed).

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/recordcheck"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Guard configures the checks. The agent always sets one; a plugin
// without a Guard only matches requests to records (the matcher's tests).
type Guard struct {
	Names api.ResourceNames
	// Verify checks a record's signature against the scheduler's
	// published keys (recordsig.KeySource.Verify). Nil: signatures are
	// not checked, and the records rest on the admission policy alone.
	Verify func(ctx context.Context, rec *api.PodAllocation) error
	// AcceptUnsigned serves records without a signature (what the
	// previous release's scheduler wrote, during an upgrade).
	AcceptUnsigned bool
	// NodePods lists the pods bound to this node (the agent's informer
	// cache); a served container holds its GPUs while its pod is listed
	// and not finished.
	NodePods func() []*v1.Pod
	// Refused, if set, is told of every refusal (the agent's Warning
	// event on the pod).
	Refused func(pod *v1.Pod, reason string)
	// Admitted, if set, is called once a shared grant is served (its
	// ledger entry written), before the container starts: the host-side
	// reconciler makes room for its guarantee where others borrowed it
	// (reconcile.Reconciler.Admitted).
	Admitted func()

	mu   sync.Mutex
	gone map[types.UID]bool // pods found deleted, so their grants are free
}

// ReasonRefused is the reason of the agent's Warning event when it
// refuses a record.
const ReasonRefused = "TesseraAllocationRefused"

// checkGrant runs every check on the container's grant; gpus are the
// GPUs the plugin offers (NVML's, with their physical memory).
func (p *Plugin) checkGrant(ctx context.Context, t *Target, gpus map[string]GPU, mode api.SharingMode) error {
	g := p.opts.Guard
	if g == nil {
		return nil
	}
	var err error
	if pr := p.opts.Matcher.Protocol; pr != nil {
		// Another scheduler's grants: its protocol holds them to the
		// pod's request (no signature to check).
		err = pr.Check(t.Pod, t.Record, physical(gpus, mode))
	} else if err = g.checkOrigin(ctx, t); err == nil {
		err = g.checkRequest(t, gpus, mode)
	}
	// A MIG instance's memory and SMs are the hardware's to enforce, and
	// the instances' geometry the agent's MIG part's (parts/mig.go): the physical
	// and ledger checks are about shares.
	if err == nil && !hasMIG(t.Grant) {
		err = checkPhysical(t, gpus)
		if err == nil {
			err = g.checkLedger(ctx, p.opts.Matcher, t, gpus)
		}
	}
	if err == nil {
		return nil
	}
	err = fmt.Errorf("%w: pod %s container %s: %v", ErrNoMatch, kubeobj.Key(t.Pod), t.Container, err)
	if g.Refused != nil {
		g.Refused(t.Pod, err.Error())
	}
	if pr := p.opts.Matcher.Protocol; pr != nil {
		pr.Refused(ctx, t.Pod, err.Error())
	}
	return err
}

func hasMIG(c api.ContainerAllocation) bool {
	for _, d := range c.Devices {
		if d.MIG != nil {
			return true
		}
	}
	return false
}

// shares drops a container's MIG grants.
func shares(c api.ContainerAllocation) api.ContainerAllocation {
	out := c
	out.Devices = nil
	for _, d := range c.Devices {
		if d.MIG == nil {
			out.Devices = append(out.Devices, d)
		}
	}
	return out
}

// checkOrigin: the record was written by the scheduler for this pod.
func (g *Guard) checkOrigin(ctx context.Context, t *Target) error {
	rec := t.Record
	if rec.PodUID != "" && rec.PodUID != string(t.Pod.UID) {
		return fmt.Errorf("its allocation record was written for pod UID %s, not this pod (%s)", rec.PodUID, t.Pod.UID)
	}
	if g.Verify == nil {
		return nil
	}
	err := g.Verify(ctx, rec)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, recordsig.ErrUnsigned) && g.AcceptUnsigned:
		return nil
	case errors.Is(err, recordsig.ErrUnsigned):
		return fmt.Errorf("its allocation record is not signed by the Tessera scheduler (run the agent with --accept-unsigned-records only while upgrading from an unsigned release)")
	}
	return fmt.Errorf("its allocation record's signature does not hold: %v", err)
}

// physical is NVML's memory of each offered GPU, and its replicas when
// the node shares GPUs by replicas (time-slicing, MPS: one per slot).
func physical(gpus map[string]GPU, mode api.SharingMode) recordcheck.Lookup {
	return func(uuid string) (recordcheck.GPU, bool) {
		g, ok := gpus[uuid]
		out := recordcheck.GPU{MemoryMiB: g.MemoryMiB}
		if gpushare.Replicated(mode) {
			out.Replicas = g.Slots
		}
		return out, ok && g.MemoryMiB > 0
	}
}

// checkRequest: the record grants exactly what the pod's spec asks, with
// percentages and whole GPUs worked out on NVML's memory.
func (g *Guard) checkRequest(t *Target, gpus map[string]GPU, mode api.SharingMode) error {
	if err := recordcheck.MatchPod(t.Pod, t.Record, g.Names, physical(gpus, mode)); err != nil {
		return fmt.Errorf("its allocation record does not match its request: %v", err)
	}
	return nil
}

// checkPhysical: no grant asks more memory than its GPU has.
func checkPhysical(t *Target, gpus map[string]GPU) error {
	for _, d := range t.Grant.Devices {
		gpu := gpus[d.UUID]
		if d.MIG == nil && gpu.MemoryMiB > 0 && d.MemoryMiB > gpu.MemoryMiB {
			return fmt.Errorf("its allocation record grants %d MiB on GPU %s, which has %d MiB", d.MemoryMiB, d.UUID, gpu.MemoryMiB)
		}
	}
	return nil
}

// checkLedger: with this container's grant added to what the node has
// served to live pods, no GPU it names is over its memory (× overcommit),
// its cores or its share slots, or held whole twice. The ledger is the
// grants the agent wrote on the host when it served them (statedir), so a
// record removed or rewritten on a pod, or a scheduler that forgot a pod,
// changes nothing here.
func (g *Guard) checkLedger(ctx context.Context, m *Matcher, t *Target, gpus map[string]GPU) error {
	entries, err := m.State.Entries()
	if err != nil {
		return fmt.Errorf("reading what this node has served: %v", err)
	}
	live := map[types.UID]*v1.Pod{}
	if g.NodePods != nil {
		for _, p := range g.NodePods() {
			if p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
				live[p.UID] = p
			}
		}
	}
	live[t.Pod.UID] = t.Pod
	stopped := g.stopped(ctx, m, live)
	// Per pod, the containers it was served, as a record.
	perPod := map[types.UID]*api.PodAllocation{}
	add := func(uid types.UID, c api.ContainerAllocation) {
		if c = shares(c); len(c.Devices) == 0 {
			return
		}
		r := perPod[uid]
		if r == nil {
			r = &api.PodAllocation{}
			perPod[uid] = r
		}
		r.Containers = append(r.Containers, c)
	}
	for _, e := range entries {
		if e.PodUID == t.Pod.UID && e.Container == t.Container {
			continue // this very container: a retry of an answer that was lost
		}
		if stopped[e.PodUID] || !g.holds(ctx, m, e, live) {
			continue
		}
		if e.Grant != nil {
			add(e.PodUID, api.ContainerAllocation{Name: e.Container, Init: e.Grant.Init, Devices: e.Grant.Devices})
		} else if c, ok := legacyGrant(live[e.PodUID], e.Container); ok {
			add(e.PodUID, c)
		}
	}
	add(t.Pod.UID, t.Grant)
	memoryCap := func(uuid string) (int64, bool) {
		gpu, ok := gpus[uuid]
		return gpu.MemoryCapMiB, ok && gpu.MemoryCapMiB > 0
	}
	used := map[string]gpushare.Usage{}
	holders := map[string]int{}
	for _, r := range perPod {
		for _, c := range gpushare.Charges(r, memoryCap) {
			u := used[c.UUID]
			u.Add(c.Usage)
			used[c.UUID] = u
			holders[c.UUID]++
		}
	}
	var uuids []string
	for _, d := range t.Grant.Devices {
		uuids = append(uuids, d.UUID)
	}
	sort.Strings(uuids)
	for _, uuid := range uuids {
		gpu := gpus[uuid]
		if gpu.MemoryMiB == 0 {
			continue // no physical figures (tests without NVML)
		}
		capy := gpushare.Capacity{MemoryMiB: gpu.MemoryMiB, MemoryCap: gpu.MemoryCapMiB, MaxShares: gpu.Slots}
		u := used[uuid]
		if l := capy.Exceeded(u); l != 0 {
			return fmt.Errorf("GPU %s would be over %s: %d MiB of %d, %d percent of the cores, %d of %d share slots, held whole %d times, counting the %d pods this node already serves there (a record the scheduler did not account for: docs/security.md)",
				uuid, limitNames(l), u.MemoryMiB, capy.MemoryCap, u.Cores, u.Shares, capy.MaxShares, u.Exclusive, holders[uuid]-1)
		}
	}
	return nil
}

// stopped are the live pods being deleted (deletionTimestamp) whose
// containers the kubelet no longer runs: it does not list them among its
// active pods (the pod-resources API). A pod preempted for another frees
// its GPUs there when its processes have exited, while the API server,
// and so this agent's cache, may still show it, terminating, for a
// moment: the preemptor the scheduler placed in its room is served at its
// first Allocate. A pod not being deleted counts until the cache shows it
// finished or gone (a kubelet that does not list it may be restarting).
// When the kubelet cannot be asked, none is stopped.
func (g *Guard) stopped(ctx context.Context, m *Matcher, live map[types.UID]*v1.Pod) map[types.UID]bool {
	var out map[types.UID]bool
	var active map[string]bool
	for uid, p := range live {
		if p.DeletionTimestamp == nil {
			continue
		}
		if active == nil {
			kps, err := m.Kubelet.List(ctx)
			if err != nil {
				return nil
			}
			active = make(map[string]bool, len(kps))
			for _, kp := range kps {
				active[kp.Namespace+"/"+kp.Name] = true
			}
		}
		if !active[kubeobj.Key(p)] {
			if out == nil {
				out = map[types.UID]bool{}
			}
			out[uid] = true
		}
	}
	return out
}

// holds reports whether the served container's pod still holds its GPUs:
// it is on the node and not finished. A pod the cache does not list is
// read from the API (it may be newer than the cache); one found deleted
// is remembered.
func (g *Guard) holds(ctx context.Context, m *Matcher, e statedir.Entry, live map[types.UID]*v1.Pod) bool {
	if _, ok := live[e.PodUID]; ok {
		return true
	}
	g.mu.Lock()
	gone := g.gone[e.PodUID]
	g.mu.Unlock()
	if gone || e.Grant == nil || e.Grant.Pod == "" {
		return false
	}
	p, err := m.Pods.GetPod(ctx, e.Grant.Namespace, e.Grant.Pod)
	if err != nil && !apierrors.IsNotFound(err) {
		return true // cannot tell: count it
	}
	if err != nil || p.UID != e.PodUID || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		g.mu.Lock()
		if g.gone == nil {
			g.gone = map[types.UID]bool{}
		}
		g.gone[e.PodUID] = true
		g.mu.Unlock()
		return false
	}
	live[e.PodUID] = p
	return true
}

// legacyGrant is a container's grant from its pod's record, for a
// container served by an agent that kept no ledger.
func legacyGrant(pod *v1.Pod, container string) (api.ContainerAllocation, bool) {
	if pod == nil {
		return api.ContainerAllocation{}, false
	}
	rec, err := kubeobj.Record(pod)
	if err != nil {
		return api.ContainerAllocation{}, false
	}
	for _, c := range rec.Containers {
		if c.Name == container {
			return c, true
		}
	}
	return api.ContainerAllocation{}, false
}

func limitNames(l gpushare.Limit) string {
	var out []string
	for _, x := range []struct {
		l    gpushare.Limit
		name string
	}{{gpushare.LimitMemory, "its memory"}, {gpushare.LimitCores, "its cores"}, {gpushare.LimitShares, "its share slots"}, {gpushare.LimitWhole, "whole use"}} {
		if l&x.l != 0 {
			out = append(out, x.name)
		}
	}
	s := ""
	for i, o := range out {
		if i > 0 {
			s += " and "
		}
		s += o
	}
	return s
}
