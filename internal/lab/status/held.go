package status

// What NVML's processes hold, against what their containers were
// granted: the physical check's count of memory held without a valid
// grant (a pod that asked no GPU and selected every GPU of its node
// through NVIDIA_VISIBLE_DEVICES, a container whose limiter was hidden or
// whose limiter state was removed, a process in no container).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/claimuse"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
)

// procRoot is the host's /proc: the lab's containers are the host's
// processes.
var procRoot = "/proc"

// grant is what one container may hold, per GPU UUID: from its pod's
// allocation record, or from the DRA claims it uses (claims).
type grant struct {
	claims bool
	devs   map[string]grantDev
	// none says why the container has no valid record ("" when it has
	// one, or uses claims).
	none string
}

type grantDev struct {
	mib   int64
	whole bool
	// ceiling: a grant that may burst holds up to it (0: up to mib)
	ceiling int64
	// group is the DRA claim request whose grant the container shares
	// with every other container using it ("" for its own).
	group string
}

type allocated struct {
	namespace, name string
	devs            []kubeobj.ClaimDevice
}

// labClaims reads every allocated ResourceClaim's devices of Tessera's
// driver.
func labClaims(ctx context.Context, client kubernetes.Interface) ([]allocated, error) {
	list, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil // no DRA API served
	}
	if err != nil {
		return nil, err
	}
	var out []allocated
	for i := range list.Items {
		c := &list.Items[i]
		devs, err := kubeobj.ClaimDevices(c)
		if err != nil || len(devs) == 0 {
			continue // read as no grant: what its containers hold is counted
		}
		out = append(out, allocated{c.Namespace, c.Name, devs})
	}
	return out, nil
}

// claimsOn are the claims' devices on one node (its DRA pool), as
// claimuse reads them: devices names the node's GPUs by DRA device name.
func claimsOn(all []allocated, node string, devices map[string]string) []claimuse.Claim {
	var out []claimuse.Claim
	for _, a := range all {
		c := claimuse.Claim{Namespace: a.namespace, Name: a.name}
		for _, d := range a.devs {
			uuid, ok := devices[d.Device]
			if d.Pool != node || !ok {
				continue
			}
			i := len(c.Requests) - 1
			if i < 0 || c.Requests[i].Request != d.Request {
				c.Requests = append(c.Requests, claimuse.Request{Request: d.Request})
				i++
			}
			c.Requests[i].Devices = append(c.Requests[i].Devices, claimuse.Device{UUID: uuid, MemoryMiB: d.MemoryMiB, Cores: d.Cores, Whole: d.Whole, Admin: d.Admin})
		}
		if len(c.Requests) > 0 {
			out = append(out, c)
		}
	}
	return out
}

// grantsOn is what each container of the node's pods may hold, by pod UID
// and container name (container "": every container of a pod without a
// valid record, and why).
func grantsOn(pods []*corev1.Pod, claims []claimuse.Claim) map[string]*grant {
	out := map[string]*grant{}
	get := func(uid, container string) *grant {
		g := out[uid+"/"+container]
		if g == nil {
			g = &grant{devs: map[string]grantDev{}}
			out[uid+"/"+container] = g
		}
		return g
	}
	for _, p := range pods {
		rec, err := kubeobj.Record(p)
		if err == nil && rec.Node != p.Spec.NodeName {
			err = fmt.Errorf("the record is for node %q", rec.Node)
		}
		if err != nil {
			// Every container of the pod, by the pod's key (container "").
			get(string(p.UID), "").none = "its pod has no valid record: " + err.Error()
			continue
		}
		for _, c := range rec.Containers {
			g := get(string(p.UID), c.Name)
			for _, d := range c.Devices {
				if d.MIG == nil { // a MIG device's processes are its own device's
					g.devs[d.UUID] = grantDev{mib: d.MemoryMiB, whole: d.Exclusive}
					if d.Bursts() {
						g.devs[d.UUID] = grantDev{mib: d.MemoryMiB, ceiling: d.CeilingMiB}
					}
				}
			}
		}
	}
	for _, u := range claimuse.Uses(pods, claims) {
		g := get(string(u.Pod.UID), u.Container)
		g.claims, g.none = true, ""
		for _, d := range u.Request.Devices {
			g.devs[d.UUID] = grantDev{mib: d.MemoryMiB, whole: d.Whole || d.Admin, group: u.Key()}
		}
	}
	return out
}

