package status

// The invariant checker's physical half: the records say what pods hold,
// but a record can be forged, removed or believed wrongly (a forged
// inventory). CheckPhysical reads what the containers were actually given
// (the fake runtime's record of every container: its visible GPUs, its
// read-only limits file) and the GPUs NVML reports on each node, and
// checks that no GPU was given away more than once over. It also reads
// what NVML says each process holds on each GPU and whose it is (the
// process's cgroup names its pod and container, as the node agent's
// reconciler reads it), and counts the memory held without a valid grant:
// by a container whose pod's record (or DRA claim) does not grant it the
// GPU, over what it grants, or by a process in no container.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/nvmlemu"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// PhysicalReport is the physical truth of a lab: per GPU, what the
// running containers were given.
type PhysicalReport struct {
	// Containers is how many running containers with GPUs were checked.
	Containers int
	// GPUs maps a GPU's UUID to what its containers were given.
	GPUs map[string]*PhysicalGPU
	// Processes is how many processes NVML lists on the GPUs.
	Processes int
	// Errors are the broken rules: a container given a GPU its node does
	// not have, given other GPUs or limits than its record grants, a GPU
	// given past its memory or whole to two containers, NVML reporting
	// more memory in use than the GPU has, memory held without a valid
	// grant.
	Errors []error
}

// PhysicalGPU is one GPU as NVML reports it and as its containers were
// given it.
type PhysicalGPU struct {
	Node       string
	MemoryMiB  int64 // NVML
	GivenMiB   int64 // sum of the containers' memory limits
	Whole      int   // containers given it without a limit
	Containers []string
	UsedMiB    int64 // NVML's processes (0 where the GPU reports none)
	// UngrantedMiB is memory NVML's processes hold on the GPU without a
	// valid grant of it: in a container its pod's record or claims do not
	// grant the GPU, over what they grant, or in no container.
	UngrantedMiB int64
}

// Err is the report's errors joined (nil: the physical invariant holds).
func (r *PhysicalReport) Err() error { return errors.Join(r.Errors...) }

// UngrantedMiB is the memory held without a valid grant on every GPU.
func (r *PhysicalReport) UngrantedMiB() int64 {
	var n int64
	for _, g := range r.GPUs {
		n += g.UngrantedMiB
	}
	return n
}

// Print writes the check's line: what it checked, and that it holds or
// what is broken.
func (r *PhysicalReport) Print(w io.Writer) {
	if err := r.Err(); err != nil {
		fmt.Fprintf(w, "PHYSICAL CHECK BROKEN (%d MiB of GPU memory held without a valid grant): %v\n", r.UngrantedMiB(), err)
		return
	}
	fmt.Fprintf(w, "physical check: %d containers given GPUs, %d GPU processes; no GPU given past its memory, no GPU memory held without a valid grant\n", r.Containers, r.Processes)
}

