package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
	"github.com/tessera-gpu/tessera/internal/nodeagent/mps"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/preflight"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func runNodeAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := deviceplugin.DefaultPaths()
	discoverOnly := fs.Bool("discover-only", false, "print the node's GPU inventory as JSON and exit (needs NVML, not Kubernetes)")
	profile := fs.String("profile", "", "with --discover-only: a profile file (Tessera or NVIDIA time-slicing format) to apply")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	prefix := fs.String("resource-prefix", api.DefaultResourcePrefix, "prefix of the GPU resource names")
	cm := fs.String("config-map", "", `node configuration ConfigMap "namespace/name" (empty: built-in defaults)`)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster)")
	ignore := fs.String("ignore-xids", joinXIDs(health.DefaultIgnoredXIDs), "XIDs that leave a GPU healthy (application errors)")
	recovery := fs.Duration("recovery-period", 5*time.Minute, "how long an unhealthy GPU must stay error-free to be healthy again (0: never)")
	pluginDir := fs.String("plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory")
	podRes := fs.String("pod-resources-socket", deviceplugin.DefaultPodResourcesSocket, "the kubelet's pod-resources socket")
	fs.StringVar(&def.LimiterHost, "limiter-host-path", def.LimiterHost, "limiter library on the host")
	fs.StringVar(&def.LimiterContainer, "limiter-container-path", def.LimiterContainer, "where containers see the limiter library")
	fs.StringVar(&def.PreloadHost, "preload-host-path", def.PreloadHost, "ld.so.preload file the agent writes and containers get")
	fs.StringVar(&def.StateRoot, "state-root", def.StateRoot, "host directory of the per-container limiter state")
	fs.StringVar(&def.StateContainer, "state-container-path", def.StateContainer, "where containers see their state directory")
	fs.DurationVar(&def.ReclaimWait, "reclaim-wait", def.ReclaimWait, "how long a container's limiter retries an allocation within its GPU memory guarantee that the driver refused, while the agent stops a container bursting past its own guarantee on the GPU (0 to 1m; docs/isolation.md)")
	fs.StringVar(&def.BudgetHost, "budget-dir", def.BudgetHost, "host directory of the GPU budget files (memory no container is guaranteed, and who borrows it), mounted read-only into containers with a memory ceiling")
	volcanoCM := fs.String("volcano-device-config", api.VolcanoDeviceConfigNamespace+"/"+api.VolcanoDeviceConfigName, `Volcano's device configuration ConfigMap "namespace/name", whose MIG geometries a node in Volcano's mig mode reads (docs/volcano.md)`)
	recordKeys := fs.String("record-keys", recordsig.DefaultNamespace+"/"+recordsig.DefaultPublicKeys, `ConfigMap "namespace/name" with the scheduler's public keys; every record's signature is checked against them ("" : not checked, records rest on the admission policy alone)`)
	acceptUnsigned := fs.Bool("accept-unsigned-records", false, "serve records without a signature (only while upgrading from a release whose scheduler did not sign; docs/upgrading.md)")
	deviceList := fs.String("device-list-strategy", string(deviceplugin.DeviceListEnvvar), "how GPUs reach the container runtime: envvar (NVIDIA_VISIBLE_DEVICES), cdi-cri (CDI devices nvidia.com/gpu=<UUID>) or volume-mounts (docs/security.md)")
	pluginSockets := fs.String("plugin-socket-dir", "", "serve the device plugins in this directory, one socket per resource, for the kubelet shim (tessera kubelet-shim) instead of registering with the kubelet")
	reconcileEvery := fs.Duration("reconcile-interval", 5*time.Second, "how often GPU memory per container (NVML) is compared with its grant (0: never)")
	killOnBreach := fs.Bool("kill-on-breach", true, "SIGKILL the processes of a container that holds more GPU memory than granted, or uses a GPU it was not granted")
	tolerance := fs.Float64("breach-tolerance-percent", 2, "GPU memory over a grant tolerated before a breach, in percent of the grant (plus --breach-tolerance-mib)")
	toleranceMiB := fs.Int64("breach-tolerance-mib", 64, "GPU memory over a grant tolerated before a breach, in MiB (plus --breach-tolerance-percent)")
	exempt := fs.String("reconcile-exempt-namespaces", reconcile.DefaultExemptNamespaces, "namespaces whose pods may use GPUs without a grant (monitoring, the GPU operator)")
	procRoot := fs.String("proc", "/proc", "the host's /proc (the agent runs with hostPID: NVML reports host PIDs)")
	mpsControl := fs.String("mps-control", "nvidia-cuda-mps-control", "NVIDIA's MPS control program, run per GPU on nodes in mps mode")
	metricsAddr := fs.String("metrics-address", ":9402", `where Prometheus metrics are served ("host:port"; "" turns them off; docs/operations.md)`)
	mpsRoot := fs.String("mps-root", mps.DefaultRoot, "host directory of the MPS daemons' pipe and log directories (a profile's flags.mpsRoot wins)")
	driverRoot := fs.String("driver-root", "", `where the host's NVIDIA driver root is mounted: NVML is loaded from under it and the driver's programs (nvidia-cuda-mps-control) run from it ("/" on the host: a driver installed on the host; NVIDIA's driver container: its /run/nvidia/driver). Empty: NVML from the library search path, where NVIDIA's container runtime mounts it`)
	memHook := fs.String("memory-limits-hook", "", "tessera-hook on the host (install-limiter --hook-to puts it there): where the driver partitions GPU memory per cgroup (NVIDIA r615 or later, cgroup v2, MIG off), limited containers get a createContainer hook that runs its memory-limits command, and the driver holds their memory (soft = guarantee, hard = ceiling); empty: the limiter holds it everywhere (docs/isolation.md)")
	cdiDirs := fs.String("cdi-spec-dirs", strings.Join(preflight.DefaultCDISpecDirs, ","), "with --device-list-strategy=cdi-cri: the directories the container runtime reads CDI specs from; the agent checks at start that they describe every GPU")
	draOpts := dra.DefaultOptions()
	fs.StringVar(&draOpts.ClaimRoot, "dra-claim-root", draOpts.ClaimRoot, "mode dra: host directory of the per-claim limiter files and the driver's checkpoint")
	fs.StringVar(&draOpts.CDIDir, "cdi-dir", draOpts.CDIDir, "directory the agent writes CDI specs to, which the container runtime must read: mode dra's claims, and with --memory-limits-hook the devices that run the hook")
	fs.StringVar(&draOpts.PluginDataDir, "dra-plugin-dir", draOpts.PluginDataDir, "mode dra: the kubelet plugin's directory (dra.sock)")
	fs.StringVar(&draOpts.RegistrarDir, "plugin-registry-dir", draOpts.RegistrarDir, "mode dra: the kubelet's plugin registration directory")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tessera node-agent [flags]\n\nDiscovers GPUs through NVML, publishes the node's inventory, watches GPU health and serves the kubelet device plugin or, on nodes whose profile says mode: dra, the DRA kubelet plugin gpu.tessera.io.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	names, err := api.NewResourceNames(*prefix)
	if err != nil {
		return fmt.Errorf("%w: --resource-prefix: %v", errUsage, err)
	}
	xids, err := health.ParseXIDs(*ignore)
	if err != nil {
		return fmt.Errorf("%w: --ignore-xids: %v", errUsage, err)
	}
	if *recovery < 0 {
		return fmt.Errorf("%w: --recovery-period %v is negative", errUsage, *recovery)
	}
	if *profile != "" && !*discoverOnly {
		return fmt.Errorf("%w: --profile is for --discover-only; the agent reads profiles from --config-map", errUsage)
	}
	strategy := deviceplugin.DeviceListStrategy(*deviceList)
	if !slices.Contains(deviceplugin.DeviceListStrategies(), strategy) {
		return fmt.Errorf("%w: --device-list-strategy %q: want one of %v", errUsage, *deviceList, deviceplugin.DeviceListStrategies())
	}
	var keys *recordsig.Store
	if *recordKeys != "" {
		ns, name, ok := strings.Cut(*recordKeys, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("%w: --record-keys %q: want \"namespace/name\"", errUsage, *recordKeys)
		}
		keys = &recordsig.Store{Namespace: ns, PublicKeys: name}
	}
	if def.ReclaimWait < 0 || def.ReclaimWait > limiterconf.MaxReclaimWaitMs*time.Millisecond || def.ReclaimWait%time.Millisecond != 0 {
		return fmt.Errorf("%w: --reclaim-wait %v: want whole milliseconds from 0 to %v", errUsage, def.ReclaimWait, limiterconf.MaxReclaimWaitMs*time.Millisecond)
	}
	if *reconcileEvery < 0 || *tolerance < 0 || *toleranceMiB < 0 {
		return fmt.Errorf("%w: --reconcile-interval and the breach tolerances must not be negative", errUsage)
	}
	exemptNS := map[string]bool{}
	for _, ns := range splitList(*exempt) {
		exemptNS[ns] = true
	}
	vcNS, vcName, ok := strings.Cut(*volcanoCM, "/")
	if !ok || vcNS == "" || vcName == "" {
		return fmt.Errorf("%w: --volcano-device-config %q: want \"namespace/name\"", errUsage, *volcanoCM)
	}
	var cmNS, cmName string
	if *cm != "" {
		var ok bool
		if cmNS, cmName, ok = strings.Cut(*cm, "/"); !ok || cmNS == "" || cmName == "" {
			return fmt.Errorf("%w: --config-map %q: want \"namespace/name\"", errUsage, *cm)
		}
	}

	checks := agentChecks{driverRoot: *driverRoot, strategy: strategy, cdiDirs: splitList(*cdiDirs),
		pluginDir: *pluginDir, resource: names.GPU}
	if *pluginSockets != "" {
		checks.shimSocket = kubeletshim.EndpointName(names.GPU)
	}
	if *discoverOnly {
		lib, err := checks.openNVML()
		if err != nil {
			return err
		}
		defer lib.Shutdown()
		return discoverOnlyMode(lib, *profile, names, stdout)
	}
	if *nodeName == "" {
		return fmt.Errorf("%w: --node-name is empty and $NODE_NAME is not set", errUsage)
	}
	restCfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	logger := klog.Background().WithName("node-agent")
	lib, err := checks.run(klog.NewContext(ctx, logger), client, *nodeName)
	if err != nil {
		return err
	}
	defer lib.Shutdown()
	a, err := nodeagent.New(lib, client, nodeagent.Options{
		NodeName: *nodeName, Resource: names.GPU,
		ConfigMapNamespace: cmNS, ConfigMapName: cmName,
		Health:             health.Options{IgnoredXIDs: xids, RecoveryPeriod: *recovery},
		Paths:              def,
		PluginDir:          *pluginDir,
		PodResourcesSocket: *podRes,
		RecordKeys:         keys,
		AcceptUnsigned:     *acceptUnsigned,
		DeviceList:         strategy,
		DriverLimits:       driverLimits(*memHook, draOpts.CDIDir),
		PluginSocketDir:    *pluginSockets,
		Reconcile: reconcile.Options{
			Interval: *reconcileEvery, ProcRoot: *procRoot, Kill: *killOnBreach,
			TolerancePercent: *tolerance, ToleranceMiB: *toleranceMiB,
			Exempt: func(ns string) bool { return exemptNS[ns] },
		},
		MPSControl:          []string{*mpsControl},
		MPSRoot:             *mpsRoot,
		DRA:                 draOpts,
		VolcanoDeviceConfig: types.NamespacedName{Namespace: vcNS, Name: vcName},
		MetricsAddress:      *metricsAddr,
	}, logger)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// discoverOnlyMode prints the inventory this node would publish.
