package lab

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/nodeagent"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ComponentCommand is the hidden subcommand under which the supervisor
// starts each component: tessera-lab component <name> [flags].
const ComponentCommand = "component"

// RunComponent runs one component in this process until it is signalled.
func RunComponent(ctx context.Context, name string, args []string) error {
	switch name {
	case "kube-apiserver":
		cmd := apiserverapp.NewAPIServerCommand()
		cmd.SetArgs(args)
		return cmd.Execute()
	case "kube-controller-manager":
		cmd := kcmapp.NewControllerManagerCommand()
		cmd.SetArgs(args)
		return cmd.Execute()
	case "scheduler":
		cmd := scheduler.NewCommand()
		cmd.SetArgs(args)
		return cmd.Execute()
	case "webhook":
		return runWebhook(ctx, args)
	case "kubelet":
		return runKubelet(ctx, args)
	case "runtime":
		return runRuntime(ctx, args)
	case "node-agent":
		return runNodeAgent(ctx, args)
	case "kubelet-shim":
		return runKubeletShim(ctx, args)
	case MPSControlComponent:
		return runMPSControl(args)
	}
	return fmt.Errorf("unknown component %q", name)
}

func clientFrom(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	return kubernetes.NewForConfig(cfg)
}

func runWebhook(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	client, err := clientFrom(*kubeconfig)
	if err != nil {
		return err
	}
	return webhook.Run(ctx, webhook.Options{
		Client: client, Names: api.DefaultResourceNames, SchedulerName: api.SchedulerName,
		Listen: *listen, Hosts: []string{"127.0.0.1"},
		// A CA kept in a Secret: a restarted webhook keeps its trust.
		CASecretNamespace: systemNamespace, CASecretName: "tessera-webhook-ca",
		Register: true, Registration: webhook.Registration{Name: "tessera-webhook", ExcludeNamespaces: []string{"kube-system", systemNamespace}},
	})
}

// nodeFlags are the flags of the per-node components.
type nodeFlags struct {
	kubeconfig, node, dir, model, lab, tools string
	gpus, port                               int
	shim                                     bool // the agent serves a kubelet shim
	labels, taints, configMap                string
	// dra runs the kubelet's DRA manager (the dra mode's nodes).
	dra bool
}

