package component

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/nvmlemu"
	"github.com/tessera-gpu/tessera/internal/nodeagent"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ReconcileInterval is how often the lab's node agents compare what each
// container holds on its GPUs with its grant (the agent's default is 5 s;
// the lab's tests wait for it).
const ReconcileInterval = 2 * time.Second

func runNodeAgent(ctx context.Context, args []string) error {
	f, err := parseNodeFlags(NodeAgent, args)
	if err != nil {
		return err
	}
	lib, err := nvmlemu.NewModel(f.Model, f.GPUs, f.Node)
	if err != nil {
		return err
	}
	// The node's NVML sees what the containers' processes do on its GPUs
	// (their state files, which the node's runtime creates).
	lib.UseUsage(&fakegpu.Node{Dir: f.Dir.GPUs()})
	if f.Partitioning {
		lib.UsePartitioning(&fakegpu.Node{Dir: f.Dir.GPUs()}, fakegpu.NVMLCodes)
	}
	client, err := Client(f.Kubeconfig)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	a, err := nodeagent.New(lib, client, nodeAgentOptions(f, exe), klog.Background().WithName("node-agent"))
	if err != nil {
		return err
	}
	go publishMetricsAddress(ctx, a, f.Dir)
	go publishMIGDevices(ctx, a, f.Dir)
	return a.Run(ctx)
}

// nodeAgentOptions is the node's agent: its paths in the node's
// directory, the lab's MPS control daemon (exe's mps-control component),
// and what it checks: the scheduler's signatures, and (Shim) serving the
// shim instead of the kubelet. The host-side reconciler runs as shipped
// (kill on breach, the default exempt namespaces), every
// ReconcileInterval: the emulated NVML lists the processes on the node's
// GPUs by host pid and the node's runtime puts each container in a cgroup
// named after its pod and container, as a kubelet's are.
func nodeAgentOptions(f *NodeFlags, exe string) nodeagent.Options {
	paths := deviceplugin.DefaultPaths()
	paths.LimiterHost = f.Dir.Limiter()
	paths.PreloadHost = f.Dir.Preload()
	paths.StateRoot = f.Dir.LimiterState()
	paths.BudgetHost = f.Dir.Budgets()
	cmNS, cmName, _ := strings.Cut(f.ConfigMap, "/")
	o := nodeagent.Options{
		NodeName: f.Node, Resource: api.DefaultResourceNames.GPU,
		ConfigMapNamespace: cmNS, ConfigMapName: cmName,
		MPSControl:         []string{exe, Command, MPSControl},
		MPSRoot:            f.Dir.MPS(),
		Health:             health.Options{IgnoredXIDs: health.DefaultIgnoredXIDs, RecoveryPeriod: time.Minute},
		Paths:              paths,
		PluginDir:          f.Dir.DevicePlugins(),
		PodResourcesSocket: f.Dir.PodResources(),
		Resync:             30 * time.Second,
		DRA:                labDRA(f.Dir),
		MetricsAddress:     "127.0.0.1:0",
		RecordKeys:         &recordsig.Store{},
	}
	exempt := strings.Split(reconcile.DefaultExemptNamespaces, ",")
	o.Reconcile = reconcile.Options{Interval: ReconcileInterval, Kill: true,
		Exempt: func(ns string) bool { return slices.Contains(exempt, ns) }}
	if f.Shim {
		o.PluginSocketDir = f.Dir.AgentSockets()
	}
	if f.Partitioning {
		// The node's runtime runs the hook on the host, as the
		// agent's memory-limits command over the node's NVML.
		o.DriverLimits = &deviceplugin.DriverLimits{CDIDir: f.Dir.CDI(), Hook: append([]string{exe}, Args(MemoryLimits,
			"--model="+f.Model, "--gpus="+fmt.Sprint(f.GPUs), "--node="+f.Node, "--gpu-dir="+f.Dir.GPUs(), "--")...)}
	}
	return o
}

// labDRA are the node agent's DRA paths on the node: the kubelet's plugin
// directories under the node's kubelet root (bind-mounted on
// /var/lib/kubelet in the kubelet's mount namespace). Every node's agent
// has them: a node relabelled to a profile of mode dra serves claims.
func labDRA(n labdir.NodeDir) dra.Options {
	return dra.Options{
		ClaimRoot:     n.Claims(),
		CDIDir:        n.CDI(),
		PluginDataDir: filepath.Join(n.Kubelet(), "plugins", api.DRADriverName),
		RegistrarDir:  filepath.Join(n.Kubelet(), "plugins_registry"),
	}
}

// publishMetricsAddress writes where the agent serves its metrics into
// the node's directory (labdir.Dir.MetricsURL reads it) once it listens.
// LabMIGDevice is a MIG device as the node's agent publishes it for its
// runtime (labdir.NodeDir.MIGDevices).
type LabMIGDevice struct {
	Parent string `json:"parent"`
	// Model is the parent's NVML name.
	Model string `json:"model"`
	api.MIGDevice
}

// publishMIGDevices writes the MIG devices the agent sees, by UUID,
// whenever they change (the agent makes and destroys them).
func publishMIGDevices(ctx context.Context, a *nodeagent.Agent, n labdir.NodeDir) {
	var last []byte
	for ctx.Err() == nil {
		devs := map[string]LabMIGDevice{}
		for _, d := range a.Devices() {
			for _, m := range d.MIGDevices {
				devs[m.UUID] = LabMIGDevice{Parent: d.GPU.UUID, Model: d.GPU.Model, MIGDevice: m.MIGDevice}
			}
		}
		b, err := json.Marshal(devs)
		if err == nil && !bytes.Equal(b, last) {
			if err = atomicfile.Write(n.MIGDevices(), b, 0o644); err == nil {
				last = b
			}
		}
		if err != nil {
			klog.Background().Error(err, "Publishing the MIG devices for the node's runtime")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func publishMetricsAddress(ctx context.Context, a *nodeagent.Agent, n labdir.NodeDir) {
	for ctx.Err() == nil {
		if addr := a.MetricsAddr(); addr != "" {
			if err := os.WriteFile(n.MetricsAddress(), []byte(addr), 0o644); err != nil {
				klog.Background().Error(err, "Writing the node agent's metrics address")
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
