// Package metrics is the node agent's Prometheus exporter: per GPU (what
// is allocated on it, its health, XID count, utilisation and memory in use
// as NVML reports them) and per container holding a GPU grant (memory used
// against its limit, SM use against its share, time throttled, allocations
// refused), labelled the way NVIDIA's DCGM exporter labels its series (gpu,
// UUID, device, modelName, Hostname; namespace, pod, container), so
// dashboards and alerts written for DCGM join with Tessera's series; a
// container served through a DRA claim also carries the claim's name. A
// container's usage is read from the limiter's shared-state file
// (internal/limiterstate) in its state directory (statedir, or the claim's
// request directory for DRA); nothing is cached between scrapes.
//
// The metric names, types and labels are documented in docs/operations.md.
package metrics

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/limiterstate"
	"github.com/tessera-gpu/tessera/internal/nodeagent/claimuse"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// MiB is the byte size of the records' memory unit.
const MiB = 1 << 20

// GPULabels are the labels of every per-GPU series, DCGM's names.
var GPULabels = []string{"gpu", "UUID", "device", "modelName", "Hostname"}

// ContainerLabels are the labels of every per-container series: the GPU's,
// the pod's, and claim (the DRA ResourceClaim, "" for device-plugin
// grants) and GPU_I_PROFILE (the MIG profile, "" for shares of a GPU).
var ContainerLabels = append(append([]string{}, GPULabels...), "namespace", "pod", "container", "claim", "GPU_I_PROFILE")

// Source is what the collector reads at each scrape.
type Source struct {
	// Node is the node's name (the Hostname label).
	Node string
	// Inventory returns the inventory the agent last built (nil before
	// the first one).
	Inventory func() *api.NodeInventory
	// Handles returns the NVML handles by GPU UUID.
	Handles func() map[string]nvml.Device
	// XIDs returns the XID events counted per GPU UUID.
	XIDs func() map[string]uint64
	// Pods returns the pods bound to the node.
	Pods func() ([]*v1.Pod, error)
	// State locates the containers' limiter state directories.
	State statedir.Dirs
	// Claims returns the DRA claims prepared on the node (nil when the
	// node serves no claims).
	Claims func() []Claim
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Claim, ClaimRequest and ClaimDevice are the DRA claims prepared on the
// node (package claimuse).
type (
	Claim        = claimuse.Claim
	ClaimRequest = claimuse.Request
	ClaimDevice  = claimuse.Device
)

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src    Source
	logger klog.Logger

	gpuMemTotal, gpuMemAlloc, gpuCoresAlloc, gpuShares, gpuMaxShares *prometheus.Desc
	gpuHealthy, gpuXID, gpuUtil, gpuMemUsed                          *prometheus.Desc
	ctrMemUsed, ctrMemLimit, ctrSMShare, ctrSMUtil, ctrProcs         *prometheus.Desc
	ctrReclaimed, ctrThrottled, ctrRefused, stateErrors              *prometheus.Desc

	mu        sync.Mutex
	readFails uint64
}

