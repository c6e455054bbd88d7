package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
	"github.com/tessera-gpu/tessera/internal/lab/status"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Namespace holds the demo's workloads.
const Namespace = "tessera-demo"

// Pods are the pods of every mode's demo, each pinned to a node of its
// mode (node selector, tolerations of the mode's taints), with the demo
// pod each must share a GPU with, if any.
func Pods(ns string) (pods []*corev1.Pod, sameGPUAs map[string]string, holds map[string]bool) {
	var out []*corev1.Pod
	sameGPUAs, holds = map[string]string{}, map[string]bool{}
	for _, m := range modes.All() {
		for _, d := range m.Demo {
			if d.SameGPUAs != "" {
				sameGPUAs[d.Name] = d.SameGPUAs
			}
			holds[d.Name] = d.Holds
			limits := corev1.ResourceList{}
			for k, v := range d.Resources {
				limits[corev1.ResourceName(k)] = resource.MustParse(v)
			}
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: d.Name, Labels: map[string]string{modes.Label: m.Name}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					NodeSelector:                  map[string]string{modes.Label: m.Name},
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "main", Image: "tessera-lab/cuda", Command: d.Command,
						Resources: corev1.ResourceRequirements{Limits: limits},
					}},
				},
			}
			for _, t := range m.Taints {
				p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOpExists, Effect: t.Effect})
			}
			out = append(out, p)
		}
	}
	return out, sameGPUAs, holds
}

// gpuPeak is the most memory a GPU held at once while the demo ran, and by
// which processes.
type gpuPeak struct {
	node, uuid string
	total      uint64
	used       uint64
	procs      []fakegpu.Process
}

