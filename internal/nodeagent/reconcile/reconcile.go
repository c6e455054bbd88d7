// Package reconcile is the node agent's host-side backstop to the
// limiter. The limiter lives inside the tenant's processes: a static
// binary, raw ioctls on /dev/nvidia*, or a rewrite of the container's own
// writable state file get past it. What no tenant can touch is what the
// driver reports from the host: NVML lists, per GPU, every process with
// its used memory. The reconciler attributes each process to its
// container through /proc/<pid>/cgroup (the kubelet puts every container
// in a cgroup named after its pod UID and container ID) and compares, per
// container and GPU, what it holds with what the node agent granted it
// (the ledger the device plugin wrote on the host, or the DRA claim
// requests it uses, whose grant all their containers share). A container
// over its
// grant, or on a GPU it was not granted, is a breach: a Warning event on
// its pod, a metric, and (configurable) SIGKILL of every process in the
// container; the kubelet then restarts it under its pod's policy.
//
// The same answer goes to a container whose GPU memory is held by a
// process that never registered with the limiter, though it was given one
// (it has a limits file): a static binary, a loader that ignores
// /etc/ld.so.preload, raw ioctls, or its limiter state removed. The
// limiter's shared state lists each registered process by host pid (and
// by pid and pid namespace); a process NVML lists for the container and
// the state does not, in two passes running, is the breach. The state is
// the container's to write: a container that forges it escapes this
// check, not the grant's.
package reconcile

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/limiterstate"
	"github.com/tessera-gpu/tessera/internal/nodeagent/claimuse"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
)

// Device is the part of an NVML device the reconciler reads.
type Device interface {
	GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
	GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
}

// GPU is one GPU the reconciler watches.
type GPU struct {
	UUID      string
	MemoryMiB int64
	Handle    Device
}

// Options configure a Reconciler.
type Options struct {
	// Interval between passes (default 5s).
	Interval time.Duration
	// ProcRoot is the host's /proc (the agent runs in the host's PID
	// namespace: NVML reports host PIDs).
	ProcRoot string
	// TolerancePercent and ToleranceMiB: a container breaches its grant
	// on a GPU when it holds more than grant × (1 + percent/100) + MiB
	// (defaults 2 and 64: NVML counts allocation granularity the limiter
	// cannot see exactly).
	TolerancePercent float64
	ToleranceMiB     int64
	// Kill sends SIGKILL to every process of a breaching container.
	Kill bool
	// Exempt reports namespaces whose pods may use GPUs without a grant
	// (monitoring agents, the GPU operator); their processes are only
	// counted.
	Exempt func(namespace string) bool
	// Shared reports whether the node's grants are memory-limited (a node
	// in shared mode); otherwise only use of GPUs a container was not
	// granted is a breach.
	Shared func() bool
	// Claims lists the DRA claims the node's driver prepared: a container
	// that uses one of their requests is held to the request's grant,
	// together with every other container that uses it (claimuse.Uses).
	Claims func() []claimuse.Claim
	// Known reports whether the agent knows every source of grants: the
	// ledger the device plugin wrote, and the DRA claims its driver
	// prepared (read back from its checkpoint after a restart). Until it
	// does, a pass acts on nothing: a container whose grant the agent
	// has not read yet would be taken for one holding memory it was not
	// granted, and killed. Nil: always known.
	Known func() bool
	// BudgetDir, if set, is where each pass writes the budget file of
	// every GPU that holds a grant with a memory ceiling (burst.go); the
	// device plugin mounts it read-only into those containers.
	BudgetDir string
	// NeedPoll is how often the containers' need files are checked, with
	// BudgetDir set (need.go; default 100ms), and NeedInterval the least
	// time between two requests of one container that are answered
	// (default 500ms).
	NeedPoll, NeedInterval time.Duration
}

// DefaultExemptNamespaces are the namespaces whose pods may use GPUs
// without a grant unless the agent is told otherwise: monitoring agents
// and the GPU operator run there.
const DefaultExemptNamespaces = "kube-system,tessera-system"

// Breach is one container over its grant on one GPU.
type Breach struct {
	Pod       *v1.Pod
	Container string
	GPU       string
	UsedMiB   int64
	// GrantedMiB is the container's grant on the GPU (0: none).
	GrantedMiB int64
	PIDs       []int
	Killed     []int
	// Unregistered: the PIDs hold UsedMiB on the GPU without having
	// registered with the container's limiter.
	Unregistered bool
	// Claim is the DRA claim request ("namespace/claim/request") whose
	// grant the container shares with every other container using it;
	// UsedMiB is then what they hold together. Empty for a grant of the
	// container's own.
	Claim string
}