// New returns a collector reading src.
func New(src Source, logger klog.Logger) *Collector {
	if src.Now == nil {
		src.Now = time.Now
	}
	g := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, GPULabels, nil)
	}
	c := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, ContainerLabels, nil)
	}
	return &Collector{
		src: src, logger: logger,
		gpuMemTotal:   g("tessera_gpu_memory_total_bytes", "Physical memory of the GPU."),
		gpuMemAlloc:   g("tessera_gpu_memory_allocated_bytes", "GPU memory granted to the pods on the node (a whole GPU counts in full)."),
		gpuCoresAlloc: g("tessera_gpu_cores_allocated_percent", "Compute granted on the GPU, in percent of its SMs (100 = the whole GPU)."),
		gpuShares:     g("tessera_gpu_shares_allocated", "Containers holding a share of the GPU (MIG devices count one each)."),
		gpuMaxShares:  g("tessera_gpu_shares_max", "Most containers that may hold a share of the GPU at once."),
		gpuHealthy:    g("tessera_gpu_healthy", "1 when the GPU is healthy and offered, 0 when it is not."),
		gpuXID:        g("tessera_gpu_xid_errors_total", "XID events seen on the GPU since the node agent started (application XIDs included)."),
		gpuUtil:       g("tessera_gpu_utilization_percent", "GPU utilisation over NVML's last sample period (DCGM_FI_DEV_GPU_UTIL)."),
		gpuMemUsed:    g("tessera_gpu_memory_used_bytes", "GPU memory in use as NVML reports it (DCGM_FI_DEV_FB_USED, in bytes)."),
		ctrMemUsed:    c("tessera_container_memory_used_bytes", "GPU memory the container's processes hold, as the limiter accounts it (0 before the container's first CUDA call)."),
		ctrMemLimit:   c("tessera_container_memory_limit_bytes", "The container's GPU memory limit on this GPU."),
		ctrSMShare:    c("tessera_container_sm_share_percent", "The container's compute share on this GPU in percent of its SMs (0: no compute limit)."),
		ctrSMUtil:     c("tessera_container_sm_utilization_percent", "SM utilisation of the container's processes on this GPU, summed over NVML's process samples of the last 10 s."),
		ctrProcs:      c("tessera_container_processes", "Live processes of the container registered with the limiter."),
		ctrReclaimed:  c("tessera_container_reclaimed_processes_total", "Processes of the container that died and whose memory the limiter reclaimed."),
		ctrThrottled:  c("tessera_container_throttled_seconds_total", "Time the limiter held back the container's kernel launches on this GPU to keep it at its compute share, summed over the launches that waited."),
		ctrRefused:    c("tessera_container_allocations_refused_total", "Allocation calls of the container on this GPU that the limiter refused with out-of-memory because of its memory limit."),
		stateErrors:   prometheus.NewDesc("tessera_node_agent_state_read_errors_total", "Limiter state files that could not be read at a scrape (malformed, wrong version).", []string{"Hostname"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gpuMemTotal, c.gpuMemAlloc, c.gpuCoresAlloc, c.gpuShares, c.gpuMaxShares,
		c.gpuHealthy, c.gpuXID, c.gpuUtil, c.gpuMemUsed, c.ctrMemUsed, c.ctrMemLimit, c.ctrSMShare, c.ctrSMUtil,
		c.ctrProcs, c.ctrReclaimed, c.ctrThrottled, c.ctrRefused, c.stateErrors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	var inv *api.NodeInventory
	if c.src.Inventory != nil {
		inv = c.src.Inventory()
	}
	if inv == nil {
		return
	}
	handles := map[string]nvml.Device{}
	if c.src.Handles != nil {
		handles = c.src.Handles()
	}
	xids := map[string]uint64{}
	if c.src.XIDs != nil {
		xids = c.src.XIDs()
	}
	var pods []*v1.Pod
	if c.src.Pods != nil {
		var err error
		if pods, err = c.src.Pods(); err != nil {
			c.logger.Error(err, "Listing the node's pods for metrics")
		}
	}
	byUUID := map[string]*api.GPU{}
	labels := map[string][]string{}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		byUUID[g.UUID] = g
		labels[g.UUID] = []string{fmt.Sprint(g.Index), g.UUID, fmt.Sprintf("nvidia%d", g.Index), g.Model, c.src.Node}
	}

	// Allocated: what the pods' records charge each GPU (gpushare, the
	// scheduler's own arithmetic).
	alloc := map[string]gpushare.Usage{}
	memCap := func(uuid string) (int64, bool) {
		g, ok := byUUID[uuid]
		if !ok {
			return 0, false
		}
		return g.MemoryMiB, true
	}
	var ctrs []target
	for _, p := range pods {
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		rec, err := kubeobj.Record(p)
		if err != nil || rec == nil {
			continue
		}
		for _, ch := range gpushare.Charges(rec, memCap) {
			u := alloc[ch.UUID]
			u.Add(ch.Usage)
			alloc[ch.UUID] = u
		}
		for _, ca := range rec.Containers {
			if ca.Init || len(ca.Devices) == 0 {
				continue
			}
			t := target{pod: p, container: ca.Name,
				stateFile: filepath.Join(c.src.State.StateDir(p.UID, ca.Name), statedir.LimiterStateFile)}
			for _, d := range ca.Devices {
				g, ok := byUUID[d.UUID]
				if !ok {
					t.devs = append(t.devs, targetDev{uuid: d.UUID}) // keeps the limiter's device index
					continue
				}
				td := targetDev{uuid: d.UUID, limit: d.MemoryMiB * MiB, share: int64(d.Cores)}
				if d.Exclusive && d.MIG == nil {
					td.limit = g.MemoryMiB * MiB
				}
				if d.Exclusive {
					td.share = gpushare.FullCores
				}
				if d.MIG != nil {
					td.profile = d.MIG.Profile
				}
				t.devs = append(t.devs, td)
			}
			ctrs = append(ctrs, t)
		}
	}
	if c.src.Claims != nil {
		claims := c.src.Claims()
		// What the prepared claims consume, once per claim however many
		// containers use it.
		for _, cl := range claims {
			for _, r := range cl.Requests {
				for _, d := range r.Devices {
					g, ok := byUUID[d.UUID]
					if !ok || d.Admin {
						continue
					}
					u := alloc[d.UUID]
					if d.Whole {
						u.Add(gpushare.Usage{MemoryMiB: g.MemoryMiB, Cores: gpushare.FullCores, Exclusive: 1})
					} else {
						u.Add(gpushare.Share(d.MemoryMiB, int(d.Cores)))
					}
					alloc[d.UUID] = u
				}
			}
		}
		ctrs = append(ctrs, claimTargets(pods, claims, byUUID)...)
	}
	sort.Slice(ctrs, func(i, j int) bool {
		a, b := ctrs[i], ctrs[j]
		if kubeobj.Key(a.pod) != kubeobj.Key(b.pod) {
			return kubeobj.Key(a.pod) < kubeobj.Key(b.pod)
		}
		if a.container != b.container {
			return a.container < b.container
		}
		return a.claim < b.claim
	})

	gauge := func(d *prometheus.Desc, v float64, l []string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l []string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	procSM := map[string]map[uint32]uint32{} // UUID → host PID → SM %
	since := uint64(c.src.Now().Add(-10 * time.Second).UnixMicro())
	for _, g := range inv.GPUs {
		l := labels[g.UUID]
		u := alloc[g.UUID]
		gauge(c.gpuMemTotal, float64(g.MemoryMiB*MiB), l)
		gauge(c.gpuMemAlloc, float64(u.MemoryMiB*MiB), l)
		gauge(c.gpuCoresAlloc, float64(u.Cores), l)
		gauge(c.gpuShares, float64(u.Shares), l)
		gauge(c.gpuMaxShares, float64(g.MaxShares), l)
		healthy := 0.0
		if g.Health == api.Healthy {
			healthy = 1
		}
		gauge(c.gpuHealthy, healthy, l)
		counter(c.gpuXID, float64(xids[g.UUID]), l)
		h := handles[g.UUID]
		if h == nil {
			continue
		}
		if ut, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
			gauge(c.gpuUtil, float64(ut.Gpu), l)
		}
		if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			gauge(c.gpuMemUsed, float64(m.Used), l)
		}
		if samples, ret := h.GetProcessUtilization(since); ret == nvml.SUCCESS {
			per := map[uint32]uint32{}
			for _, s := range samples {
				per[s.Pid] += s.SmUtil
			}
			procSM[g.UUID] = per
		}
	}

	fails := uint64(0)
	type state struct {
		snap *limiterstate.Snapshot
		// counted: the counters are known. A container without a state
		// file has made no CUDA call yet (or runs no limiter): nothing
		// throttled or refused, 0. A version-3 file (a container started
		// under the previous limiter) or an unreadable one: absent.
		counted bool
	}
	states := map[string]state{} // a shared claim's state is read once
	emitted := map[string]bool{}
	for _, ct := range ctrs {
		cs, read := states[ct.stateFile]
		if !read {
			cs.counted = true
			if ct.stateFile != "" {
				snap, err := limiterstate.ReadFile(ct.stateFile)
				switch {
				case err == nil:
					cs = state{snap, snap.HasCounters}
				case !errors.Is(err, fs.ErrNotExist):
					fails++
					cs.counted = false
					c.logger.V(2).Info("Limiter state not readable", "pod", kubeobj.Key(ct.pod), "container", ct.container, "claim", ct.claim, "err", err)
				}
			}
			states[ct.stateFile] = cs
		}
		st := cs.snap
		for i, d := range ct.devs {
			base, ok := labels[d.uuid]
			if !ok {
				continue // a GPU the inventory no longer lists
			}
			l := append(append([]string{}, base...), ct.pod.Namespace, ct.pod.Name, ct.container, ct.claim, d.profile)
			// Two grants with one label set (a container given two requests
			// of a claim on one GPU, which the DRA driver refuses to
			// prepare for it): the first only, or the scrape would fail.
			k := strings.Join(l, "\x00")
			if emitted[k] {
				continue
			}
			emitted[k] = true
			limit := d.limit
			var used uint64
			var procs int
			var pids []int32
			if st != nil && i < limiterstate.MaxDevices {
				used = st.Devices[i].Used
				if st.Devices[i].Limit > 0 {
					limit = int64(st.Devices[i].Limit)
				}
				procs = len(st.Processes)
				for _, p := range st.Processes {
					if p.HostPID > 0 {
						pids = append(pids, p.HostPID)
					}
				}
				if i == 0 { // one series per container, on its device 0
					counter(c.ctrReclaimed, float64(st.ReclaimedProcesses), l)
				}
			}
			if cs.counted {
				var throttled, refused uint64
				if st != nil && i < limiterstate.MaxDevices {
					throttled, refused = st.Devices[i].ThrottledNs, st.Devices[i].RefusedAllocations
				}
				counter(c.ctrThrottled, float64(throttled)/1e9, l)
				counter(c.ctrRefused, float64(refused), l)
			}
			gauge(c.ctrMemUsed, float64(used), l)
			gauge(c.ctrMemLimit, float64(limit), l)
			gauge(c.ctrSMShare, float64(d.share), l)
			gauge(c.ctrProcs, float64(procs), l)
			if per, ok := procSM[d.uuid]; ok {
				sm := uint32(0)
				for _, pid := range pids {
					sm += per[uint32(pid)]
				}
				gauge(c.ctrSMUtil, float64(sm), l)
			}
		}
	}
	c.mu.Lock()
	c.readFails += fails
	total := c.readFails
	c.mu.Unlock()
	counter(c.stateErrors, float64(total), []string{c.src.Node})
}

