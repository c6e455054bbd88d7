// Package recordcheck decides whether an allocation record grants a pod
// exactly what the pod's own spec asks: the same containers, as many GPUs
// each, and on each GPU the memory, compute share and exclusivity that
// gpushare.Ask derives from the request. The node agent checks every
// record with it before it serves one, and the scheduler before it charges
// a record it reads back after a restart, so a record written by anyone
// but the scheduler can at most describe what the pod asked for.
//
// It reads pods through kubeobj and derives grants through gpushare only,
// so the node agent can link it without the placement core.
package recordcheck

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ContainerAsk is one GPU container's request, defaulted.
type ContainerAsk struct {
	Name string
	// Init is true for init containers that run before the app
	// containers; sidecars (restartable init containers) run with them and
	// are recorded as app containers.
	Init bool
	GPUs int
	Ask  gpushare.Ask
}

// Asks returns what each container of the pod that asks for GPUs asks,
// init containers first, in spec order (kubeobj.ReadResources and
// kubeobj.Defaulted: the webhook's and the scheduler's reading).
func Asks(pod *corev1.Pod, names api.ResourceNames) ([]ContainerAsk, error) {
	var out []ContainerAsk
	for i, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for j := range cs {
			c := &cs[j]
			r, err := kubeobj.ReadResources(c, names)
			if err != nil {
				return nil, err
			}
			if r, err = kubeobj.Defaulted(c.Name, r, names); err != nil {
				return nil, err
			}
			if r.GPUMilli == 0 {
				continue
			}
			out = append(out, ContainerAsk{
				Name: c.Name, Init: i == 0 && !kubeobj.IsSidecar(c), GPUs: int(r.GPUMilli / 1000),
				Ask: gpushare.Ask{MemoryMiB: r.MemoryMiB, MemoryPercent: int(r.MemoryPercent), Cores: int(r.Cores), CeilingMiB: r.CeilingMiB},
			})
		}
	}
	return out, nil
}

// GPU is what Match knows of a GPU: its physical memory in MiB and, when
// it is shared by equal replicas (gpushare.Replicated: time-slicing, MPS),
// how many (0: not replicated).
type GPU struct {
	MemoryMiB int64
	Replicas  int
}

// Lookup returns what is known of a GPU, and whether anything is.
type Lookup func(uuid string) (GPU, bool)

// Match checks that rec grants the pod (UID uid, requests asks) exactly
// what it asks. gpu says what is known of a GPU; with it, memory given as
// a percentage or as the whole GPU is checked, and a whole GPU asked of a
// replicated GPU must be one replica (gpushare.ReplicaSlot). The node
// agent passes NVML's memory and its sharing configuration, the scheduler
// its inventories; nil (or an unknown GPU) checks what needs no GPU, and
// then accepts a share where a whole GPU was asked (a replica of a GPU
// whose sharing is unknown: it grants less than was asked, never more). A
// record that names another pod's UID does not match. MIG grants are
// checked for their count only.
func Match(uid types.UID, asks []ContainerAsk, rec *api.PodAllocation, gpu Lookup) error {
	if rec.PodUID != "" && rec.PodUID != string(uid) {
		return fmt.Errorf("the record was written for pod UID %s, this pod is %s", rec.PodUID, uid)
	}
	type key struct {
		name string
		init bool
	}
	granted := make(map[key]*api.ContainerAllocation, len(rec.Containers))
	for i := range rec.Containers {
		c := &rec.Containers[i]
		granted[key{c.Name, c.Init}] = c
	}
	for _, a := range asks {
		k := key{a.Name, a.Init}
		g, ok := granted[k]
		if !ok {
			return fmt.Errorf("container %s asks for %d GPUs, the record grants it none", describe(a.Name, a.Init), a.GPUs)
		}
		delete(granted, k)
		if len(g.Devices) != a.GPUs {
			return fmt.Errorf("container %s asks for %d GPUs, the record grants %d", describe(a.Name, a.Init), a.GPUs, len(g.Devices))
		}
		for _, d := range g.Devices {
			if d.MIG != nil {
				continue
			}
			if err := matchGrant(a, d, gpu); err != nil {
				return fmt.Errorf("container %s, GPU %s: %w", describe(a.Name, a.Init), d.UUID, err)
			}
		}
	}
	for k := range granted {
		return fmt.Errorf("the record grants GPUs to container %s, which asks for none", describe(k.name, k.init))
	}
	return nil
}

func matchGrant(a ContainerAsk, d api.DeviceGrant, gpu Lookup) error {
	var g GPU
	known := false
	if gpu != nil {
		g, known = gpu(d.UUID)
		known = known && g.MemoryMiB > 0
	}
	want := a.Ask.Grant(d.UUID, g.MemoryMiB)
	if want.Exclusive && known && g.Replicas > 0 {
		slot := gpushare.ReplicaSlot(g.MemoryMiB, g.Replicas)
		want = api.DeviceGrant{UUID: d.UUID, MemoryMiB: slot.MemoryMiB, Cores: slot.Cores}
	}
	if want.Exclusive && !known && !d.Exclusive {
		if d.Cores < 1 || d.Cores > gpushare.FullCores || d.MemoryMiB < 1 {
			return fmt.Errorf("the record grants %d MiB and %d percent of the cores as a replica of the GPU", d.MemoryMiB, d.Cores)
		}
		return nil
	}
	switch {
	case d.Exclusive != want.Exclusive:
		return fmt.Errorf("the record grants exclusive=%v, the request is for exclusive=%v", d.Exclusive, want.Exclusive)
	case d.Cores != want.Cores:
		return fmt.Errorf("the record grants %d percent of the cores, the request asks %d", d.Cores, want.Cores)
	case (known || a.Ask.MemoryMiB > 0) && d.MemoryMiB != want.MemoryMiB:
		return fmt.Errorf("the record grants %d MiB, the request asks %d MiB", d.MemoryMiB, want.MemoryMiB)
	case d.CeilingMiB != want.CeilingMiB:
		return fmt.Errorf("the record grants a memory ceiling of %d MiB, the request asks %d MiB", d.CeilingMiB, want.CeilingMiB)
	case known && d.CeilingMiB > g.MemoryMiB:
		return fmt.Errorf("the record grants a memory ceiling of %d MiB on a GPU of %d MiB", d.CeilingMiB, g.MemoryMiB)
	}
	return nil
}

func describe(name string, init bool) string {
	if init {
		return fmt.Sprintf("%q (init)", name)
	}
	return fmt.Sprintf("%q", name)
}

// MatchPod is Match for a pod.
func MatchPod(pod *corev1.Pod, rec *api.PodAllocation, names api.ResourceNames, gpu Lookup) error {
	asks, err := Asks(pod, names)
	if err != nil {
		return err
	}
	return Match(pod.UID, asks, rec, gpu)
}