// runWorkloads runs the demo pods, watching the GPUs meanwhile, and prints
// what each pod saw and what the GPUs held.
func runWorkloads(ctx context.Context, d labdir.Dir, nodes []modes.NodeSpec, client kubernetes.Interface, out io.Writer) error {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	pods, sameGPUAs, holds := Pods(Namespace)
	leaders := map[string]bool{}
	for _, first := range sameGPUAs {
		leaders[first] = true
	}
	// One at a time, each placed before the next: a pod that others
	// share a GPU with is given an idle GPU of its mode, and they the same.
	gpuOfPod := map[string]string{}
	var err error
	for _, p := range pods {
		uuid := gpuOfPod[sameGPUAs[p.Name]]
		if leaders[p.Name] {
			if uuid, err = idleGPU(ctx, client, p.Labels[modes.Label]); err != nil {
				return err
			}
		}
		if uuid != "" {
			p.Annotations = map[string]string{api.AnnotationUseGPUUUID: uuid}
		}
		if _, err := client.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("demo pod %s: %w", p.Name, err)
		}
		if gpuOfPod[p.Name], err = gpuOf(ctx, client, Namespace, p.Name); err != nil {
			return err
		}
	}
	start := time.Now()
	peaks := map[string]*gpuPeak{}
	var waiting []string
	err = poll.Until(ctx, 90*time.Second, func(ctx context.Context) (bool, error) {
		watchGPUs(d, nodes, peaks)
		waiting = waiting[:0]
		for _, p := range pods {
			cur, err := client.CoreV1().Pods(Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if cur.Status.Phase == corev1.PodSucceeded || cur.Status.Phase == corev1.PodFailed {
				continue
			}
			if holds[p.Name] && cur.Status.Phase == corev1.PodRunning {
				if log, err := client.CoreV1().Pods(Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx); err == nil && strings.Contains(string(log), "until stopped") {
					continue
				}
			}
			waiting = append(waiting, fmt.Sprintf("%s (%s)", p.Name, cur.Status.Phase))
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("demo workloads: %w: still waiting for %s", err, strings.Join(waiting, ", "))
	}
	fmt.Fprintf(out, "\nthe demo's workloads ran in %.1fs: gpu-fill allocates in 1 GiB steps until the driver refuses, then what cuMemGetInfo calls free, then 1 MiB more\n", time.Since(start).Seconds())
	byPID := map[uint32]string{}
	for _, m := range modes.All() {
		for _, dp := range m.Demo {
			p, err := client.CoreV1().Pods(Namespace).Get(ctx, dp.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if dp.Show != "" {
				fmt.Fprintf(out, "\n[%s] %s\n", m.Name, dp.Show)
			}
			if c, err := d.Node(p.Spec.NodeName).Container(p.Namespace, p.Name, "main"); err == nil && c.PID > 0 {
				byPID[uint32(c.PID)] = p.Name
			}
			logs, err := client.CoreV1().Pods(Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil {
				return fmt.Errorf("kubectl logs %s: %w", p.Name, err)
			}
			limits := []string{}
			for k, v := range dp.Resources {
				limits = append(limits, k+"="+v)
			}
			sort.Strings(limits)
			fmt.Fprintf(out, "  $ kubectl logs %s   # %s on %s, %s\n", p.Name, strings.Join(limits, " "), p.Spec.NodeName, exitOf(p))
			for _, l := range condense(string(logs)) {
				fmt.Fprintf(out, "    %s\n", l)
			}
			if g := peaks[gpuOfPod[dp.SameGPUAs]]; dp.SameGPUAs != "" && g != nil {
				var who []string
				for _, p := range g.procs {
					name := byPID[p.HostPID]
					if name == "" {
						name = fmt.Sprintf("pid %d", p.HostPID)
					}
					who = append(who, fmt.Sprintf("%s %d MiB", name, p.UsedBytes>>20))
				}
				fmt.Fprintf(out, "  the node's view of %s (its NVML, the GPU's shared state): at most %d of %d MiB in use at once: %s\n",
					g.uuid, g.used>>20, g.total>>20, strings.Join(who, " + "))
			}
		}
	}
	// The holders have held their memory while the others ran.
	for name, h := range holds {
		if h {
			_ = client.CoreV1().Pods(Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		}
	}
	return nil
}

// idleGPU is a GPU no pod holds, on a node of the mode.
func idleGPU(ctx context.Context, client kubernetes.Interface, mode string) (string, error) {
	r, err := status.Collect(ctx, client)
	if err != nil {
		return "", err
	}
	for _, n := range r.Nodes {
		for _, g := range n.GPUs {
			if n.Mode == mode && g.Healthy && len(g.Pods) == 0 {
				return g.UUID, nil
			}
		}
	}
	return "", fmt.Errorf("no idle GPU on the %s nodes for the demo's GPU-sharing pods", mode)
}

// gpuOf waits until a pod is placed and returns its first GPU: the
// record's, or "" for a pod bound with its GPUs in ResourceClaims (DRA:
// no record; the claim names the device).
func gpuOf(ctx context.Context, client kubernetes.Interface, ns, name string) (string, error) {
	uuid := ""
	err := poll.Until(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" && (p.Status.ExtendedResourceClaimStatus != nil || len(p.Status.ResourceClaimStatuses) > 0) {
			return true, nil
		}
		rec, err := kubeobj.Record(p)
		if err != nil || rec == nil {
			return false, nil
		}
		for _, c := range rec.Containers {
			for _, d := range c.Devices {
				uuid = d.UUID
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("demo pod %s placed: %w", name, err)
	}
	return uuid, nil
}

// watchGPUs records each GPU's peak use.
func watchGPUs(d labdir.Dir, nodes []modes.NodeSpec, peaks map[string]*gpuPeak) {
	for _, n := range nodes {
		files, _ := filepath.Glob(filepath.Join(d.Node(n.Name).GPUs(), "GPU-*"))
		for _, f := range files {
			g, procs, err := fakegpu.Read(f)
			if err != nil {
				continue
			}
			var used uint64
			for _, p := range procs {
				used += p.UsedBytes
			}
			cur := peaks[g.UUID]
			if cur == nil || used > cur.used || used == cur.used && len(procs) > len(cur.procs) {
				peaks[g.UUID] = &gpuPeak{node: n.Name, uuid: g.UUID, total: g.MemoryBytes, used: used, procs: procs}
			}
		}
	}
}

func exitOf(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil {
			return "exit " + fmt.Sprint(t.ExitCode)
		}
	}
	return strings.ToLower(string(p.Status.Phase))
}

var stepLine = regexp.MustCompile(`^allocated (\d+) MiB \((\d+) MiB in total\)$`)

// condense shortens gpu-fill's runs of equal steps to one line.
func condense(log string) []string {
	var out []string
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		m := stepLine.FindStringSubmatch(lines[i])
		if m == nil {
			out = append(out, lines[i])
			continue
		}
		j := i
		for j+1 < len(lines) {
			n := stepLine.FindStringSubmatch(lines[j+1])
			if n == nil || n[1] != m[1] {
				break
			}
			j++
		}
		if j == i {
			out = append(out, lines[i])
			continue
		}
		last := stepLine.FindStringSubmatch(lines[j])
		out = append(out, fmt.Sprintf("allocated %s MiB %d times (%s MiB in total)", m[1], j-i+1, last[2]))
		i = j
	}
	return out
}
