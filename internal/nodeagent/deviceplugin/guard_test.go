package deviceplugin

import (
	"context"
	"crypto/ed25519"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

const gpuMiB = 40960

// guardEnv is a plugin with the agent's checks: 4 GPUs of 40960 MiB
// (NVML's figure), 10 slots each, records signed by signer.
type guardEnv struct {
	*env
	signer  *recordsig.Signer
	mu      sync.Mutex
	refused map[string]string // pod name → reason (the agent's events)
}

func newGuardEnv(t *testing.T, acceptUnsigned bool) *guardEnv {
	e := newEnv(t, api.SharingShared, 10)
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 7
	signer, _ := recordsig.NewSigner(seed)
	ring := recordsig.NewKeyring(signer.Public())
	g := &guardEnv{env: e, signer: signer, refused: map[string]string{}}
	e.plugin.opts.Guard = &Guard{
		Names:          api.DefaultResourceNames,
		Verify:         func(_ context.Context, r *api.PodAllocation) error { return ring.Verify(r) },
		AcceptUnsigned: acceptUnsigned,
		NodePods: func() []*v1.Pod {
			e.api.mu.Lock()
			defer e.api.mu.Unlock()
			var out []*v1.Pod
			for _, p := range e.api.pods {
				out = append(out, p)
			}
			return out
		},
		Refused: func(p *v1.Pod, reason string) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.refused[p.Name] = reason
		},
	}
	var gpus []GPU
	for i := 0; i < 4; i++ {
		gpus = append(gpus, GPU{UUID: uuid(i), Healthy: true, Slots: 10, MemoryMiB: gpuMiB, MemoryCapMiB: gpuMiB})
	}
	e.plugin.SetGPUs(gpus, api.SharingShared)
	return g
}

// podAsking is a pod whose container "main" asks res and whose record
// grants it on GPU gpu; sign signs the record as the scheduler does.
func (g *guardEnv) podAsking(name string, res map[string]string, grant api.DeviceGrant, sign bool) *v1.Pod {
	p := fixtures.MakePod().Namespace("ns").Name(name).UID("00000000-0000-0000-0000-0000000000"+name).Node(node).Container("main", res).Obj()
	rec := &api.PodAllocation{Node: node, PodUID: string(p.UID), Containers: []api.ContainerAllocation{{Name: "main", Devices: []api.DeviceGrant{grant}}}}
	if sign {
		if err := g.signer.Sign(rec); err != nil {
			panic(err)
		}
	}
	return fixtures.MakePod().Namespace("ns").Name(name).UID(string(p.UID)).Node(node).Container("main", res).Record(rec).Obj()
}

func (g *guardEnv) expectRefused(t *testing.T, p *v1.Pod, want string) {
	t.Helper()
	g.api.put(p)
	_, err := g.admit(p)
	// The kubelet fails a pod it could not admit: it is no longer active.
	g.kubelet.mu.Lock()
	for i, kp := range g.kubelet.pods {
		if kp.Name == p.Name {
			g.kubelet.pods = append(g.kubelet.pods[:i], g.kubelet.pods[i+1:]...)
			break
		}
	}
	g.kubelet.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("pod %s: %v, want a refusal mentioning %q", p.Name, err, want)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !strings.Contains(g.refused[p.Name], want) {
		t.Errorf("pod %s: no event with the refusal (%q)", p.Name, g.refused[p.Name])
	}
	if g.State().Served(p.UID, "main") {
		t.Errorf("pod %s: a refused container was recorded as served", p.Name)
	}
}

func (g *guardEnv) State() statedir.Dirs { return g.plugin.opts.Matcher.State }

var tenth = map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "10", "nvidia.com/gpucores": "10"}

// TestGuardServesWhatTheSchedulerSigned: a signed record that matches the
// request is served, and the grant enters the node's ledger.
func TestGuardServesWhatTheSchedulerSigned(t *testing.T) {
	g := newGuardEnv(t, false)
	p := g.podAsking("ok", tenth, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 4096, Cores: 10}, true)
	g.api.put(p)
	if _, err := g.admit(p); err != nil {
		t.Fatal(err)
	}
	es, err := g.State().Entries()
	if err != nil || len(es) != 1 || es[0].Grant == nil || es[0].Grant.Devices[0].MemoryMiB != 4096 {
		t.Errorf("ledger %+v %v", es, err)
	}
}

