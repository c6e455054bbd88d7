package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Report is the cluster's GPU allocation as the API server holds it: the
// nodes' inventories and the allocation records of the pods bound to them.
type Report struct {
	Nodes []NodeReport
	// Pending are GPU pods not (yet) bound, with the scheduler's reason.
	Pending []PendingPod
	// Invariant is the placement core's checker over every record: nil
	// when no GPU is over its memory, cores or shares (a record that does
	// not decode breaks it too).
	Invariant error
	// Inventory names the nodes whose inventory annotation does not
	// decode; like the scheduler, the report sees no GPUs on them.
	Inventory error
}

// NodeReport is one node's GPUs.
type NodeReport struct {
	Name string
	// Mode is the lab mode of the node (LabelMode), "" when not a lab node.
	Mode string
	GPUs []GPUReport
}

// GPUReport is one GPU's allocation.
type GPUReport struct {
	Index              int
	UUID, Model        string
	Healthy            bool
	MemoryMiB, UsedMiB int64
	Cores, Shares      int
	MaxShares          int
	Exclusive          bool
	Pods               []string
	// InUseMiB is what the processes on the GPU hold, from its state
	// file (AddUsage): -1 when unknown.
	InUseMiB  int64
	Processes int
}

// PendingPod is a GPU pod the scheduler has not placed.
type PendingPod struct {
	Name, Reason string
}

// Collect reads the report from the API server.
func Collect(ctx context.Context, client kubernetes.Interface) (*Report, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	c := placement.NewCluster()
	r := &Report{}
	modes := map[string]string{}
	var unreadable []error
	for i := range nodes.Items {
		n := &nodes.Items[i]
		modes[n.Name] = n.Labels[LabelMode]
		inv, err := kubeobj.Inventory(n)
		if err != nil {
			unreadable = append(unreadable, err)
		}
		if inv == nil {
			continue
		}
		pn, err := placement.NewNode(n.Name, placement.Unlimited, placement.Unlimited, inv)
		if err != nil {
			unreadable = append(unreadable, fmt.Errorf("node %s: %w", n.Name, err))
			continue
		}
		c.UpsertNode(pn)
	}
	r.Inventory = errors.Join(unreadable...)
	var errs []error                // the invariant checker's findings
	podsOn := map[string][]string{} // GPU UUID → pods
	for i := range pods.Items {
		p := &pods.Items[i]
		key := kubeobj.Key(p)
		_, has := p.Annotations[api.AnnotationAllocation]
		if p.Spec.NodeName == "" {
			if p.Spec.SchedulerName == scheduler.SchedulerName && p.DeletionTimestamp == nil {
				r.Pending = append(r.Pending, PendingPod{Name: key, Reason: unschedulableReason(p)})
			}
			continue
		}
		if !has || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		rec, err := kubeobj.Record(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", key, err))
			continue
		}
		// The same checks as placement.CheckRecords, on the cluster the
		// report is read from.
		if c.Node(rec.Node) == nil {
			errs = append(errs, fmt.Errorf("pod %s: allocated on node %s, which has no inventory", key, rec.Node))
		} else if err := c.AssignRecord(key, 0, 0, rec); err != nil {
			errs = append(errs, err)
		}
		seen := map[string]bool{}
		for _, ct := range rec.Containers {
			for _, g := range ct.Devices {
				if !seen[g.UUID] {
					seen[g.UUID] = true
					podsOn[g.UUID] = append(podsOn[g.UUID], key)
				}
			}
		}
	}
	r.Invariant = errors.Join(append(errs, c.Check())...)
	for _, n := range c.Nodes() {
		nr := NodeReport{Name: n.Name, Mode: modes[n.Name]}
		for _, g := range n.GPUs {
			ps := podsOn[g.UUID]
			sort.Strings(ps)
			nr.GPUs = append(nr.GPUs, GPUReport{
				Index: g.Index, UUID: g.UUID, Model: g.Model, Healthy: g.Healthy,
				MemoryMiB: g.MemoryMiB, UsedMiB: g.Used.MemoryMiB, Cores: g.Used.Cores,
				Shares: g.Used.Shares, MaxShares: g.MaxShares, Exclusive: g.Used.Exclusive > 0, Pods: ps,
				InUseMiB: -1,
			})
		}
		r.Nodes = append(r.Nodes, nr)
	}
	sort.Slice(r.Nodes, func(i, j int) bool { return r.Nodes[i].Name < r.Nodes[j].Name })
	sort.Slice(r.Pending, func(i, j int) bool { return r.Pending[i].Name < r.Pending[j].Name })
	return r, nil
}

func unschedulableReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return "not scheduled yet"
}