func (b Breach) String() string {
	if b.Unregistered {
		return fmt.Sprintf("container %s holds %d MiB on GPU %s in processes %v that never registered with its GPU limiter (a static binary, a loader that ignores /etc/ld.so.preload, or its limiter state removed): the limiter cannot hold them to the grant of %d MiB", b.Container, b.UsedMiB, b.GPU, b.PIDs, b.GrantedMiB)
	}
	if b.GrantedMiB == 0 {
		return fmt.Sprintf("container %s holds %d MiB on GPU %s, which it was not granted", b.Container, b.UsedMiB, b.GPU)
	}
	if b.Claim != "" {
		return fmt.Sprintf("the containers using DRA claim request %s (container %s among them) hold %d MiB on GPU %s, more than its grant of %d MiB", b.Claim, b.Container, b.UsedMiB, b.GPU, b.GrantedMiB)
	}
	return fmt.Sprintf("container %s holds %d MiB on GPU %s, more than its grant of %d MiB", b.Container, b.UsedMiB, b.GPU, b.GrantedMiB)
}

// Reconciler compares NVML's per-process memory with the grants.
type Reconciler struct {
	opts   Options
	gpus   []GPU
	state  statedir.Dirs
	pods   func() []*v1.Pod
	logger klog.Logger
	// Report, if set, is told of every breach (the agent's event and
	// metrics).
	Report func(Breach)
	// Observe, if set, is told what each container holds per GPU after
	// each pass (the agent's gauges).
	Observe func(pod *v1.Pod, container, gpu string, usedMiB int64)
	// kill sends a signal (tests replace it).
	kill func(pid int) error

	pass     sync.Mutex // one pass at a time (Run's, Admitted's)
	mu       sync.Mutex
	breached map[string]bool // pod UID/container/GPU breaching in the last pass
	// unregistered are the processes seen without a limiter registration
	// in the last pass (host pid → its container's pod UID): a process is
	// reported the second pass running, so one that is exiting (its slot
	// released before its context) is not.
	unregistered map[int]types.UID
	badState     map[string]bool // containers whose state was unreadable, logged once
	waitLogged   bool            // a pass skipped while grants were unknown was logged
	// Reclaimed, if set, is told of every container stopped to give a
	// guarantee its memory back (the agent's event and metric).
	Reclaimed func(Reclaim)
	// stopping are the processes of containers stopped for a reclaim, until
	// NVML no longer lists them (with pass held).
	stopping map[int]bool
	// needSources are the need files of the containers in the ledger, as
	// the last read of the grants found them (with mu held).
	needSources []needSource
	// needMu serialises ServeNeeds (taken before pass); needSeen and
	// needServed are its own.
	needMu     sync.Mutex
	needSeen   map[string]needStamp
	needServed map[string]time.Time
}

// New returns a reconciler of the GPUs against the grants in state; pods
// lists the node's pods.
func New(opts Options, gpus []GPU, state statedir.Dirs, pods func() []*v1.Pod, logger klog.Logger) *Reconciler {
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.NeedPoll <= 0 {
		opts.NeedPoll = 100 * time.Millisecond
	}
	if opts.NeedInterval <= 0 {
		opts.NeedInterval = 500 * time.Millisecond
	}
	if opts.TolerancePercent == 0 && opts.ToleranceMiB == 0 {
		opts.TolerancePercent, opts.ToleranceMiB = 2, 64
	}
	return &Reconciler{opts: opts, gpus: gpus, state: state, pods: pods, logger: logger,
		kill: func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }, breached: map[string]bool{},
		unregistered: map[int]types.UID{}, badState: map[string]bool{}, stopping: map[int]bool{},
		needSeen: map[string]needStamp{}, needServed: map[string]time.Time{}}
}

// Run reconciles every Interval until ctx ends; with BudgetDir set it
// answers the containers' need files every NeedPoll in between.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	var needs <-chan time.Time
	if r.opts.BudgetDir != "" {
		nt := time.NewTicker(r.opts.NeedPoll)
		defer nt.Stop()
		needs = nt.C
	}
	for {
		r.Once()
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-needs:
				r.ServeNeeds()
			case <-t.C:
				break wait
			}
		}
	}
}

// owner is a container, as the kubelet's cgroups name it.
type owner struct {
	pod       types.UID
	container string // container ID
}

