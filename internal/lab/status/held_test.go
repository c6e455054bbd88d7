package status

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestHeldWithoutAGrant: what NVML's processes hold on each GPU is
// counted against their containers' grants: a share over its record, a
// pod that asked no GPU and took one anyway (NVIDIA_VISIBLE_DEVICES=all),
// a process in no container, are held without a valid grant; a share
// within its record, a whole GPU, and containers sharing a DRA claim
// request within its grant together, are not.
func TestHeldWithoutAGrant(t *testing.T) {
	proc := t.TempDir()
	old := procRoot
	procRoot = proc
	t.Cleanup(func() { procRoot = old })
	g0, g1 := fixtures.GPUUUID("n", 0), fixtures.GPUUUID("n", 1)
	procs := map[string][]nvml.ProcessInfo{}
	records := map[string]*hollowkubelet.Container{}
	pods := map[string]*corev1.Pod{}
	var all []*corev1.Pod
	n := 0
	// run adds a container of pod p and its processes, each holding mib
	// on gpu.
	run := func(p *corev1.Pod, container, gpu string, mib ...uint64) {
		n++
		id := fmt.Sprintf("%064x", n)
		records[id] = &hollowkubelet.Container{ID: id, PodUID: string(p.UID), Namespace: p.Namespace, Pod: p.Name, Name: container}
		if pods[string(p.UID)] == nil {
			pods[string(p.UID)] = p
			all = append(all, p)
		}
		for i, m := range mib {
			pid := n*10 + i
			dir := filepath.Join(proc, fmt.Sprint(pid))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			cg := fmt.Sprintf("0::/tessera-lab/x/n/kubepods/pod%s/%s\n", p.UID, id)
			if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
				t.Fatal(err)
			}
			procs[gpu] = append(procs[gpu], nvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: m << 20})
		}
	}
	pod := func(name string, rec *api.PodAllocation) *corev1.Pod {
		b := fixtures.MakePod().Namespace("t").Name(name).UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", len(all)+1)).Node("n")
		if rec != nil {
			b.Record(rec)
		}
		return b.Obj()
	}
	grant := func(uuid string, mib int64, exclusive bool) *api.PodAllocation {
		cores := 10
		if exclusive {
			cores = 100
		}
		return &api.PodAllocation{Node: "n", Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: uuid, MemoryMiB: mib, Cores: cores, Exclusive: exclusive}}}}}
	}
	run(pod("within", grant(g0, 4096, false)), "c", g0, 2000, 2000)
	run(pod("over", grant(g0, 4096, false)), "c", g0, 4064, 4064)
	run(pod("whole", grant(g1, 40960, true)), "c", g1, 30000)
	run(pod("taker", nil), "c", g0, 2048)
	procs[g1] = append(procs[g1], nvml.ProcessInfo{Pid: 99999, UsedGpuMemory: 100 << 20}) // no /proc entry: no container
	claimPod := func(name string) *corev1.Pod {
		p := pod(name, nil)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new("shared")}}
		p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}
		return p
	}
	run(claimPod("claim-a"), "c", g1, 1000)
	run(claimPod("claim-b"), "c", g1, 1000)
	claims := claimsOn([]allocated{{"t", "shared", []kubeobj.ClaimDevice{{Request: "gpu", Pool: "n", Device: "gpu-1", MemoryMiB: 2048}}}},
		"n", map[string]string{"gpu-0": g0, "gpu-1": g1})

	var devs []discovery.Device
	for _, u := range []string{g0, g1} {
		devs = append(devs, discovery.Device{GPU: api.GPU{UUID: u, MemoryMiB: 40960}, Handle: &mock.Device{
			GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return procs[u], nvml.SUCCESS },
		}})
	}
	var bad []string
	var ungranted int64
	for _, h := range heldOn(devs, records, pods, grantsOn(all, claims)) {
		if msg := h.ungranted(40960); msg != "" {
			bad = append(bad, msg)
			ungranted += h.mib
		}
	}
	want := []string{
		"t/over/c holds 8128 MiB in processes [20 21], more than its grant of 4096 MiB",
		"t/taker/c holds 2048 MiB in processes [40] and its pod has no valid record",
		"a process in no container holds 100 MiB in processes [99999] and has no grant",
	}
	if len(bad) != len(want) || ungranted != 8128+2048+100 {
		t.Fatalf("held without a grant (%d MiB):\n%s", ungranted, strings.Join(bad, "\n"))
	}
	for _, w := range want {
		found := false
		for _, b := range bad {
			found = found || strings.HasPrefix(b, w)
		}
		if !found {
			t.Errorf("missing %q in\n%s", w, strings.Join(bad, "\n"))
		}
	}
	// The claim's two containers together over its 2048 MiB.
	procs[g1] = append(procs[g1], nvml.ProcessInfo{Pid: 61, UsedGpuMemory: 500 << 20})
	if err := os.MkdirAll(filepath.Join(proc, "61"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(proc, "60", "cgroup"))
	if err := os.WriteFile(filepath.Join(proc, "61", "cgroup"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, h := range heldOn(devs, records, pods, grantsOn(all, claims)) {
		if msg := h.ungranted(40960); strings.Contains(msg, "t/claim-a/c, t/claim-b/c holds 2500 MiB") {
			found = true
		}
	}
	if !found {
		t.Error("two containers sharing a claim request over its grant together were not counted")
	}
}