// AddUsage reads what the processes hold on each GPU of the lab's nodes
// (the GPUs' state files, which the nodes' NVML reads too).
func (r *Report) AddUsage(d Dir) {
	for i := range r.Nodes {
		n := &r.Nodes[i]
		files := &fakegpu.Node{Dir: nodeDir(d.Node(n.Name)).path("gpus")}
		for j := range n.GPUs {
			g := &n.GPUs[j]
			if _, procs, err := fakegpu.Read(files.File(g.UUID)); err == nil {
				g.InUseMiB, g.Processes = 0, len(procs)
				for _, p := range procs {
					g.InUseMiB += int64(p.UsedBytes >> 20)
				}
			}
		}
	}
}

// Packing is the cluster-wide figures of a report.
type Packing struct {
	GPUs, InUse, Exclusive, Pods int
	MemoryMiB, UsedMiB           int64
	// PartlyUsed GPUs hold shares and still have memory free.
	PartlyUsed int
}

// Packing sums the report.
func (r *Report) Packing() Packing {
	var k Packing
	pods := map[string]bool{}
	for _, n := range r.Nodes {
		for _, g := range n.GPUs {
			k.GPUs++
			k.MemoryMiB += g.MemoryMiB
			k.UsedMiB += g.UsedMiB
			if len(g.Pods) > 0 {
				k.InUse++
			}
			if g.Exclusive {
				k.Exclusive++
			} else if len(g.Pods) > 0 && g.UsedMiB < g.MemoryMiB {
				k.PartlyUsed++
			}
			for _, p := range g.Pods {
				pods[p] = true
			}
		}
	}
	k.Pods = len(pods)
	return k
}

// Print writes the allocation table, the packing figures and the pending
// pods.
func (r *Report) Print(w io.Writer) error {
	usage := false
	for _, n := range r.Nodes {
		for _, g := range n.GPUs {
			usage = usage || g.InUseMiB >= 0
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if usage {
		fmt.Fprintln(tw, "NODE\tMODE\tGPU\tMODEL\tMEMORY (MiB)\tIN USE (MiB)\tCORES\tSHARES\tPODS")
	} else {
		fmt.Fprintln(tw, "NODE\tMODE\tGPU\tMODEL\tMEMORY (MiB)\tCORES\tSHARES\tPODS")
	}
	for _, n := range r.Nodes {
		mode := n.Mode
		if mode == "" {
			mode = "-"
		}
		for _, g := range n.GPUs {
			mem := fmt.Sprintf("%d/%d", g.UsedMiB, g.MemoryMiB)
			shares := fmt.Sprintf("%d/%d", g.Shares, g.MaxShares)
			if g.Exclusive {
				shares = "whole"
			}
			model := g.Model
			if !g.Healthy {
				model += " (unhealthy)"
			}
			inUse := ""
			if usage {
				inUse = "-\t"
				if g.InUseMiB >= 0 {
					inUse = fmt.Sprintf("%d (%d proc)\t", g.InUseMiB, g.Processes)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s%d%%\t%s\t%s\n", n.Name, mode, g.Index, model, mem, inUse, g.Cores, shares, podList(g.Pods))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	k := r.Packing()
	if k.GPUs > 0 && k.MemoryMiB > 0 {
		fmt.Fprintf(w, "\n%d pods on %d of %d GPUs (%d whole, %d shared and partly free); GPU memory allocated %.1f%% (%d of %d MiB)\n",
			k.Pods, k.InUse, k.GPUs, k.Exclusive, k.PartlyUsed, 100*float64(k.UsedMiB)/float64(k.MemoryMiB), k.UsedMiB, k.MemoryMiB)
	}
	if len(r.Pending) > 0 {
		fmt.Fprintf(w, "\n%d GPU pods pending:\n", len(r.Pending))
		for _, p := range r.Pending {
			fmt.Fprintf(w, "  %s: %s\n", p.Name, p.Reason)
		}
	}
	if r.Inventory != nil {
		fmt.Fprintf(w, "\nUNREADABLE INVENTORY (the scheduler sees no GPUs there): %v\n", r.Inventory)
	}
	if r.Invariant != nil {
		fmt.Fprintf(w, "\nINVARIANT BROKEN: %v\n", r.Invariant)
	} else {
		fmt.Fprintln(w, "invariant checker: no GPU over its memory, cores or shares")
	}
	return nil
}

func podList(pods []string) string {
	if len(pods) == 0 {
		return "-"
	}
	short := make([]string, len(pods))
	for i, p := range pods {
		short[i] = p
		if ns, name, ok := strings.Cut(p, "/"); ok && ns == metav1.NamespaceDefault {
			short[i] = name
		}
	}
	if len(short) > 4 {
		return fmt.Sprintf("%s +%d more", strings.Join(short[:4], ","), len(short)-4)
	}
	return strings.Join(short, ",")
}