type key struct {
	pod       types.UID
	container string // name
	gpu       string
}

// Once runs one pass and returns the breaches it found: none while the
// agent does not know every grant (Options.Known). With BudgetDir set it
// also refreshes the GPUs' budget files and reclaims borrowed memory a
// guarantee needs (burst.go).
func (r *Reconciler) Once() []Breach {
	r.pass.Lock()
	defer r.pass.Unlock()
	o, ok := r.observe()
	if !ok {
		return nil
	}
	out := r.check(o)
	r.burst(o, TriggerPass, nil)
	return out
}

// Admitted runs the budget part of a pass at once, for a container just
// served (its Allocate): a guarantee it brings to a GPU whose unguaranteed
// memory others borrowed is made good before the container starts.
// On a node where no grant may burst it reads nothing from the GPUs.
func (r *Reconciler) Admitted() {
	if r.opts.BudgetDir == "" || (r.opts.Shared != nil && !r.opts.Shared()) {
		return
	}
	r.pass.Lock()
	defer r.pass.Unlock()
	if !bursting(r.grants(r.pods())) {
		return
	}
	if o, ok := r.observe(); ok {
		r.burst(o, TriggerAdmission, nil)
	}
}

// observation is what one pass saw: the node's pods, the grants, and what
// each container holds per GPU.
type observation struct {
	pods   map[types.UID]*v1.Pod
	grants map[key]map[string]limit
	used   map[key]int64
	pids   map[key][]int
	// gpuUsed is what every process NVML lists holds, per GPU (the
	// containers', the host's and those of unknown pods).
	gpuUsed map[string]int64
}

func (r *Reconciler) observe() (observation, bool) {
	if r.opts.Known != nil && !r.opts.Known() {
		r.mu.Lock()
		logged := r.waitLogged
		r.waitLogged = true
		r.mu.Unlock()
		if !logged {
			r.logger.Info("Not checking what containers hold until the agent knows every grant (the DRA claims it prepared)")
		}
		return observation{}, false
	}
	podsByUID := map[types.UID]*v1.Pod{}
	byID := map[string]string{} // container ID → name
	pods := r.pods()
	for _, p := range pods {
		podsByUID[p.UID] = p
		for _, lists := range [][]v1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
			for _, cs := range lists {
				if _, id, ok := strings.Cut(cs.ContainerID, "://"); ok {
					byID[id] = cs.Name
				}
			}
		}
	}
	o := observation{pods: podsByUID, grants: r.grants(pods), used: map[key]int64{}, pids: map[key][]int{}, gpuUsed: map[string]int64{}}
	for _, g := range r.gpus {
		for _, pr := range processes(g.Handle) {
			o.gpuUsed[g.UUID] += int64(pr.UsedGpuMemory >> 20)
			ow, ok := r.ownerOf(int(pr.Pid))
			if !ok {
				continue // not a container's process (the host, the agent)
			}
			name, ok := byID[ow.container]
			if !ok || podsByUID[ow.pod] == nil {
				continue // a pod this node's cache does not know yet
			}
			k := key{ow.pod, name, g.UUID}
			o.used[k] += int64(pr.UsedGpuMemory >> 20)
			o.pids[k] = append(o.pids[k], int(pr.Pid))
		}
	}
	return o, true
}

