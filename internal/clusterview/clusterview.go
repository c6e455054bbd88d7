// Package clusterview is the cluster's GPU allocation as the API server
// holds it, read with client-go and computed with the placement core: the
// one view behind `kubectl tessera` (cmd/kubectl-tessera) and
// `tessera-lab status`.
package clusterview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
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
	Inventory error `json:"-"`
	// DRA is why DRA objects could not be read (the user may not list
	// them); the report then shows no claims (or no DRA at all).
	DRA error `json:"-"`
	// Pods are the pods holding GPUs (bound, with an allocation record,
	// not finished), sorted by namespace and name.
	Pods []PodReport `json:"pods,omitempty"`

	// cluster is the placement core's view the report was computed from
	// (Why asks it again); objs the pods read, by namespace/name.
	cluster *placement.Cluster
	objs    map[string]*corev1.Pod
	// bare are the nodes without a Tessera inventory.
	bare []string
	// dra is what was read of DRA (dra.go).
	dra *draState
}

// PodReport is one GPU pod's allocation.
type PodReport struct {
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	Node       string            `json:"node"`
	Phase      string            `json:"phase"`
	Containers []ContainerReport `json:"containers"`
}

// ContainerReport is one container's grants.
type ContainerReport struct {
	Name    string         `json:"name"`
	Init    bool           `json:"init,omitempty"`
	Devices []DeviceReport `json:"devices"`
}

// DeviceReport is one grant: the GPU's index on the node and UUID, the
// memory limit and core share (a whole GPU: its memory, 100%), the MIG
// profile for a MIG device, and the GPU's sharing mode (mps: the
// container is an MPS client).
type DeviceReport struct {
	GPU        int    `json:"gpu"`
	UUID       string `json:"uuid"`
	MemoryMiB  int64  `json:"memoryMiB"`
	Cores      int    `json:"cores"`
	Exclusive  bool   `json:"exclusive,omitempty"`
	MIGProfile string `json:"migProfile,omitempty"`
	Sharing    string `json:"sharing,omitempty"`
	// Claim is the ResourceClaim the container holds the GPU through
	// (DRA), in the pod's namespace.
	Claim string `json:"claim,omitempty"`
}

// NodeReport is one node's GPUs.
type NodeReport struct {
	Name string `json:"name"`
	// Mode is a caller's name for the node's kind (tessera-lab: its lab
	// mode), printed by Print; "" when none.
	Mode string `json:"-"`
	// Labels are the Node's labels.
	Labels map[string]string `json:"-"`
	GPUs   []GPUReport       `json:"gpus"`
}

// GPUReport is one GPU's allocation.
type GPUReport struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Model     string `json:"model"`
	Healthy   bool   `json:"healthy"`
	Sharing   string `json:"sharing"`
	MemoryMiB int64  `json:"memoryMiB"`
	UsedMiB   int64  `json:"allocatedMiB"`
	Cores     int    `json:"allocatedCores"`
	Shares    int    `json:"shares"`
	MaxShares int    `json:"maxShares"`
	Exclusive bool   `json:"exclusive,omitempty"`
	// MIGDevices are the GPU's MIG devices (profile names) when it is in
	// a MIG mode.
	MIGDevices []string `json:"migDevices,omitempty"`
	Pods       []string `json:"pods,omitempty"`
	// Claims are the DRA claims holding parts of the GPU, each once with
	// the pods that use it (also counted in Pods).
	Claims []ClaimUse `json:"claims,omitempty"`
	// InUseMiB is what the processes on the GPU hold, when a caller knows
	// it (tessera-lab reads its emulated GPUs); -1 when unknown.
	InUseMiB  int64 `json:"-"`
	Processes int   `json:"-"`
}