// CheckPhysical checks the physical invariant of the lab in d.
func CheckPhysical(ctx context.Context, client kubernetes.Interface, d labdir.Dir, nodes []modes.NodeSpec) (*PhysicalReport, error) {
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	byKey := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		byKey[kubeobj.Key(p)] = p
	}
	claims, err := labClaims(ctx, client)
	if err != nil {
		return nil, err
	}
	r := &PhysicalReport{GPUs: map[string]*PhysicalGPU{}}
	fail := func(format string, args ...any) { r.Errors = append(r.Errors, fmt.Errorf(format, args...)) }
	migHolders := map[string]string{}
	var held []holding
	byUID := map[string]*corev1.Pod{}
	for _, p := range byKey {
		byUID[string(p.UID)] = p
	}
	for _, n := range nodes {
		lib, err := nvmlemu.NewModel(n.Model, n.GPUs, n.Name)
		if err != nil {
			return nil, err
		}
		// NVML as the node's agent reads it: the processes on the node's
		// GPUs, from their state files.
		lib.UseUsage(&fakegpu.Node{Dir: d.Node(n.Name).GPUs()})
		res, err := discovery.Discover(lib, discovery.Options{})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		devices := map[string]string{} // DRA device name → UUID
		for _, dv := range res.Devices {
			r.GPUs[dv.GPU.UUID] = &PhysicalGPU{Node: n.Name, MemoryMiB: dv.GPU.MemoryMiB, UsedMiB: nvmlUsed(dv.Handle)}
			devices[dra.DeviceName(dv.GPU.Index)] = dv.GPU.UUID
		}
		files, _ := filepath.Glob(filepath.Join(d.Node(n.Name).Containers(), "*.json"))
		sort.Strings(files)
		var onNode []*corev1.Pod
		for _, p := range byKey {
			if p.Spec.NodeName == n.Name {
				onNode = append(onNode, p)
			}
		}
		grants := grantsOn(onNode, claimsOn(claims, n.Name, devices))
		records := map[string]*hollowkubelet.Container{} // by container ID
		for _, f := range files {
			c, err := labdir.ReadContainer(f)
			if err != nil {
				return nil, err
			}
			records[c.ID] = c
			pod := byKey[c.Namespace+"/"+c.Pod]
			if pod == nil || string(pod.UID) != c.PodUID || pod.Spec.NodeName != n.Name || pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil || initContainer(pod, c.Name) {
				continue // not running now: holds nothing
			}
			given, err := givenTo(c)
			if err != nil {
				fail("node %s, %s/%s container %s: %v", n.Name, c.Namespace, c.Pod, c.Name, err)
				continue
			}
			if len(given) == 0 {
				continue
			}
			r.Containers++
			who := fmt.Sprintf("%s/%s/%s", c.Namespace, c.Pod, c.Name)
			if g, ok := grants[string(pod.UID)+"/"+c.Name]; ok && g.claims {
				checkAgainstClaims(pod, c.Name, given, g, fail)
			} else {
				checkAgainstRecord(pod, c.Name, given, fail)
			}
			for _, g := range given {
				if isMIG(g.UUID) {
					// A MIG device: its memory and SMs are the
					// hardware's partition (checked against the record
					// above); it may only be given once.
					if prev := migHolders[g.UUID]; prev != "" {
						fail("MIG device %s (node %s) given to %s and to %s", g.UUID, n.Name, prev, who)
					}
					migHolders[g.UUID] = who
					continue
				}
				gpu := r.GPUs[g.UUID]
				if gpu == nil || gpu.Node != n.Name {
					fail("%s on node %s was given GPU %s, which that node does not have", who, n.Name, g.UUID)
					continue
				}
				gpu.Containers = append(gpu.Containers, who)
				if g.whole {
					gpu.Whole++
				} else {
					gpu.GivenMiB += g.MemoryMiB
				}
			}
		}
		held = append(held, heldOn(res.Devices, records, byUID, grants)...)
	}
	uuids := make([]string, 0, len(r.GPUs))
	for u := range r.GPUs {
		uuids = append(uuids, u)
	}
	for _, h := range held {
		r.Processes += len(h.pids)
		g := r.GPUs[h.gpu]
		if msg := h.ungranted(g.MemoryMiB); msg != "" {
			g.UngrantedMiB += h.mib
			fail("GPU %s (node %s): %s", h.gpu, g.Node, msg)
		}
	}
	sort.Strings(uuids)
	for _, u := range uuids {
		g := r.GPUs[u]
		switch {
		case g.Whole > 1 || g.Whole == 1 && len(g.Containers) > 1:
			fail("GPU %s (node %s) given whole to one container and to others as well: %s", u, g.Node, strings.Join(g.Containers, ", "))
		case g.GivenMiB > g.MemoryMiB:
			fail("GPU %s (node %s) has %d MiB and its containers were given %d MiB: %s", u, g.Node, g.MemoryMiB, g.GivenMiB, strings.Join(g.Containers, ", "))
		}
		if g.UsedMiB > g.MemoryMiB {
			fail("GPU %s (node %s): NVML reports %d MiB in use of %d", u, g.Node, g.UsedMiB, g.MemoryMiB)
		}
	}
	return r, nil
}

// given is one GPU a container was given, and the memory limit on it
// (whole: no limiter, the GPU is all the container's).
type given struct {
	UUID      string
	MemoryMiB int64
	SM        int
	whole     bool
	mps       bool // SM is an MPS client's thread percentage
}