// check finds the breaches of one pass.
func (r *Reconciler) check(o observation) []Breach {
	podsByUID, grants, used, pids := o.pods, o.grants, o.used, o.pids
	shared := r.opts.Shared == nil || r.opts.Shared()
	var out []Breach
	breached := map[string]bool{}
	keys := make([]key, 0, len(used))
	// What the containers sharing a DRA claim request's grant hold
	// together, per GPU.
	together := map[string]int64{}
	for k := range used {
		keys = append(keys, k)
		if l, ok := grants[key{k.pod, k.container, ""}][k.gpu]; ok && l.group != "" {
			together[l.group+"|"+k.gpu] += used[k]
		}
	}
	sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
	for _, k := range keys {
		pod := podsByUID[k.pod]
		if r.Observe != nil {
			r.Observe(pod, k.container, k.gpu, used[k])
		}
		g, granted := grants[key{k.pod, k.container, ""}]
		if !granted && r.opts.Exempt != nil && r.opts.Exempt(pod.Namespace) {
			continue
		}
		limit, onGPU := g[k.gpu]
		if !shared || limit.exclusive {
			if onGPU {
				continue // a whole GPU, or no memory limits on this node
			}
		}
		held := used[k]
		if onGPU && limit.group != "" {
			held = together[limit.group+"|"+k.gpu]
		}
		allowed := int64(float64(limit.most())*(1+r.opts.TolerancePercent/100)) + r.opts.ToleranceMiB
		if onGPU && held <= allowed {
			continue
		}
		b := Breach{Pod: pod, Container: k.container, GPU: k.gpu, UsedMiB: held, PIDs: pids[k]}
		if onGPU {
			b.GrantedMiB, b.Claim = limit.mib, limit.group
		}
		if r.opts.Kill {
			b.Killed = r.killContainer(k.pod, pids[k])
		}
		id := string(k.pod) + "/" + k.container + "/" + k.gpu
		breached[id] = true
		out = append(out, b)
		r.mu.Lock()
		again := r.breached[id]
		r.mu.Unlock()
		if !again {
			r.logger.Error(nil, "GPU grant breached", "pod", klog.KObj(pod), "container", k.container, "gpu", k.gpu, "usedMiB", b.UsedMiB, "grantedMiB", b.GrantedMiB, "claim", b.Claim, "killed", b.Killed)
		}
		if r.Report != nil {
			r.Report(b)
		}
	}
	out = append(out, r.unregisteredBreaches(keys, used, pids, grants, podsByUID, breached)...)
	r.mu.Lock()
	r.breached = breached
	r.mu.Unlock()
	return out
}

// unregisteredBreaches finds, in the containers that were given the
// limiter, GPU memory held by processes that never registered with it
// (and were seen so in the previous pass too), and answers each like a
// breach: reported, and killed with Kill.
func (r *Reconciler) unregisteredBreaches(keys []key, used map[key]int64, pids map[key][]int, grants map[key]map[string]limit, pods map[types.UID]*v1.Pod, breached map[string]bool) []Breach {
	var out []Breach
	seen := map[int]types.UID{}
	regs := map[string]*registrations{} // by state file
	r.mu.Lock()
	last := r.unregistered
	r.mu.Unlock()
	for _, k := range keys {
		ck := key{k.pod, k.container, ""}
		g, granted := grants[ck]
		if !granted || !g[k.gpu].limited {
			continue
		}
		pod := pods[k.pod]
		if r.opts.Exempt != nil && r.opts.Exempt(pod.Namespace) {
			continue
		}
		l := g[k.gpu]
		reg, ok := regs[l.stateFile]
		if !ok {
			reg = r.registrations(l.stateFile)
			regs[l.stateFile] = reg
		}
		if reg == nil {
			continue // a state we cannot read (logged): only the grant holds
		}
		var bad []int
		for _, pid := range pids[k] {
			if reg.has(r.opts.ProcRoot, pid) {
				continue
			}
			seen[pid] = k.pod
			if last[pid] == k.pod {
				bad = append(bad, pid)
			}
		}
		if len(bad) == 0 {
			continue
		}
		sort.Ints(bad)
		b := Breach{Pod: pod, Container: k.container, GPU: k.gpu, UsedMiB: used[k], GrantedMiB: l.mib, PIDs: bad, Unregistered: true, Claim: l.group}
		if r.opts.Kill {
			b.Killed = r.killContainer(k.pod, pids[k])
		}
		id := string(k.pod) + "/" + k.container + "/" + k.gpu + "/unregistered"
		breached[id] = true
		r.mu.Lock()
		again := r.breached[id]
		r.mu.Unlock()
		if !again {
			r.logger.Error(nil, "GPU memory held without the limiter", "pod", klog.KObj(pod), "container", k.container, "gpu", k.gpu, "pids", bad, "usedMiB", used[k], "killed", b.Killed)
		}
		if r.Report != nil {
			r.Report(b)
		}
		out = append(out, b)
	}
	r.mu.Lock()
	r.unregistered = seen
	r.mu.Unlock()
	return out
}

// registrations are the processes a container's limiter state lists.
type registrations struct {
	host map[int32]bool
	ns   map[[2]uint64]bool // pid in its namespace, namespace inode
}

// registrations reads a container's limiter state file; a missing state
// file registers nothing (its processes never registered, or it was
// removed); nil for a file that is not the limiter's (logged once per
// file).
func (r *Reconciler) registrations(path string) *registrations {
	out := &registrations{host: map[int32]bool{}, ns: map[[2]uint64]bool{}}
	snap, err := limiterstate.ReadFile(path)
	switch {
	case os.IsNotExist(err):
		return out
	case err != nil:
		id := path
		r.mu.Lock()
		logged := r.badState[id]
		r.badState[id] = true
		r.mu.Unlock()
		if !logged {
			r.logger.Info("Container's limiter state unreadable; its processes' registrations are not checked", "state", path, "err", err)
		}
		return nil
	}
	for _, p := range snap.Processes {
		if p.HostPID > 0 {
			out.host[p.HostPID] = true
		}
		out.ns[[2]uint64{uint64(p.PID), p.PIDNamespace}] = true
	}
	return out
}