func parseNodeFlags(name string, args []string) (*nodeFlags, error) {
	f := &nodeFlags{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig")
	fs.StringVar(&f.node, "node", "", "node name")
	fs.StringVar(&f.dir, "dir", "", "the node's directory")
	fs.StringVar(&f.model, "model", "", "GPU model")
	fs.IntVar(&f.gpus, "gpus", 0, "GPUs")
	fs.IntVar(&f.port, "port", 0, "kubelet port")
	fs.BoolVar(&f.shim, "shim", false, "node agent: serve the kubelet shim's socket instead of registering")
	fs.StringVar(&f.lab, "lab", "", "the lab's state directory")
	fs.StringVar(&f.tools, "tools", "", "the lab's container tools")
	fs.StringVar(&f.labels, "labels", "", "node labels k=v,…")
	fs.StringVar(&f.taints, "taints", "", "node taints k=v:Effect,…")
	fs.StringVar(&f.configMap, "config-map", "", "the node agent's profiles, namespace/name")
	fs.BoolVar(&f.dra, "dra", false, "kubelet: run the kubelet's DRA manager and plugin registration")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if f.node == "" || f.dir == "" || f.kubeconfig == "" {
		return nil, fmt.Errorf("%s: --node, --dir and --kubeconfig are required", name)
	}
	return f, nil
}

// kubeletRoot is where a hollow kubelet's device manager listens; the
// node's directory is bind-mounted there in the kubelet's own mount
// namespace.
const kubeletRoot = "/var/lib/kubelet"

func runKubelet(ctx context.Context, args []string) error {
	f, err := parseNodeFlags("kubelet", args)
	if err != nil {
		return err
	}
	if err := mountKubeletRoot(filepath.Join(f.dir, "kubelet")); err != nil {
		return err
	}
	client, err := clientFrom(f.kubeconfig)
	if err != nil {
		return err
	}
	nd := nodeDir(f.dir)
	// The runtime (its own component) may not serve yet.
	if err := waitUntil(ctx, time.Minute, func(context.Context) (bool, error) {
		_, err := os.Stat(nd.criSocket())
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("container runtime not serving on %s: %w", nd.criSocket(), err)
	}
	labels, taints, err := nodeMeta(f)
	if err != nil {
		return err
	}
	cert, key, err := kubeletServing(Dir(f.lab).path("pki"), nd.path("pki"), f.node)
	if err != nil {
		return fmt.Errorf("kubelet serving certificate: %w", err)
	}
	err = hollowkubelet.Run(ctx, hollowkubelet.Options{
		NodeName: f.node, Client: client, RootDir: kubeletRoot, Port: f.port, MaxPods: 250,
		Cores: 64, MemoryBytes: 512 << 30,
		Labels:          labels,
		Taints:          taints,
		RuntimeEndpoint: "unix://" + nd.criSocket(),
		PodLogsDir:      nd.path("pod-logs"),
		DRA:             f.dra,
		Serving:         hollowkubelet.Serving{CertFile: cert, KeyFile: key, ClientCAFile: Dir(f.lab).path("pki", "ca.crt")},
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// runRuntime is a node's container runtime: it serves the kubelet's CRI
// on the node's socket and runs the containers as processes (package
// hollowkubelet), in the node's mount namespace, so the kubelet's mounts
// resolve. It outlives a restart of the kubelet, as containerd does.
func runRuntime(ctx context.Context, args []string) error {
	f, err := parseNodeFlags("runtime", args)
	if err != nil {
		return err
	}
	if err := mountKubeletRoot(filepath.Join(f.dir, "kubelet")); err != nil {
		return err
	}
	tools := Tools(f.tools)
	if err := tools.Check(); err != nil {
		return err
	}
	nd := nodeDir(f.dir)
	logger := klog.FromContext(ctx).WithName("runtime")
	containers := nd.path("containers")
	for _, d := range []string{containers, nd.path("run"), nd.path("pod-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// What the previous runtime left: its containers died with it.
	if err := os.RemoveAll(nd.path("run")); err != nil {
		return err
	}
	gpus, err := newNodeGPUs(nd.path("gpus"), f.node, f.model, f.gpus)
	if err != nil {
		return err
	}
	client, err := clientFrom(f.kubeconfig)
	if err != nil {
		return err
	}
	gpus.mig = migFromInventory(client, f.node, 30*time.Second)
	driver, err := gpus.files.ListenDriver()
	if err != nil {
		return err
	}
	driverErr := make(chan error, 1)
	go func() { driverErr <- fakegpu.ServeDriver(ctx, driver) }()
	record := func(c hollowkubelet.Container) {
		b, err := json.MarshalIndent(c, "", "  ")
		if err == nil {
			err = atomicfile.Write(filepath.Join(containers, recordName(c)), b, 0o644)
		}
		if err != nil {
			logger.Error(err, "Recording a container", "pod", c.Namespace+"/"+c.Pod, "container", c.Name)
		}
	}
	rt := hollowkubelet.NewRuntime(hollowkubelet.RuntimeOptions{
		Init: tools.Init(), RunDir: nd.path("run"), Hide: []string{f.lab},
		DefaultCommand: []string{containerTools + "/lab-pause"},
		DefaultEnv:     map[string]string{"PATH": containerPATH, "HOME": "/root"},
		Prepare:        labContainer(tools, gpus),
		PodResources:   filepath.Join(kubeletRoot, "pod-resources", "kubelet.sock"),
		CDIDirs:        []string{nd.cdiDir()},
		OnCreate:       record, OnUpdate: record,
		OnRemove: func(c hollowkubelet.Container) {
			path := filepath.Join(containers, recordName(c))
			if cur, err := readContainer(path); err == nil && cur.ID == c.ID {
				_ = os.Remove(path)
			}
		},
		Logger: logger,
	})
	err = rt.Serve(ctx, "unix://"+nd.criSocket())
	select {
	case derr := <-driverErr:
		return errors.Join(err, derr)
	default:
		return err
	}
}

// recordName is the file of a container's record: the latest container
// of that name in that pod.
func recordName(c hollowkubelet.Container) string {
	return c.Namespace + "_" + c.Pod + "_" + c.Name + ".json"
}

// containerTools is where a container finds the lab's tools (Tools.Bin),
// first on its PATH.
const containerTools = "/usr/local/tessera-lab/bin"

// containerPATH is the PATH of a container that sets none (an image's).
const containerPATH = containerTools + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// mountKubeletRoot makes root the kubelet's /var/lib/kubelet inside this
// process's private mount namespace (the supervisor starts the kubelet
// with CLONE_NEWNS).
func mountKubeletRoot(root string) error {
	if err := os.MkdirAll(filepath.Join(root, "device-plugins"), 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private (the kubelet needs its own mount namespace): %w", err)
	}
	if err := os.MkdirAll(kubeletRoot, 0o755); err != nil {
		// Unprivileged, with no /var/lib/kubelet to mount on: a tmpfs
		// over /var/lib provides one.
		if err := syscall.Mount("tmpfs", filepath.Dir(kubeletRoot), "tmpfs", 0, "size=16m"); err != nil {
			return fmt.Errorf("no %s to mount on: %w", kubeletRoot, err)
		}
		if err := os.MkdirAll(kubeletRoot, 0o755); err != nil {
			return err
		}
	}
	if err := syscall.Mount(root, kubeletRoot, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", root, kubeletRoot, err)
	}
	return nil
}

func runNodeAgent(ctx context.Context, args []string) error {
	f, err := parseNodeFlags("node-agent", args)
	if err != nil {
		return err
	}
	lib, err := nvmltest.NewModel(f.model, f.gpus, f.node)
	if err != nil {
		return err
	}
	// The node's NVML sees what the containers' processes do on its GPUs
	// (their state files, which the node's runtime creates).
	lib.UseUsage(&fakegpu.Node{Dir: nodeDir(f.dir).path("gpus")})
	client, err := clientFrom(f.kubeconfig)
	if err != nil {
		return err
	}
	root := filepath.Join(f.dir, "kubelet")
	paths := deviceplugin.DefaultPaths()
	paths.LimiterHost = nodeDir(f.dir).limiter()
	paths.PreloadHost = filepath.Join(f.dir, "limiter", "ld.so.preload")
	paths.StateRoot = filepath.Join(f.dir, "limiter-state")
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmNS, cmName, _ := strings.Cut(f.configMap, "/")
	opts := nodeagent.Options{
		NodeName: f.node, Resource: api.DefaultResourceNames.GPU,
		ConfigMapNamespace: cmNS, ConfigMapName: cmName,
		MPSControl:         []string{exe, ComponentCommand, MPSControlComponent},
		MPSRoot:            filepath.Join(f.dir, "mps"),
		Health:             health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: time.Minute},
		Paths:              paths,
		PluginDir:          filepath.Join(root, "device-plugins"),
		PodResourcesSocket: filepath.Join(root, "pod-resources", "kubelet.sock"),
		Resync:             30 * time.Second,
		DRA:                labDRA(f.dir),
		MetricsAddress:     "127.0.0.1:0",
	}
	trustOptions(&opts, f)
	a, err := nodeagent.New(lib, client, opts, klog.Background().WithName("node-agent"))
	if err != nil {
		return err
	}
	go publishMetricsAddress(ctx, a, nodeDir(f.dir))
	return a.Run(ctx)
}

// publishMetricsAddress writes where the agent serves its metrics into
// the node's directory (MetricsURL reads it) once it listens.
func publishMetricsAddress(ctx context.Context, a *nodeagent.Agent, n nodeDir) {
	for ctx.Err() == nil {
		if addr := a.MetricsAddr(); addr != "" {
			if err := os.WriteFile(n.path("metrics-address"), []byte(addr), 0o644); err != nil {
				klog.Background().Error(err, "Writing the node agent's metrics address")
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MetricsURL is the /metrics URL of a running lab node's agent.
func MetricsURL(d Dir, node string) (string, error) {
	b, err := os.ReadFile(nodeDir(d.Node(node)).path("metrics-address"))
	if err != nil {
		return "", fmt.Errorf("node %s: the agent's metrics address: %w", node, err)
	}
	return "http://" + strings.TrimSpace(string(b)) + "/metrics", nil
}
