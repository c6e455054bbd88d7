// Package metrics is the node agent's Prometheus exporter: per GPU (what
// is allocated on it, its health, XID count, utilisation and memory in use
// as NVML reports them) and per container holding a GPU grant (memory used
// against its limit, SM use against its share), labelled the way NVIDIA's
// DCGM exporter labels its series (gpu, UUID, device, modelName,
// Hostname; namespace, pod, container), so dashboards and alerts written
// for DCGM join with Tessera's series. A container's usage is read from
// the limiter's shared-state file (internal/limiterstate) in its state
// directory (statedir); nothing is cached between scrapes.
//
// The metric names, types and labels are documented in docs/operations.md.
package metrics

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/limiterstate"
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
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src    Source
	logger klog.Logger

	gpuMemTotal, gpuMemAlloc, gpuCoresAlloc, gpuShares, gpuMaxShares *prometheus.Desc
	gpuHealthy, gpuXID, gpuUtil, gpuMemUsed                          *prometheus.Desc
	ctrMemUsed, ctrMemLimit, ctrSMShare, ctrSMUtil, ctrProcs         *prometheus.Desc
	ctrReclaimed, stateErrors                                        *prometheus.Desc

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
		stateErrors:   prometheus.NewDesc("tessera_node_agent_state_read_errors_total", "Limiter state files that could not be read at a scrape (malformed, wrong version).", []string{"Hostname"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gpuMemTotal, c.gpuMemAlloc, c.gpuCoresAlloc, c.gpuShares, c.gpuMaxShares,
		c.gpuHealthy, c.gpuXID, c.gpuUtil, c.gpuMemUsed, c.ctrMemUsed, c.ctrMemLimit, c.ctrSMShare, c.ctrSMUtil,
		c.ctrProcs, c.ctrReclaimed, c.stateErrors} {
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
	type ctr struct {
		pod *v1.Pod
		ca  api.ContainerAllocation
	}
	var ctrs []ctr
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
			if !ca.Init && len(ca.Devices) > 0 {
				ctrs = append(ctrs, ctr{p, ca})
			}
		}
	}
	sort.Slice(ctrs, func(i, j int) bool {
		a, b := ctrs[i], ctrs[j]
		if kubeobj.Key(a.pod) != kubeobj.Key(b.pod) {
			return kubeobj.Key(a.pod) < kubeobj.Key(b.pod)
		}
		return a.ca.Name < b.ca.Name
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
	for _, ct := range ctrs {
		st, err := limiterstate.ReadFile(filepath.Join(c.src.State.StateDir(ct.pod.UID, ct.ca.Name), statedir.LimiterStateFile))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				fails++
				c.logger.V(2).Info("Limiter state not readable", "pod", kubeobj.Key(ct.pod), "container", ct.ca.Name, "err", err)
			}
			st = nil
		}
		for i, d := range ct.ca.Devices {
			base, ok := labels[d.UUID]
			if !ok {
				continue // a GPU the inventory no longer lists
			}
			profile := ""
			if d.MIG != nil {
				profile = d.MIG.Profile
			}
			l := append(append([]string{}, base...), ct.pod.Namespace, ct.pod.Name, ct.ca.Name, "", profile)
			limit := d.MemoryMiB * MiB
			if d.Exclusive && d.MIG == nil {
				limit = byUUID[d.UUID].MemoryMiB * MiB
			}
			share := d.Cores
			if d.Exclusive {
				share = gpushare.FullCores
			}
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
			gauge(c.ctrMemUsed, float64(used), l)
			gauge(c.ctrMemLimit, float64(limit), l)
			gauge(c.ctrSMShare, float64(share), l)
			gauge(c.ctrProcs, float64(procs), l)
			if per, ok := procSM[d.UUID]; ok {
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