// givenTo reads a container's GPUs from what its runtime was asked for:
// NVIDIA_VISIBLE_DEVICES (or the volume-mounts device list), and its
// limits from the limits file mounted at limiterconf.Path.
func givenTo(c *hollowkubelet.Container) ([]given, error) {
	var uuids []string
	if v := c.Env[api.EnvVisibleDevices]; v != "" && v != "/var/run/nvidia-container-devices" {
		uuids = strings.Split(v, ",")
	}
	limits := ""
	for _, m := range c.Mounts {
		if dir, u, ok := strings.Cut(m.ContainerPath, "/var/run/nvidia-container-devices/"); ok && dir == "" {
			uuids = append(uuids, u)
		}
		if m.ContainerPath == limiterconf.Path {
			limits = m.HostPath
		}
	}
	if limits == "" {
		out := make([]given, len(uuids))
		for i, u := range uuids {
			out[i] = given{UUID: u, whole: true}
		}
		return out, nil
	}
	b, err := os.ReadFile(limits)
	if err != nil {
		return nil, fmt.Errorf("its limits file: %w", err)
	}
	cfg, err := limiterconf.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("its limits file %s: %w", limits, err)
	}
	var out []given
	inFile := map[string]bool{}
	// An MPS client's compute share is the control daemon's active thread
	// percentage, not the limiter's (which keeps its memory accounting).
	threads, mpsErr := strconv.Atoi(c.Env[deviceplugin.EnvMPSThreadPercentage])
	for _, dv := range cfg.Devices {
		inFile[dv.UUID] = true
		g := given{UUID: dv.UUID, MemoryMiB: int64(dv.MemoryMiB), SM: dv.SMPercent, whole: dv.MemoryMiB == 0}
		if mpsErr == nil && g.SM == 0 {
			g.SM, g.mps = threads, true
		}
		out = append(out, g)
	}
	for _, u := range uuids {
		if !inFile[strings.ToLower(u)] && !inFile[u] {
			return nil, fmt.Errorf("GPU %s is visible to it but not in its limits file", u)
		}
	}
	return out, nil
}

// checkAgainstRecord compares what the container was given with what its
// pod's record grants it.
func checkAgainstRecord(pod *corev1.Pod, container string, got []given, fail func(string, ...any)) {
	who := fmt.Sprintf("%s/%s container %s", pod.Namespace, pod.Name, container)
	rec, err := kubeobj.Record(pod)
	if err != nil {
		fail("%s runs with GPUs but its pod has no valid record: %v", who, err)
		return
	}
	for _, c := range rec.Containers {
		if c.Name != container {
			continue
		}
		if len(c.Devices) != len(got) {
			fail("%s was given %d GPUs, its record grants %d", who, len(got), len(c.Devices))
			return
		}
		for i, d := range c.Devices {
			g := got[i]
			if d.MIG != nil {
				// A MIG grant: the device it names (a static layout), or
				// the instance the agent made for it (dynamic MIG).
				if !isMIG(g.UUID) || d.MIG.Device != "" && !strings.EqualFold(g.UUID, d.MIG.Device) {
					fail("%s was given %s as device %d, its record grants MIG %s@%d device %q of GPU %s", who, g.UUID, i, d.MIG.Profile, d.MIG.Start, d.MIG.Device, d.UUID)
				}
				continue
			}
			if !strings.EqualFold(g.UUID, d.UUID) {
				fail("%s was given GPU %s as device %d, its record grants %s", who, g.UUID, i, d.UUID)
			} else if !g.whole && (g.MemoryMiB != d.MemoryMiB || g.SM != d.Cores && !(g.mps && d.Cores == 0)) {
				// (An MPS client granted no cores runs with one
				// replica's threads.)
				fail("%s was given %d MiB and %d percent on GPU %s, its record grants %d MiB and %d percent", who, g.MemoryMiB, g.SM, d.UUID, d.MemoryMiB, d.Cores)
			} else if g.whole && !d.Exclusive {
				fail("%s was given GPU %s without limits, its record grants a share", who, d.UUID)
			}
		}
		return
	}
	fail("%s was given GPUs, its record grants it none", who)
}

// checkAgainstClaims compares what a container using DRA claims was given
// with what the claims' allocations grant it.
func checkAgainstClaims(pod *corev1.Pod, container string, got []given, g *grant, fail func(string, ...any)) {
	who := fmt.Sprintf("%s/%s container %s", pod.Namespace, pod.Name, container)
	if len(got) != len(g.devs) {
		fail("%s was given %d GPUs, its claims grant %d", who, len(got), len(g.devs))
		return
	}
	for _, d := range got {
		want, ok := g.devs[d.UUID]
		switch {
		case !ok:
			fail("%s was given GPU %s, which its claims do not grant", who, d.UUID)
		case d.whole != want.whole || !d.whole && d.MemoryMiB != want.mib:
			fail("%s was given %d MiB (whole: %v) on GPU %s, its claim grants %d MiB (whole: %v)", who, d.MemoryMiB, d.whole, d.UUID, want.mib, want.whole)
		}
	}
}

func initContainer(pod *corev1.Pod, name string) bool {
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.Name == name {
			return !kubeobj.IsSidecar(c)
		}
	}
	return false
}

// nvmlUsed is the memory NVML's processes hold on a GPU, 0 when the GPU
// lists none or cannot list them.
func nvmlUsed(d nvml.Device) (mib int64) {
	for _, p := range processes(d) {
		mib += int64(p.UsedGpuMemory >> 20)
	}
	return mib
}

// isMIG reports a MIG device's UUID (NVML names them MIG-…).
func isMIG(uuid string) bool { return strings.HasPrefix(uuid, "MIG-") }