// holding is what one container (or the containers sharing a claim
// request's grant, or the processes in no container) holds on one GPU.
type holding struct {
	gpu  string
	who  string
	mib  int64
	pids []int
	// grant is the container's grant of the GPU; none says why it has
	// none ("" when it has).
	grant grantDev
	none  string
}

// ungranted says what is held without a valid grant ("" when nothing
// is).
func (h holding) ungranted(gpuMiB int64) string {
	switch {
	case h.none != "":
		return fmt.Sprintf("%s holds %d MiB in processes %v and %s", h.who, h.mib, h.pids, h.none)
	case h.grant.whole && h.mib <= gpuMiB, !h.grant.whole && h.mib <= max(h.grant.mib, h.grant.ceiling):
		return ""
	case h.grant.whole:
		return fmt.Sprintf("%s holds %d MiB in processes %v, more than the GPU's %d MiB", h.who, h.mib, h.pids, gpuMiB)
	case h.grant.ceiling > 0:
		return fmt.Sprintf("%s holds %d MiB in processes %v, more than its ceiling of %d MiB", h.who, h.mib, h.pids, h.grant.ceiling)
	}
	return fmt.Sprintf("%s holds %d MiB in processes %v, more than its grant of %d MiB", h.who, h.mib, h.pids, h.grant.mib)
}

// heldOn reads, per GPU of the node, what NVML's processes hold and whose
// they are: the container their cgroup names (records by container ID,
// pods by UID), the grant it has.
func heldOn(devices []discovery.Device, records map[string]*hollowkubelet.Container, pods map[string]*corev1.Pod, grants map[string]*grant) []holding {
	var out []holding
	for _, dv := range devices {
		uuid := dv.GPU.UUID
		by := map[string]*holding{}
		var order []string
		for _, p := range processes(dv.Handle) {
			h := ownerOf(int(p.Pid), uuid, records, pods, grants)
			k := h.who
			if h.grant.group != "" {
				k = h.grant.group
			}
			cur := by[k]
			if cur == nil {
				cur = &h
				by[k] = cur
				order = append(order, k)
			} else if !strings.Contains(cur.who, h.who) {
				cur.who += ", " + h.who
			}
			cur.mib += int64(p.UsedGpuMemory >> 20)
			cur.pids = append(cur.pids, int(p.Pid))
		}
		sort.Strings(order)
		for _, k := range order {
			sort.Ints(by[k].pids)
			out = append(out, *by[k])
		}
	}
	return out
}

// ownerOf names a process's container and its grant of the GPU.
func ownerOf(pid int, gpu string, records map[string]*hollowkubelet.Container, pods map[string]*corev1.Pod, grants map[string]*grant) holding {
	h := holding{gpu: gpu}
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	uid, id, ok := reconcile.ParseCgroup(string(b))
	if err != nil || !ok {
		h.who, h.none = "a process in no container", "has no grant"
		return h
	}
	name := ""
	if c := records[id]; c != nil && c.PodUID == string(uid) {
		name = c.Name
	}
	pod := pods[string(uid)]
	if pod == nil {
		h.who, h.none = fmt.Sprintf("container %s of pod UID %s", id, uid), "has no grant: its pod does not exist"
		return h
	}
	if name == "" {
		for _, cs := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
			for _, s := range cs {
				if strings.HasSuffix(s.ContainerID, "://"+id) {
					name = s.Name
				}
			}
		}
	}
	h.who = fmt.Sprintf("%s/%s/%s", pod.Namespace, pod.Name, name)
	g := grants[string(uid)+"/"+name]
	if g == nil {
		g = grants[string(uid)+"/"]
	}
	switch {
	case g == nil:
		h.none = "its pod's record grants it no GPU"
	case g.none != "":
		h.none = g.none
	default:
		d, ok := g.devs[gpu]
		if !ok {
			h.none = "its grant does not name this GPU"
		}
		// Given the GPU without the limiter (a whole GPU, a node that
		// shares by time-slicing): the GPU's memory is its bound; whether
		// that was its grant is CheckPhysical's check of what it was given.
		if c := records[id]; ok && c != nil {
			if gv, err := givenTo(c); err == nil {
				for _, x := range gv {
					d.whole = d.whole || x.whole && strings.EqualFold(x.UUID, gpu)
				}
			}
		}
		h.grant = d
	}
	return h
}

// processes are the GPU's compute processes as NVML lists them (none when
// it cannot list them).
func processes(d nvml.Device) (ps []nvml.ProcessInfo) {
	defer func() {
		if recover() != nil {
			ps = nil
		}
	}()
	ps, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil
	}
	return ps
}