// TestGuardRefusesForgedRecords: findings 1, 3 and 4 on the node, with
// the admission policy out of the way: a record the scheduler did not
// sign, one changed after signing, one copied from another pod, one
// granting more than the pod asks, are all refused with an event.
func TestGuardRefusesForgedRecords(t *testing.T) {
	g := newGuardEnv(t, false)
	g.expectRefused(t, g.podAsking("unsigned", tenth, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 40960}, false), "not signed by the Tessera scheduler")
	changed := g.podAsking("changed", tenth, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 4096, Cores: 10}, true)
	rec, _ := api.DecodeAllocation([]byte(changed.Annotations[api.AnnotationAllocation]))
	rec.Containers[0].Devices[0].MemoryMiB, rec.Containers[0].Devices[0].Cores = 40960, 0
	b, _ := api.EncodeAllocation(rec)
	changed.Annotations[api.AnnotationAllocation] = string(b)
	g.expectRefused(t, changed, "signature does not hold")
	donor := g.podAsking("donor", tenth, api.DeviceGrant{UUID: uuid(1), MemoryMiB: 4096, Cores: 10}, true)
	copied := g.podAsking("copied", tenth, api.DeviceGrant{UUID: uuid(1), MemoryMiB: 4096, Cores: 10}, false)
	copied.Annotations[api.AnnotationAllocation] = donor.Annotations[api.AnnotationAllocation]
	g.expectRefused(t, copied, "written for pod UID "+string(donor.UID))
	// Signed, but not what the pod asks (a scheduler bug or a stolen key).
	g.expectRefused(t, g.podAsking("more", tenth, api.DeviceGrant{UUID: uuid(2), MemoryMiB: 8192, Cores: 10}, true), "grants 8192 MiB, the request asks 4096 MiB")

	// With unsigned records accepted (an upgrade), the request check still
	// catches a raised grant.
	u := newGuardEnv(t, true)
	u.expectRefused(t, u.podAsking("raised", tenth, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 40960, Cores: 0}, false), "does not match its request")
	legacy := u.podAsking("legacy", tenth, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 4096, Cores: 10}, false)
	u.api.put(legacy)
	if _, err := u.admit(legacy); err != nil {
		t.Errorf("an unsigned record matching its request, unsigned accepted: %v", err)
	}
}

// TestGuardHoldsThePhysicalGPU: finding 6, the forged inventory. A
// scheduler that believed a 409600 MiB inventory signs records that each
// match their pods; the node serves them only while NVML's 40960 MiB hold
// them, counting what it already serves.
func TestGuardHoldsThePhysicalGPU(t *testing.T) {
	g := newGuardEnv(t, false)
	big := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"}
	first := g.podAsking("a", big, api.DeviceGrant{UUID: uuid(3), MemoryMiB: 30000}, true)
	g.api.put(first)
	if _, err := g.admit(first); err != nil {
		t.Fatal(err)
	}
	g.expectRefused(t, g.podAsking("b", big, api.DeviceGrant{UUID: uuid(3), MemoryMiB: 30000}, true), "over its memory: 60000 MiB of 40960")
	huge := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}
	g.expectRefused(t, g.podAsking("c", huge, api.DeviceGrant{UUID: uuid(2), MemoryMiB: 50000}, true), "grants 50000 MiB on GPU "+uuid(2)+", which has 40960 MiB")
	// Another GPU still takes the second pod.
	ok := g.podAsking("d", big, api.DeviceGrant{UUID: uuid(1), MemoryMiB: 30000}, true)
	g.api.put(ok)
	if _, err := g.admit(ok); err != nil {
		t.Errorf("a pod that fits: %v", err)
	}
}