// target is one container's GPU grant to export: from an allocation record
// (claim "") or a DRA claim request.
type target struct {
	pod       *v1.Pod
	container string
	claim     string
	stateFile string // "" when no limiter state exists (whole GPUs through DRA)
	devs      []targetDev
}

type targetDev struct {
	uuid    string
	limit   int64 // bytes
	share   int64 // percent of SMs
	profile string
}

// claimTargets are the containers of pods that use the prepared claims
// (claimuse.Uses; a container that runs to completion before the others
// is not exported). A claim shared by several containers has one limiter
// state: each of them shows the claim's values.
func claimTargets(pods []*v1.Pod, claims []Claim, gpus map[string]*api.GPU) []target {
	var out []target
	for _, u := range claimuse.Uses(pods, claims) {
		if u.Init {
			continue
		}
		t := target{pod: u.Pod, container: u.Container, claim: u.Claim.Name, stateFile: u.Request.StateFile}
		for _, d := range u.Request.Devices {
			td := targetDev{uuid: d.UUID, limit: d.MemoryMiB * MiB, share: d.Cores}
			if d.Whole || d.Admin {
				td.share = gpushare.FullCores
				if g, ok := gpus[d.UUID]; ok {
					td.limit = g.MemoryMiB * MiB
				}
			}
			t.devs = append(t.devs, td)
		}
		out = append(out, t)
	}
	return out
}

