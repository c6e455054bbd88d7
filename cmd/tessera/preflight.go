package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/preflight"
)

// agentChecks are the node agent's checks at start (internal/preflight).
type agentChecks struct {
	driverRoot string
	strategy   deviceplugin.DeviceListStrategy
	cdiDirs    []string
	// pluginDir is the kubelet's device-plugin directory; shimSocket the
	// kubelet shim's socket there for resource ("": the agent registers
	// itself, and the check for another plugin is not made).
	pluginDir, shimSocket, resource string
	// open loads NVML (nil: openNVML; tests give a mock).
	open func() (nvml.Interface, error)
}

// openNVML loads NVML from under the driver root, or from the library
// search path without one. With a driver root, the driver's programs and
// libraries go on PATH and LD_LIBRARY_PATH for the processes the agent
// starts (the MPS control daemon).
func (c agentChecks) openNVML() (nvml.Interface, error) {
	if c.driverRoot == "" {
		return discovery.Open("")
	}
	d, err := preflight.FindDriver(c.driverRoot)
	if err != nil {
		return nil, err
	}
	prepend := func(key, dir string) {
		if v := os.Getenv(key); v != "" {
			dir += string(os.PathListSeparator) + v
		}
		os.Setenv(key, dir)
	}
	prepend("PATH", d.BinDir)
	prepend("LD_LIBRARY_PATH", d.LibDir)
	return discovery.Open(d.NVML)
}

// run makes the checks against the cluster and the node, reporting each
// problem as an event on the Node and in the log; it returns NVML, or the
// first problem the agent cannot run with.
func (c agentChecks) run(ctx context.Context, client kubernetes.Interface, node string) (nvml.Interface, error) {
	subject := preflight.Subject{Object: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node}, Component: "tessera-node-agent", Host: node}
	if err := checkKubernetes(ctx, client, subject); err != nil {
		return nil, err
	}
	open := c.open
	if open == nil {
		open = c.openNVML
	}
	lib, err := open()
	if err != nil {
		preflight.Report(ctx, client, subject, err)
		return nil, err
	}
	fail := func(err error) (nvml.Interface, error) {
		lib.Shutdown()
		preflight.Report(ctx, client, subject, err)
		return nil, err
	}
	if c.strategy == deviceplugin.DeviceListCDI {
		var names []string
		uuids, err := gpuUUIDs(lib)
		if err != nil {
			return fail(err)
		}
		for _, u := range uuids {
			names = append(names, deviceplugin.CDIKind+"="+u)
		}
		if err := preflight.CheckCDISpecs(c.cdiDirs, names); err != nil {
			return fail(err)
		}
	}
	if c.shimSocket != "" {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return fail(fmt.Errorf("reading node %s: %w", node, err))
		}
		f, err := preflight.ForeignDevicePlugin(n, c.pluginDir, c.resource, c.shimSocket)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Could not check for another device plugin")
		} else if f != nil {
			preflight.Report(ctx, client, subject, f)
		}
	}
	return lib, nil
}

// gpuUUIDs are the UUIDs of the node's GPUs.
func gpuUUIDs(lib nvml.Interface) ([]string, error) {
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml DeviceGetCount: %v", ret)
	}
	var out []string
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml DeviceGetHandleByIndex(%d): %v", i, ret)
		}
		u, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml GetUUID of GPU %d: %v", i, ret)
		}
		out = append(out, u)
	}
	return out, nil
}

// checkKubernetes refuses an API server older than Tessera supports and
// reports one newer than it was tested with.
func checkKubernetes(ctx context.Context, client kubernetes.Interface, s preflight.Subject) error {
	minimum, maximum, err := preflight.SupportedKubernetes()
	if err != nil {
		return err
	}
	f, err := preflight.CheckServerVersion(client.Discovery(), minimum, maximum)
	switch {
	case err != nil:
		preflight.Report(ctx, client, s, err)
		return err
	case f != nil:
		preflight.Report(ctx, client, s, f)
	}
	return nil
}

// schedulerPreflight checks the API server the scheduler will use before
// kube-scheduler starts: its client from the same flags and configuration
// file kube-scheduler reads (--kubeconfig, --master, the configuration's
// clientConnection.kubeconfig, else in-cluster). Events go to the
// scheduler's Pod ($POD_NAMESPACE/$POD_NAME, the chart sets them).
func schedulerPreflight(ctx context.Context, args []string) error {
	kubeconfig, master, config := flagValue(args, "kubeconfig"), flagValue(args, "master"), flagValue(args, "config")
	if kubeconfig == "" && config != "" {
		b, err := os.ReadFile(config)
		if err != nil {
			return nil // kube-scheduler says what is wrong with its --config
		}
		var cfg struct {
			ClientConnection struct {
				Kubeconfig string `json:"kubeconfig"`
			} `json:"clientConnection"`
		}
		if yaml.Unmarshal(b, &cfg) == nil {
			kubeconfig = cfg.ClientConnection.Kubeconfig
		}
	}
	var rc *rest.Config
	var err error
	if kubeconfig != "" || master != "" {
		rc, err = clientcmd.BuildConfigFromFlags(master, kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil // no client to check with: kube-scheduler reports it
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil
	}
	s := preflight.Subject{Component: "tessera-scheduler", Host: os.Getenv("POD_NAME")}
	if name, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE"); name != "" && ns != "" {
		s.Object = corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Name: name, Namespace: ns}
	}
	return checkKubernetes(klog.NewContext(ctx, klog.Background().WithName("scheduler-preflight")), client, s)
}

// flagValue is the value of --name in args ("--name=v", "--name v",
// "-name=v"), "" when absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