// PendingPod is a GPU pod the scheduler has not placed.
type PendingPod struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
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
	ds, unread, err := readDRA(ctx, client)
	if err != nil {
		return nil, err
	}
	c := placement.NewCluster()
	r := &Report{cluster: c, objs: map[string]*corev1.Pod{}, dra: ds, DRA: unread}
	var unreadable []error
	labels := map[string]map[string]string{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		labels[n.Name] = n.Labels
		inv, err := kubeobj.Inventory(n)
		if err != nil {
			unreadable = append(unreadable, err)
		}
		if inv == nil {
			r.bare = append(r.bare, n.Name)
			continue
		}
		if inv.Mode == api.ModeDRA {
			ds.nodes[n.Name] = true
		}
		pn, err := placement.NewNode(n.Name, placement.Unlimited, placement.Unlimited, inv)
		if err != nil {
			unreadable = append(unreadable, fmt.Errorf("node %s: %w", n.Name, err))
			r.bare = append(r.bare, n.Name)
			continue
		}
		c.UpsertNode(pn)
	}
	// Nodes that publish Tessera devices without an inventory: their
	// GPUs as the slices describe them.
	fromSlices := ds.sliceInventories(func(node string) bool { return c.Node(node) != nil })
	for _, name := range sortedKeys(fromSlices) {
		pn, err := placement.NewNode(name, placement.Unlimited, placement.Unlimited, fromSlices[name])
		if err != nil {
			unreadable = append(unreadable, fmt.Errorf("node %s (from its ResourceSlices): %w", name, err))
			continue
		}
		c.UpsertNode(pn)
		r.bare = slices.DeleteFunc(r.bare, func(n string) bool { return n == name })
	}
	r.Inventory = errors.Join(unreadable...)
	claimUses, claimErrs := ds.assignClaims(c)
	var errs []error                // the invariant checker's findings
	podsOn := map[string][]string{} // GPU UUID → pods
	for i := range pods.Items {
		p := &pods.Items[i]
		key := kubeobj.Key(p)
		r.objs[key] = p
		_, has := p.Annotations[api.AnnotationAllocation]
		if p.Spec.NodeName == "" {
			if (p.Spec.SchedulerName == api.SchedulerName || ds.usesTesseraDRA(p)) && p.DeletionTimestamp == nil {
				r.Pending = append(r.Pending, PendingPod{Name: key, Reason: unschedulableReason(p)})
			}
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if !has {
			// A DRA pod: its devices are its claims'.
			if cs := ds.claimContainers(c, p); len(cs) > 0 {
				r.Pods = append(r.Pods, PodReport{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase), Containers: cs})
			}
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
		pr := PodReport{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase)}
		for _, ct := range rec.Containers {
			cr := ContainerReport{Name: ct.Name, Init: ct.Init}
			for _, g := range ct.Devices {
				if !seen[g.UUID] {
					seen[g.UUID] = true
					podsOn[g.UUID] = append(podsOn[g.UUID], key)
				}
				cr.Devices = append(cr.Devices, deviceReport(c.Node(rec.Node), g))
			}
			pr.Containers = append(pr.Containers, cr)
		}
		r.Pods = append(r.Pods, pr)
	}
	sort.Slice(r.Pods, func(i, j int) bool {
		a, b := r.Pods[i], r.Pods[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	r.Invariant = errors.Join(append(append(errs, claimErrs...), c.Check())...)
	for _, n := range c.Nodes() {
		nr := NodeReport{Name: n.Name, Labels: labels[n.Name]}
		for _, g := range n.GPUs {
			ps := podsOn[g.UUID]
			for _, u := range claimUses[g.UUID] {
				for _, p := range u.Pods {
					if !slices.Contains(ps, p) {
						ps = append(ps, p)
					}
				}
			}
			sort.Strings(ps)
			gr := GPUReport{
				Index: g.Index, UUID: g.UUID, Model: g.Model, Healthy: g.Healthy, Sharing: string(g.Sharing),
				MemoryMiB: g.MemoryMiB, UsedMiB: g.Used.MemoryMiB, Cores: g.Used.Cores,
				Shares: g.Used.Shares, MaxShares: g.MaxShares, Exclusive: g.Used.Exclusive > 0, Pods: ps, Claims: claimUses[g.UUID],
				InUseMiB: -1,
			}
			if g.MIG != nil {
				for _, in := range g.MIG.Instances() {
					gr.MIGDevices = append(gr.MIGDevices, in.String())
				}
			}
			nr.GPUs = append(nr.GPUs, gr)
		}
		r.Nodes = append(r.Nodes, nr)
	}
	sort.Slice(r.Nodes, func(i, j int) bool { return r.Nodes[i].Name < r.Nodes[j].Name })
	sort.Slice(r.Pending, func(i, j int) bool { return r.Pending[i].Name < r.Pending[j].Name })
	return r, nil
}

// deviceReport describes one grant on node n (nil: a node without
// inventory; the GPU index is then -1).
func deviceReport(n *placement.Node, g api.DeviceGrant) DeviceReport {
	d := DeviceReport{GPU: -1, UUID: g.UUID, MemoryMiB: g.MemoryMiB, Cores: g.Cores, Exclusive: g.Exclusive}
	if g.MIG != nil {
		d.MIGProfile = g.MIG.Profile
	}
	if n != nil {
		for _, gpu := range n.GPUs {
			if gpu.UUID == g.UUID {
				d.GPU, d.Sharing = gpu.Index, string(gpu.Sharing)
				if g.Exclusive && g.MIG == nil {
					d.MemoryMiB, d.Cores = gpu.MemoryMiB, 100
				}
			}
		}
	}
	return d
}

func unschedulableReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return "not scheduled yet"
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

// Print writes the allocation table (with the nodes' Mode, and the memory
// in use where known), the packing figures and the pending pods: what
// `tessera-lab status` prints.
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
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s%d%%\t%s\t%s\n", n.Name, mode, g.Index, model, mem, inUse, g.Cores, shares, holders(g, false))
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
	if r.DRA != nil {
		fmt.Fprintf(w, "\nDRA CLAIMS NOT SHOWN: %v\n", r.DRA)
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

// shortNames drops the default namespace from namespace/name keys.
func shortNames(keys []string) []string {
	short := make([]string, len(keys))
	for i, p := range keys {
		short[i] = p
		if ns, name, ok := strings.Cut(p, "/"); ok && ns == metav1.NamespaceDefault {
			short[i] = name
		}
	}
	return short
}

// capList joins items, the first max of them when max > 0.
func capList(items []string, max int) string {
	if max > 0 && len(items) > max {
		return fmt.Sprintf("%s +%d more", strings.Join(items[:max], ","), len(items)-max)
	}
	return strings.Join(items, ",")
}

// holders is what holds a GPU: its pods with allocation records, then
// each DRA claim once, with the pods that use it ("claim ml/shared
// (ml/a,ml/b)"); the first 4 and without the default namespace, unless
// all.
func holders(g GPUReport, all bool) string {
	inClaim := map[string]bool{}
	for _, u := range g.Claims {
		for _, p := range u.Pods {
			inClaim[p] = true
		}
	}
	var items []string
	for _, p := range g.Pods {
		if !inClaim[p] {
			items = append(items, p)
		}
	}
	short := shortNames
	if all {
		short = func(keys []string) []string { return keys }
	}
	items = short(items)
	for _, u := range g.Claims {
		pods := "no pod"
		if len(u.Pods) > 0 {
			pods = strings.Join(short(u.Pods), ",")
		}
		items = append(items, fmt.Sprintf("claim %s (%s)", short([]string{u.Claim})[0], pods))
	}
	if len(items) == 0 {
		return "-"
	}
	if all {
		return capList(items, 0)
	}
	return capList(items, 4)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