// TestGuardLedgerSurvivesRemovedRecords: finding 2. A pod's record is
// removed from the API after it was served (and a restarted scheduler no
// longer counts it); the node still does, from its ledger, and refuses
// the pod placed over it. Once the pod is gone its grant is free again.
func TestGuardLedgerSurvivesRemovedRecords(t *testing.T) {
	g := newGuardEnv(t, false)
	big := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"}
	a := g.podAsking("a", big, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 30000}, true)
	g.api.put(a)
	if _, err := g.admit(a); err != nil {
		t.Fatal(err)
	}
	stripped := a.DeepCopy()
	delete(stripped.Annotations, api.AnnotationAllocation)
	g.api.put(stripped)
	g.expectRefused(t, g.podAsking("b", big, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 30000}, true), "counting the 1 pods this node already serves there")
	// a finishes: its grant no longer counts.
	done := stripped.DeepCopy()
	done.Status.Phase = v1.PodSucceeded
	g.api.put(done)
	c := g.podAsking("c", big, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 30000}, true)
	g.api.put(c)
	if _, err := g.admit(c); err != nil {
		t.Errorf("after a finished: %v", err)
	}
	// A deleted pod's grant is free too, even before its directory is
	// collected.
	g.api.mu.Lock()
	delete(g.api.pods, "ns/c")
	g.api.mu.Unlock()
	d := g.podAsking("d", big, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 30000}, true)
	g.api.put(d)
	if _, err := g.admit(d); err != nil {
		t.Errorf("after c was deleted: %v", err)
	}
	if !g.plugin.opts.Guard.gone[types.UID(c.UID)] {
		t.Error("the deleted pod was not remembered as gone")
	}
}

// TestGuardShareSlots: no GPU serves more containers than its slots.
func TestGuardShareSlots(t *testing.T) {
	g := newGuardEnv(t, false)
	gpus, _ := g.plugin.offered()
	var list []GPU
	for _, x := range gpus {
		x.Slots = 2
		list = append(list, x)
	}
	g.plugin.SetGPUs(list, api.SharingShared)
	small := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"}
	for _, n := range []string{"a", "b"} {
		p := g.podAsking(n, small, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 100}, true)
		g.api.put(p)
		if _, err := g.admit(p); err != nil {
			t.Fatal(err)
		}
	}
	g.expectRefused(t, g.podAsking("c", small, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 100}, true), "3 of 2 share slots")
}

// TestGuardPreemptedShareFree: the race of a preemption on the node. A
// victim's share is served; the scheduler preempts it (the API server
// marks it deleted) and, once its containers have stopped and the pod is
// gone from the API, binds the preemptor in its room. This agent's cache
// may still show the victim, terminating: while the kubelet still runs
// it, a pod placed over it is refused; once the kubelet no longer lists
// it (its processes exited), the preemptor's first Allocate is served.
func TestGuardPreemptedShareFree(t *testing.T) {
	g := newGuardEnv(t, false)
	big := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"}
	victim := g.podAsking("victim", big, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 30000}, true)
	g.api.put(victim)
	if _, err := g.admit(victim); err != nil {
		t.Fatal(err)
	}
	// Preempted: terminating in the cache, its containers still running.
	term := victim.DeepCopy()
	now := metav1.Now()
	term.DeletionTimestamp = &now
	g.api.put(term)
	g.expectRefused(t, g.podAsking("early", big, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 30000}, true), "counting the 1 pods this node already serves there")
	// Its processes exit: the kubelet drops it from its active pods; the
	// cache still lists it, terminating.
	g.kubelet.mu.Lock()
	for i, kp := range g.kubelet.pods {
		if kp.Name == "victim" {
			g.kubelet.pods = append(g.kubelet.pods[:i], g.kubelet.pods[i+1:]...)
			break
		}
	}
	g.kubelet.mu.Unlock()
	pre := g.podAsking("preemptor", big, api.DeviceGrant{UUID: uuid(0), MemoryMiB: 30000}, true)
	g.api.put(pre)
	if _, err := g.admit(pre); err != nil {
		t.Fatalf("the preemptor's first Allocate: %v", err)
	}
	// A running pod the kubelet does not list (it may be restarting)
	// still counts.
	other := g.podAsking("other", big, api.DeviceGrant{UUID: uuid(1), MemoryMiB: 30000}, true)
	g.api.put(other)
	if _, err := g.admit(other); err != nil {
		t.Fatal(err)
	}
	g.kubelet.mu.Lock()
	for i, kp := range g.kubelet.pods {
		if kp.Name == "other" {
			g.kubelet.pods = append(g.kubelet.pods[:i], g.kubelet.pods[i+1:]...)
			break
		}
	}
	g.kubelet.mu.Unlock()
	g.expectRefused(t, g.podAsking("over", big, api.DeviceGrant{UUID: uuid(1), MemoryMiB: 30000}, true), "counting the 1 pods this node already serves there")
}
