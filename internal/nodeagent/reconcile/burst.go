package reconcile

// Guaranteed plus burst without the driver's per-cgroup limits. A grant
// with a memory ceiling is guaranteed its memory (MemoryMiB: what the
// scheduler charged the GPU) and may hold up to its ceiling by borrowing
// the GPU's unguaranteed memory: the GPU's memory minus the guarantees of
// every grant on it. Each pass
//
//   - writes, per GPU that holds such a grant, the budget file its
//     containers read (read-only) through their limiter: the unguaranteed
//     memory and what each borrower held past its guarantee, as NVML
//     reported it this pass (limiterconf.Budget);
//   - when the borrowers hold more than the unguaranteed memory (a new
//     guarantee came to the GPU, or two borrowers grew between passes
//     from the same budget), stops the container furthest above its
//     guarantee, then the next, until the rest fit: SIGKILL of its
//     processes, a Warning event (ReasonReclaimed) and a metric. A
//     container within its guarantee is never stopped for it.
//
// A container served by the device plugin also runs this part at once
// (Admitted), so a guarantee is made good before its container starts;
// and so does a container whose allocation within its guarantee the
// driver refused (need.go): then the borrowers are also stopped until the
// GPU has the memory it asked for free.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
)

// ReasonReclaimed is the reason of the Warning event on a pod whose
// container was stopped to give a guarantee its memory back.
const ReasonReclaimed = "TesseraGPUMemoryReclaimed"

// What made the agent reclaim (the metric's trigger label).
const (
	// TriggerAdmission: a container was served on the GPU (Admitted).
	TriggerAdmission = "admission"
	// TriggerPass: a periodic pass (Once).
	TriggerPass = "pass"
	// TriggerRefusal: the driver refused an allocation within a
	// container's guarantee and its limiter asked (need.go).
	TriggerRefusal = "refusal"
)

// Reclaim is one container stopped because the memory it borrowed past
// its guarantee was needed by a guarantee on its GPU.
type Reclaim struct {
	Pod       *v1.Pod
	Container string
	GPU       string
	// GuaranteeMiB, CeilingMiB and UsedMiB are the container's on the GPU.
	GuaranteeMiB, CeilingMiB, UsedMiB int64
	// UnguaranteedMiB is the GPU's memory no grant is guaranteed, and
	// BorrowedMiB what the borrowers held past their guarantees when the
	// container was chosen.
	UnguaranteedMiB, BorrowedMiB int64
	// Trigger is what made the agent reclaim (TriggerAdmission, …).
	Trigger string
	Killed  []int
	// Claim is the DRA claim request ("namespace/claim/request") whose
	// grant the container shares with every other container using it,
	// all stopped together; UsedMiB is then what they held together.
	// Empty for a grant of the container's own.
	Claim string
}

func (c Reclaim) String() string {
	who := fmt.Sprintf("container %s was stopped: it held", c.Container)
	if c.Claim != "" {
		who = fmt.Sprintf("container %s was stopped with the other containers using DRA claim request %s: they held", c.Container, c.Claim)
	}
	why := "the guarantees on the GPU need that memory back"
	if c.Trigger == TriggerRefusal {
		why = "the driver refused memory to a container within its guarantee on the GPU"
	}
	return fmt.Sprintf("%s %d MiB on GPU %s, %d MiB past its guarantee of %d MiB (ceiling %d MiB), "+
		"and %s (the containers bursting there held %d MiB past their guarantees, "+
		"%d MiB of the GPU is guaranteed to no one); a container within its guarantee is never stopped for it",
		who, c.UsedMiB, c.GPU, c.UsedMiB-c.GuaranteeMiB, c.GuaranteeMiB, c.CeilingMiB, why, c.BorrowedMiB, c.UnguaranteedMiB)
}

// Borrower is a container that may hold memory past its guarantee on a
// GPU, with what it holds.
type Borrower struct {
	GuaranteeMiB, UsedMiB int64
}

// Borrowed is what the borrower holds past its guarantee (0 within it).
func (b Borrower) Borrowed() int64 { return max(0, b.UsedMiB-b.GuaranteeMiB) }

// ChooseReclaims returns the indices of the borrowers to stop, furthest
// above its guarantee first, so that what the others borrow fits in the
// unguaranteed memory (plus slackMiB, NVML's granularity) and the ones
// stopped free at least needMiB (all they hold: a guarantee refused that
// much by the driver); none when both hold already. Borrowers within
// their guarantee are never chosen; ties go to the lower index.
func ChooseReclaims(unguaranteedMiB, slackMiB, needMiB int64, bs []Borrower) []int {
	var total int64
	order := make([]int, 0, len(bs))
	for i, b := range bs {
		if b.Borrowed() > 0 {
			total += b.Borrowed()
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return bs[order[a]].Borrowed() > bs[order[b]].Borrowed() })
	var out []int
	var freed int64
	for _, i := range order {
		if total <= unguaranteedMiB+slackMiB && freed >= needMiB {
			break
		}
		out = append(out, i)
		total -= bs[i].Borrowed()
		freed += bs[i].UsedMiB
	}
	return out
}

// shortfall is what a refused guarantee needs freed on a GPU (need.go).
type shortfall struct {
	gpu string
	mib int64
}

