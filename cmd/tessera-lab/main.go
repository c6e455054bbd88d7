// Command tessera-lab is Tessera's emulated GPU cluster: a real
// kube-apiserver, controller manager, Tessera scheduler and webhook, and
// hollow kubelets with real Tessera node agents over mock NVML, all on
// this machine, with no GPU. It is a separate binary from tessera because
// it carries the whole control plane.
//
//	tessera-lab up [--nodes N] [--gpus-per-node K] [--gpu-model M]
//	tessera-lab status | down | demo
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/cli"
	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/component"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/nvmlemu"
	"github.com/tessera-gpu/tessera/internal/lab/status"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
)

var errUsage = cli.ErrUsage

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == component.Command {
		os.Exit(runComponent(args[1:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usageText = `tessera-lab: an emulated GPU cluster with Tessera, on this machine, with no GPU.

Usage:
  tessera-lab up      [--nodes N] [--gpus-per-node K] [--gpu-model MODEL] [--node-groups SPEC]
                      [--sharing-nodes=false] [--node-config FILE] [--tools DIR] [--dir DIR]
                      [--volcano [--volcano-dir DIR]]
                      start the cluster and keep it running until Ctrl-C: N fractional nodes
                      (default 1) and one node of every other mode; --volcano also runs
                      Volcano's scheduler and controller manager and a node of mode volcano
  tessera-lab status  [--dir DIR]   per node and GPU: mode, model, memory and cores allocated,
                      memory in use, pods; the invariant checker and the physical check
                      (GPU memory held without a valid grant)
  tessera-lab demo    [flags of up] start a cluster (default 1xA100-40GB:8,1xH100-80GB:8 and one
                      node of every other mode), apply examples/, run the demo workloads, show
                      what the limiter and the shared GPUs enforce, stop
  tessera-lab down    [--dir DIR]   stop the cluster and remove its state directory

--node-groups: COUNTxMODEL:GPUS[@MODE],… e.g. 2xA100-40GB:8,1xH100-80GB:4@time-slicing
Modes: %s
GPU models: %s
`

func usage(w io.Writer) {
	var names []string
	for _, m := range modes.All() {
		names = append(names, m.Name+" ("+m.Summary+")")
	}
	fmt.Fprintf(w, usageText, strings.Join(names, "; "), strings.Join(nvmlemu.ModelNames(), ", "))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"up": runUp, "demo": runDemo, "status": runStatus, "down": runDown,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "tessera-lab: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return cli.ExitCode(stderr, "tessera-lab", args[0], cmd(ctx, args[1:], stdout, stderr))
}

// labFlags are the flags of up and demo.
type labFlags struct {
	dir    *string
	nodes  *int
	gpus   *int
	model  *string
	groups *string
	tools  *string
	// sharing adds modes.SharingNodes.
	sharing    *bool
	nodeConfig *string
	// volcano runs Volcano's scheduler and controller manager (from
	// volcanoDir) and adds a node of mode volcano.
	volcano    *bool
	volcanoDir *string
}

func addLabFlags(fs *flag.FlagSet, defaultDir string, defaultNodes int) labFlags {
	return labFlags{
		dir:        fs.String("dir", defaultDir, "state directory (kubeconfig, logs, etcd data)"),
		nodes:      fs.Int("nodes", defaultNodes, "emulated GPU nodes"),
		gpus:       fs.Int("gpus-per-node", 8, "GPUs per node"),
		model:      fs.String("gpu-model", "A100-40GB", "GPU model of every node: "+strings.Join(nvmlemu.ModelNames(), ", ")),
		groups:     fs.String("node-groups", "", `heterogeneous nodes instead of --nodes/--gpu-model, e.g. "2xA100-40GB:8,1xH100-80GB:4"`),
		tools:      fs.String("tools", tools.Default(), "the containers' tools (make lab-tools builds them)"),
		sharing:    fs.Bool("sharing-nodes", true, "also start one node of every other mode: "+modeList()),
		nodeConfig: fs.String("node-config", "", "a ConfigMap manifest of node agent profiles (as deploy/node-agent/configmap.yaml) added to the lab's; label a node tessera.io/node-config=PROFILE to use one"),
		volcano:    fs.Bool("volcano", false, "also run Volcano's scheduler and controller manager and a node of mode volcano (docs/volcano.md)"),
		volcanoDir: fs.String("volcano-dir", filepath.Join(filepath.Dir(tools.Default()), "volcano"), "Volcano's binaries and CRDs (make volcano builds them)"),
	}
}

func (f labFlags) config(stdout io.Writer) (lab.Config, error) {
	var nodes []modes.NodeSpec
	var err error
	if *f.groups != "" {
		nodes, err = modes.ParseNodes(*f.groups)
	} else {
		nodes, err = modes.Uniform(*f.nodes, *f.gpus, *f.model)
	}
	if err != nil {
		return lab.Config{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	if *f.sharing {
		nodes = append(nodes, modes.SharingNodes()...)
	}
	var volcano lab.VolcanoBinaries
	if *f.volcano {
		if volcano, err = volcanoBinaries(*f.volcanoDir); err != nil {
			return lab.Config{}, err
		}
		nodes = withVolcanoNode(nodes)
	}
	if err := modes.Validate(nodes); err != nil {
		return lab.Config{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	var profiles map[string]string
	if *f.nodeConfig != "" {
		if profiles, err = modes.ReadNodeConfig(*f.nodeConfig); err != nil {
			return lab.Config{}, fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return lab.Config{}, err
	}
	toolsDir, err := filepath.Abs(*f.tools)
	if err != nil {
		return lab.Config{}, err
	}
	return lab.Config{Dir: labdir.Dir(*f.dir), Nodes: nodes, Exe: exe, Tools: tools.Dir(toolsDir), NodeConfig: profiles, Out: stdout, Volcano: volcano}, nil
}

// volcanoBinaries is --volcano-dir, absolute and complete.
func volcanoBinaries(dir string) (lab.VolcanoBinaries, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	v := lab.VolcanoBinaries(abs)
	return v, v.Check()
}

// withVolcanoNode adds the volcano mode's node unless a node of the mode
// is there already (--node-groups …@volcano).
func withVolcanoNode(nodes []modes.NodeSpec) []modes.NodeSpec {
	for _, n := range nodes {
		if n.Mode == "volcano" {
			return nodes
		}
	}
	m, err := modes.Named("volcano")
	if err != nil {
		return nodes
	}
	return append(nodes, m.Spec(m.Node, m.Model, m.GPUs))
}

// modeList names the modes besides the default one, with their nodes.
func modeList() string {
	var out []string
	for _, m := range modes.All()[1:] {
		out = append(out, fmt.Sprintf("%s (%s, %dx%s)", m.Name, m.Node, m.GPUs, m.Model))
	}
	return strings.Join(out, ", ")
}

func parse(fs *flag.FlagSet, args []string) error { return cli.ParseFlags(fs, args) }

func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := addLabFlags(fs, labdir.Default(), 1)
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := f.config(stdout)
	if err != nil {
		return err
	}
	quietKlog()
	return lab.Up(ctx, cfg, func(st *lab.State, _ kubernetes.Interface) {
		fmt.Fprintf(stdout, "\nTessera lab is up: %d emulated GPU nodes. Press Ctrl-C to stop it.\n\n", len(st.Nodes))
		for _, n := range st.Nodes {
			fmt.Fprintf(stdout, "  %-20s %-13s %dx %s\n", n.Name, n.Mode, n.GPUs, n.Model)
		}
		fmt.Fprintf(stdout, `
  export KUBECONFIG=%s
  kubectl get nodes -L %s
  kubectl apply -f examples/
  tessera-lab status%s

Logs: %s
`, st.Kubeconfig, modes.Label, dirFlag(*f.dir), cfg.Dir.Logs())
	})
}

// dirFlag repeats --dir in printed commands when it is not the default.
func dirFlag(dir string) string {
	if dir == labdir.Default() {
		return ""
	}
	return " --dir " + dir
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := addLabFlags(fs, "", 3)
	keep := fs.Bool("keep", false, "keep the state directory (logs) afterwards")
	if err := parse(fs, args); err != nil {
		return err
	}
	// Unless told otherwise, the demo shows two GPU models side by side.
	uniform := false
	fs.Visit(func(fl *flag.Flag) {
		uniform = uniform || fl.Name == "nodes" || fl.Name == "gpu-model" || fl.Name == "gpus-per-node"
	})
	if *f.groups == "" && !uniform {
		*f.groups = "1xA100-40GB:8,1xH100-80GB:8"
	}
	if *f.dir == "" {
		tmp, err := os.MkdirTemp("", "tessera-lab-demo-")
		if err != nil {
			return err
		}
		*f.dir = tmp
	}
	cfg, err := f.config(stdout)
	if err != nil {
		return err
	}
	quietKlog()
	start := time.Now()
	err = lab.Demo(ctx, cfg)
	if err != nil || *keep {
		fmt.Fprintf(stdout, "state and logs kept in %s (remove with `tessera-lab down --dir %s`)\n", cfg.Dir, cfg.Dir)
	} else if rmErr := os.RemoveAll(string(cfg.Dir)); rmErr != nil {
		return rmErr
	}
	if err == nil {
		fmt.Fprintf(stdout, "\ndemo done in %.1fs\n", time.Since(start).Seconds())
	}
	return err
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", labdir.Default(), "state directory")
	if err := parse(fs, args); err != nil {
		return err
	}
	d := labdir.Dir(*dir)
	st, err := lab.ReadState(d)
	if err != nil {
		return err
	}
	if !st.Alive() {
		return fmt.Errorf("the lab in %s is not running (start it with `tessera-lab up%s`)", d, dirFlag(*dir))
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	r, err := status.Collect(ctx, client)
	if err != nil {
		return err
	}
	r.AddUsage(d)
	fmt.Fprintf(stdout, "lab %s: API server %s, up %s\n", d, st.APIServer, time.Since(st.Started).Round(time.Second))
	for _, name := range sortedKeys(st.Components) {
		if c := st.Components[name]; c.Restarts > 0 {
			fmt.Fprintf(stdout, "  %s restarted %d times\n", name, c.Restarts)
		}
	}
	fmt.Fprintln(stdout)
	if err := r.Print(stdout); err != nil {
		return err
	}
	ph, err := status.CheckPhysical(ctx, client, d, st.Nodes)
	if err != nil {
		return err
	}
	ph.Print(stdout)
	return nil
}

func runDown(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("down", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", labdir.Default(), "state directory")
	if err := parse(fs, args); err != nil {
		return err
	}
	d := labdir.Dir(*dir)
	if _, err := os.Stat(*dir); os.IsNotExist(err) {
		fmt.Fprintf(stdout, "no lab in %s\n", d)
		return nil
	}
	if err := lab.Stop(ctx, d, time.Minute); err != nil {
		return err
	}
	if err := os.RemoveAll(*dir); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lab stopped; removed %s\n", d)
	return nil
}

func runComponent(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "tessera-lab component: name missing")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := component.Run(ctx, args[0], args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "tessera-lab component %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func quietKlog() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", "0")
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