// Partitioning is the metric that publishes, at each scrape, whether
// the driver partitions each GPU's memory per cgroup on node:
// tessera_node_agent_gpu_driver_memory_partitioning{UUID, Hostname} (the
// labels of the agent's GPU metrics that name the GPU and the node), 1
// where it does, else 0. now answers per GPU UUID (memlimits.Detect's
// finding at the agent's start, less GPUs put in MIG mode since).
func Partitioning(node string, now func() map[string]bool) prometheus.Collector {
	return &partitioning{node: node, now: now, desc: prometheus.NewDesc("tessera_node_agent_gpu_driver_memory_partitioning",
		"1 when the GPU's driver can partition its memory per cgroup (NVIDIA r615 or later, cgroup v2, MIG off; found at the agent's start, 0 once the GPU is in MIG mode), 0 otherwise. Where it can and the node agent runs the memory-limits hook, the driver holds the containers' GPU memory (docs/isolation.md).",
		[]string{"UUID", "Hostname"}, nil)}
}

type partitioning struct {
	node string
	now  func() map[string]bool
	desc *prometheus.Desc
}

func (p *partitioning) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

func (p *partitioning) Collect(ch chan<- prometheus.Metric) {
	for uuid, ok := range p.now() {
		v := 0.0
		if ok {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, v, uuid, p.node)
	}
}