// burst writes the budget files and reclaims, from one pass's observation.
// want, if set, is a refused guarantee's shortfall on its GPU.
func (r *Reconciler) burst(o observation, trigger string, want *shortfall) {

	if r.opts.BudgetDir == "" || (r.opts.Shared != nil && !r.opts.Shared()) {
		return
	}
	// The guarantees on each GPU: every grant the node served to a pod
	// that has not ended (one per DRA claim request, which its
	// containers share), and the grants that may burst.
	guaranteed := map[string]int64{}
	groups := map[string]bool{}
	// A burster is a grant that may burst: one container's, or a DRA
	// claim request's, which its containers share (they borrow, and are
	// stopped, as one).
	type burster struct {
		keys []key
		l    limit
	}
	bursting := map[string][]*burster{}
	byGroup := map[string]*burster{}
	keys := make([]key, 0, len(o.grants))
	for k := range o.grants {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
	for _, k := range keys {
		if p := o.pods[k.pod]; p != nil && (p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed) {
			continue
		}
		for gpu, l := range o.grants[k] {
			ck := key{k.pod, k.container, gpu}
			if l.group != "" {
				if groups[l.group+"|"+gpu] {
					if b := byGroup[l.group+"|"+gpu]; b != nil {
						b.keys = append(b.keys, ck)
					}
					continue
				}
				groups[l.group+"|"+gpu] = true
			}
			guaranteed[gpu] += l.mib
			if l.ceiling > 0 {
				b := &burster{keys: []key{ck}, l: l}
				bursting[gpu] = append(bursting[gpu], b)
				if l.group != "" {
					byGroup[l.group+"|"+gpu] = b
				}
			}
		}
	}
	for _, g := range r.gpus {
		bs := bursting[g.UUID]
		if len(bs) == 0 {
			continue
		}
		unguaranteed := max(0, g.MemoryMiB-guaranteed[g.UUID])
		budget := limiterconf.Budget{UnguaranteedMiB: uint64(unguaranteed), Borrowed: map[string]uint64{}}
		var candidates []Borrower
		var who []*burster
		var stoppingMiB int64
		for _, b := range bs {
			held := Borrower{GuaranteeMiB: b.l.mib}
			var pids []int
			for _, k := range b.keys {
				held.UsedMiB += o.used[k]
				pids = append(pids, o.pids[k]...)
			}
			if held.Borrowed() > 0 {
				budget.Borrowed[b.l.borrower] = uint64(held.Borrowed())
			}
			if r.isStopping(pids) {
				stoppingMiB += held.Borrowed()
				continue
			}
			candidates = append(candidates, held)
			who = append(who, b)
		}
		r.writeBudget(g.UUID, budget)
		var borrowed int64
		for _, c := range candidates {
			borrowed += c.Borrowed()
		}
		// the stopped containers' memory is on its way back: the others
		// must fit in the unguaranteed memory without it
		var need int64
		if want != nil && want.gpu == g.UUID {
			need = want.mib
		}
		for _, i := range ChooseReclaims(unguaranteed, r.opts.ToleranceMiB, need, candidates) {
			b := who[i]
			for _, k := range b.keys {
				pod := o.pods[k.pod]
				rc := Reclaim{Pod: pod, Container: k.container, GPU: g.UUID, GuaranteeMiB: b.l.mib, CeilingMiB: b.l.ceiling,
					UsedMiB: candidates[i].UsedMiB, UnguaranteedMiB: unguaranteed, BorrowedMiB: borrowed + stoppingMiB, Trigger: trigger, Claim: b.l.group}
				rc.Killed = r.killContainer(k.pod, o.pids[k])
				for _, pid := range o.pids[k] {
					r.stopping[pid] = true
				}
				r.logger.Info("Stopped a container bursting past its GPU memory guarantee: a guarantee on its GPU needs the memory", "pod", klog.KObj(pod), "container", k.container, "claim", rc.Claim, "gpu", g.UUID,
					"usedMiB", rc.UsedMiB, "guaranteeMiB", rc.GuaranteeMiB, "ceilingMiB", rc.CeilingMiB, "unguaranteedMiB", unguaranteed, "borrowedMiB", rc.BorrowedMiB, "neededMiB", need, "trigger", trigger, "killed", rc.Killed)
				if r.Reclaimed != nil {
					r.Reclaimed(rc)
				}
			}
		}
	}
	// forget stopped processes NVML no longer lists
	listed := map[int]bool{}
	for _, ps := range o.pids {
		for _, pid := range ps {
			listed[pid] = true
		}
	}
	for pid := range r.stopping {
		if !listed[pid] {
			delete(r.stopping, pid)
		}
	}
}

// bursting reports whether any grant may burst.
func bursting(grants map[key]map[string]limit) bool {
	for _, g := range grants {
		for _, l := range g {
			if l.ceiling > 0 {
				return true
			}
		}
	}
	return false
}

// isStopping: some of the processes were stopped by an earlier reclaim.
func (r *Reconciler) isStopping(pids []int) bool {
	for _, pid := range pids {
		if r.stopping[pid] {
			return true
		}
	}
	return false
}

// writeBudget replaces a GPU's budget file (read-only for all).
func (r *Reconciler) writeBudget(gpu string, b limiterconf.Budget) {
	enc, err := limiterconf.EncodeBudget(b)
	if err == nil {
		if err = os.MkdirAll(r.opts.BudgetDir, 0o755); err == nil {
			err = atomicfile.Write(filepath.Join(r.opts.BudgetDir, gpu), enc, 0o444)
		}
	}
	if err != nil {
		r.logger.Error(err, "Writing a GPU's budget file: its containers lend nothing past their guarantees until it is written", "gpu", gpu)
	}
}