// has reports whether the host pid is registered: by its host pid, or by
// its pid in its own namespace and that namespace (before the limiter
// learnt its host pid).
func (g *registrations) has(procRoot string, pid int) bool {
	if g.host[int32(pid)] {
		return true
	}
	nspid, ns, ok := nsPID(procRoot, pid)
	return ok && g.ns[[2]uint64{uint64(nspid), ns}]
}

// nsPID reads a process's pid in its innermost pid namespace (the last
// field of NSpid in /proc/<pid>/status) and that namespace's inode
// (/proc/<pid>/ns/pid, "pid:[4026532451]").
func nsPID(procRoot string, pid int) (int, uint64, bool) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, 0, false
	}
	inner := -1
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				inner, _ = strconv.Atoi(f[len(f)-1])
			}
		}
	}
	link, err := os.Readlink(filepath.Join(procRoot, strconv.Itoa(pid), "ns", "pid"))
	if err != nil || inner <= 0 {
		return 0, 0, false
	}
	ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]"), 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return inner, ino, true
}

type limit struct {
	mib int64
	// ceiling, above mib, is the most a container that may burst holds
	// (burst.go); 0 otherwise.
	ceiling   int64
	exclusive bool
	// limited: the container was given the limiter (it has a limits
	// file), so its processes register with it, in stateFile.
	limited   bool
	stateFile string
	// group is the DRA claim request whose grant the container shares
	// ("" for a grant of its own).
	group string
	// borrower is the grant's name in the GPU budget files: the
	// container's, or its DRA claim request's (shared by its containers).
	borrower string
}

// driverHeld are the GPUs whose memory the driver holds for the
// container(s) a confirmation file names (memlimits): their processes do
// not register with the limiter for them.
func driverHeld(confirm string) map[string]bool {
	out := map[string]bool{}
	if confirm == "" {
		return out
	}
	if c, err := memlimits.ReadConfirmation(confirm); err == nil {
		for _, g := range c.Grants {
			out[g.UUID] = true
		}
	}
	return out
}

// most is what the grant lets the container hold: its ceiling, if it may
// burst, else its guarantee.
func (l limit) most() int64 { return max(l.mib, l.ceiling) }

// grants reads the ledger and the DRA claims the pods use: per pod and
// container (gpu ""), the limit on each GPU it was granted.
func (r *Reconciler) grants(pods []*v1.Pod) map[key]map[string]limit {
	out := map[key]map[string]limit{}
	shared := r.opts.Shared == nil || r.opts.Shared()
	entries, err := r.state.Entries()
	if err != nil {
		r.logger.Error(err, "Reading the grants this node served")
	}
	var needs []needSource
	defer func() {
		r.mu.Lock()
		r.needSources = needs
		r.mu.Unlock()
	}()
	for _, e := range entries {
		if e.Grant == nil {
			continue
		}
		m := map[string]limit{}
		_, err := os.Stat(r.state.LimitsFile(e.PodUID, e.Container))
		state := filepath.Join(r.state.StateDir(e.PodUID, e.Container), statedir.LimiterStateFile)
		if err == nil {
			needs = append(needs, needSource{e.PodUID, e.Container, filepath.Join(r.state.StateDir(e.PodUID, e.Container), statedir.NeedFile)})
		}
		// GPUs whose memory the driver holds for the container: its
		// processes do not register with the limiter for them.
		driver := driverHeld(r.state.ConfirmFile(e.PodUID, e.Container))
		for _, d := range e.Grant.Devices {
			// A container that may burst holds up to its ceiling (the
			// driver holds it there where it partitions the GPU; else the
			// limiter, from the GPU's budget).
			l := limit{mib: d.MemoryMiB, exclusive: d.Exclusive, limited: err == nil && !driver[d.UUID], stateFile: state,
				borrower: statedir.Borrower(e.PodUID, e.Container)}
			if d.Bursts() && shared {
				l.ceiling = d.CeilingMiB
			}
			m[d.UUID] = l
		}
		out[key{e.PodUID, e.Container, ""}] = m
	}
	if r.opts.Claims == nil {
		return out
	}
	for _, u := range claimuse.Uses(pods, r.opts.Claims()) {
		k := key{u.Pod.UID, u.Container, ""}
		m := out[k]
		if m == nil {
			m = map[string]limit{}
			out[k] = m
		}
		driver := driverHeld(u.Request.Confirm)
		for _, d := range u.Request.Devices {
			// Admin access (monitoring) consumes nothing: like a whole
			// GPU, only its use is allowed, not its memory counted.
			l := limit{mib: d.MemoryMiB, exclusive: d.Whole || d.Admin, limited: u.Request.StateFile != "" && !driver[d.UUID],
				stateFile: u.Request.StateFile, group: u.Key(), borrower: u.Request.Borrower}
			if d.CeilingMiB > d.MemoryMiB && shared {
				l.ceiling = d.CeilingMiB
			}
			m[d.UUID] = l
		}
	}
	return out
}