func discoverOnlyMode(lib nvml.Interface, profilePath string, names api.ResourceNames, stdout io.Writer) error {
	res, err := discovery.Discover(lib, discovery.Options{})
	if err != nil {
		return err
	}
	for _, e := range res.Skipped {
		klog.Background().Error(e, "GPU left out of the inventory")
	}
	cfg := api.NodeConfig{}
	cfg.Defaults()
	if profilePath != "" {
		b, err := os.ReadFile(profilePath)
		if err != nil {
			return err
		}
		node, err := config.Parse(b, names)
		if err != nil {
			return fmt.Errorf("%s: %w", profilePath, err)
		}
		for _, n := range node.Notes {
			klog.Background().Info("Profile field not used", "profile", profilePath, "note", n)
		}
		cfg = node.NodeConfig
	}
	inv, _ := nodeagent.BuildInventory(res.Devices, nil, cfg, names)
	b, err := api.EncodeInventory(inv)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = stdout.Write(out.Bytes())
	return err
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

func joinXIDs(x []uint64) string {
	s := make([]string, len(x))
	for i, v := range x {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ",")
}

// driverLimits is the agent's DriverLimits from its flags: the hook runs
// `tessera-hook memory-limits` from the host path hook (none when empty; it
// loads NVML from the host's library search path) and its CDI specs go to
// cdiDir (--cdi-dir: the runtime's directory of generated specs, which the
// agent writes, not --cdi-spec-dirs, which it only reads).
func driverLimits(hook, cdiDir string) *deviceplugin.DriverLimits {
	if hook == "" || cdiDir == "" {
		return nil
	}
	return &deviceplugin.DriverLimits{Hook: []string{hook, "memory-limits"}, CDIDir: cdiDir}
}