func processes(d Device) []nvml.ProcessInfo {
	var out []nvml.ProcessInfo
	seen := map[uint32]int{}
	for _, f := range []func() ([]nvml.ProcessInfo, nvml.Return){d.GetComputeRunningProcesses, d.GetGraphicsRunningProcesses} {
		ps, ret := f()
		if ret != nvml.SUCCESS {
			continue
		}
		for _, p := range ps {
			// A process that is both compute and graphics is listed twice
			// with the same memory.
			if i, ok := seen[p.Pid]; ok {
				out[i].UsedGpuMemory = max(out[i].UsedGpuMemory, p.UsedGpuMemory)
				continue
			}
			seen[p.Pid] = len(out)
			out = append(out, p)
		}
	}
	return out
}

// podSegment finds a pod UID in a cgroup path: "pod<uid>" with dashes
// (cgroupfs driver) or underscores (systemd driver).
var podSegment = regexp.MustCompile(`pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})`)

// containerSegment is a container ID as runtimes name its cgroup:
// cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope, or the
// bare ID (cgroupfs driver).
var containerSegment = regexp.MustCompile(`^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$`)

// ParseCgroup returns the pod UID and container ID a process's cgroup
// file (/proc/<pid>/cgroup) names, for cgroup v1 and v2 and the cgroupfs
// and systemd drivers.
func ParseCgroup(content string) (types.UID, string, bool) {
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := parts[2]
		m := podSegment.FindStringSubmatch(p)
		if m == nil {
			continue
		}
		c := containerSegment.FindStringSubmatch(filepath.Base(p))
		if c == nil {
			continue
		}
		return types.UID(strings.ReplaceAll(m[1], "_", "-")), c[1], true
	}
	return "", "", false
}

func (r *Reconciler) ownerOf(pid int) (owner, bool) {
	b, err := os.ReadFile(filepath.Join(r.opts.ProcRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return owner{}, false
	}
	uid, id, ok := ParseCgroup(string(b))
	return owner{uid, id}, ok
}

// killContainer SIGKILLs the processes NVML listed and every other
// process of the same container (found by its cgroup), so a launcher that
// would start the GPU work again goes too.
func (r *Reconciler) killContainer(pod types.UID, nvmlPIDs []int) []int {
	ids := map[string]bool{}
	for _, pid := range nvmlPIDs {
		if o, ok := r.ownerOf(pid); ok && o.pod == pod {
			ids[o.container] = true
		}
	}
	targets := map[int]bool{}
	for _, pid := range nvmlPIDs {
		targets[pid] = true
	}
	if entries, err := os.ReadDir(r.opts.ProcRoot); err == nil {
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if o, ok := r.ownerOf(pid); ok && o.pod == pod && ids[o.container] {
				targets[pid] = true
			}
		}
	}
	var killed []int
	for pid := range targets {
		if err := r.kill(pid); err == nil {
			killed = append(killed, pid)
		}
	}
	sort.Ints(killed)
	return killed
}

// Reasons of the Warning events the agent puts on a breaching pod.
const (
	ReasonOverGrant      = "TesseraGPUMemoryOverGrant"
	ReasonNotGranted     = "TesseraGPUNotGranted"
	ReasonWithoutLimiter = "TesseraGPUMemoryWithoutLimiter"
)

// Reason is the event reason of a breach.
func (b Breach) Reason() string {
	if b.Unregistered {
		return ReasonWithoutLimiter
	}
	if b.GrantedMiB == 0 {
		return ReasonNotGranted
	}
	return ReasonOverGrant
}
