// Package realnode runs a real Kubernetes node beside the lab's control
// plane (lab.StartControlPlane), for make e2e: containerd 2.x with runc and
// the CNI plugins bridge, host-local, loopback and portmap (hack/node), the
// kubelet and kube-proxy of go.mod's Kubernetes, and a fake NVIDIA driver
// installed the way NVIDIA's driver container lays one out (driver.go).
// Everything runs in a sandbox (sandbox.go): mount and network namespaces
// of its own, so the node's mounts, network, iptables rules and device
// nodes never reach this machine's; only its cgroups (under a root of
// their own) and the mount points it shadows are made outside, and
// removed when it ends.
package realnode

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/pki"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
)

// Binaries are the node's programs.
type Binaries struct {
	// Runtime holds containerd, containerd-shim-runc-v2, ctr and runc,
	// and the CNI plugins in Runtime/cni (hack/node/build.sh).
	Runtime string
	// Kubelet and KubeProxy are the Kubernetes binaries.
	Kubelet, KubeProxy string
}

// Check reports the binaries that are missing.
func (b Binaries) Check() error {
	var missing []string
	for _, p := range []string{
		filepath.Join(b.Runtime, "containerd"), filepath.Join(b.Runtime, "containerd-shim-runc-v2"), filepath.Join(b.Runtime, "ctr"), filepath.Join(b.Runtime, "runc"),
		filepath.Join(b.Runtime, "cni", "bridge"), filepath.Join(b.Runtime, "cni", "host-local"), filepath.Join(b.Runtime, "cni", "loopback"), filepath.Join(b.Runtime, "cni", "portmap"),
		b.Kubelet, b.KubeProxy,
	} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the node's binaries are missing: %s (make e2e builds them: hack/node/build.sh, go build k8s.io/kubernetes/cmd/kubelet and kube-proxy)", strings.Join(missing, ", "))
	}
	return nil
}

// Config is the node Start runs.
type Config struct {
	// Name is the Node's name; Address its IP (the sandbox's, Sandbox.Address).
	Name, Address string
	// Dir holds the node's state: containerd's, its logs, configurations.
	Dir string
	// PodCIDR is the node's pod range (the bridge's), within ClusterCIDR.
	PodCIDR, ClusterCIDR string
	// CgroupRoot is the cgroup under which the kubelet puts every pod
	// (Sandbox.CgroupRoot).
	CgroupRoot string
	Bin        Binaries
	// Images are OCI layout tars imported into containerd's k8s.io
	// namespace before the kubelet starts (no pulls: the sandbox has no
	// route out); SandboxImage, one of them, is the pods' sandbox.
	Images       []string
	SandboxImage string
}

// Node is a running node.
type Node struct {
	cfg Config
	cp  *lab.ControlPlane
}

func (n *Node) path(p ...string) string { return filepath.Join(append([]string{n.cfg.Dir}, p...)...) }

// ContainerdSocket is containerd's API socket.
func (n *Node) ContainerdSocket() string { return n.path("containerd", "containerd.sock") }

// Start starts containerd, imports the images, and starts the kubelet
// and kube-proxy as components of the control plane's supervisor; it
// returns once the Node is Ready.
func Start(ctx context.Context, cp *lab.ControlPlane, cfg Config) (*Node, error) {
	if err := cfg.Bin.Check(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, cp: cp}
	for _, p := range []string{n.path("containerd"), n.path("cni", "net.d"), n.path("cni", "ipam"), n.path("kubelet"), n.path("kube-proxy")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	for _, img := range cfg.Images {
		if err := n.ctr(ctx, "images", "import", "--all-platforms", img); err != nil {
			return nil, fmt.Errorf("importing %s into containerd: %w", img, err)
		}
	}
	if err := n.startKubelet(); err != nil {
		return nil, err
	}
	if err := n.startKubeProxy(); err != nil {
		return nil, err
	}
	if err := poll.Until(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		for _, c := range []string{"containerd", "kubelet", "kube-proxy"} {
			if st := cp.Supervisor.Components()[c]; st.Restarts >= 3 {
				return false, fmt.Errorf("%s keeps exiting; see %s", c, cp.Dir.Log(c))
			}
		}
		// kube-proxy answers its health check once it has programmed the
		// Services: a pod that dials the kubernetes Service before that
		// leaves a conntrack entry without the Service's translation,
		// which its retries keep alive (the pod never reaches the API
		// server).
		if !kubeProxySynced(ctx) {
			return false, nil
		}
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, cfg.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		return nil, fmt.Errorf("node %s not Ready: %w (logs: %s)", cfg.Name, err, cp.Dir.Log("kubelet"))
	}
	return n, nil
}

// kubeProxyHealthz is kube-proxy's health check (healthzBindAddress): 200
// once its rules are synced.
const kubeProxyHealthz = "http://127.0.0.1:10256/healthz"

func kubeProxySynced(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, kubeProxyHealthz, nil)
	if err != nil {
		return false
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// ctr runs containerd's ctr in the k8s.io namespace (the kubelet's).
func (n *Node) ctr(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(n.cfg.Bin.Runtime, "ctr"), append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Ctr runs ctr against the node's containerd and returns its output.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.cfg.Bin.Runtime, "ctr"), append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)...)
	return cmd.CombinedOutput()
}

func (n *Node) startContainerd(ctx context.Context) error {
	rt := n.cfg.Bin.Runtime
	conf := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[4]q

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  # This machine's root lacks CAP_SYS_RESOURCE: no process may lower its
  # OOM score, so the kubelet's (-998 for sandboxes, -997 for guaranteed
  # pods) are raised to containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[5]q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[6]q]
    conf_dir = %[7]q
`, n.path("containerd", "root"), n.path("containerd", "state"), n.ContainerdSocket(), n.cfg.SandboxImage,
		filepath.Join(rt, "runc"), filepath.Join(rt, "cni"), n.path("cni", "net.d"))
	if err := os.WriteFile(n.path("containerd", "config.toml"), []byte(conf), 0o644); err != nil {
		return err
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "tessera-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.cfg.PodCIDR, n.path("cni", "ipam"))
	if err := os.WriteFile(n.path("cni", "net.d", "10-tessera-e2e.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	// The shim is found on containerd's PATH.
	env := []string{"PATH=" + rt + ":" + os.Getenv("PATH")}
	if err := n.cp.Supervisor.StartExe("containerd", filepath.Join(rt, "containerd"), []string{"--config", n.path("containerd", "config.toml")}, env); err != nil {
		return err
	}
	return poll.Until(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		if !n.cp.Supervisor.Alive("containerd") {
			return false, fmt.Errorf("containerd exited; see %s", n.cp.Dir.Log("containerd"))
		}
		return n.ctr(ctx, "version") == nil, nil
	})
}

func (n *Node) startKubelet() error {
	p := n.cp.PKI
	kubeconfig := n.path("kubelet", "kubeconfig")
	if err := p.WriteCertKubeconfig(kubeconfig, n.cp.APIServer, "system:node:"+n.cfg.Name, "system:nodes"); err != nil {
		return err
	}
	cert, key, err := pki.KubeletServing(n.cp.Dir.PKI(), n.path("kubelet", "pki"), n.cfg.Name)
	if err != nil {
		return err
	}
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"containerRuntimeEndpoint": "unix://" + n.ContainerdSocket(),
		// This machine: cgroup v1 without systemd.
		"cgroupDriver":      "cgroupfs",
		"failCgroupV1":      false,
		"cgroupRoot":        "/" + n.cfg.CgroupRoot,
		"cgroupsPerQOS":     true,
		"address":           n.cfg.Address,
		"readOnlyPort":      0,
		"tlsCertFile":       cert,
		"tlsPrivateKeyFile": key,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": p.File("ca.crt")},
		},
		"authorization": map[string]any{"mode": "Webhook"},
		"failSwapOn":    false,
		// Other work shares this machine's disk: evict only when it is
		// really full, and never collect the imported images.
		"evictionHard":                map[string]string{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
		"resolvConf":                  "/etc/resolv.conf",
		"clusterDomain":               "cluster.local",
		"staticPodPath":               "",
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.path("kubelet", "config.yaml"), b, 0o644); err != nil {
		return err
	}
	return n.cp.Supervisor.StartExe("kubelet", n.cfg.Bin.Kubelet, []string{
		"--config=" + n.path("kubelet", "config.yaml"), "--kubeconfig=" + kubeconfig,
		"--hostname-override=" + n.cfg.Name, "--node-ip=" + n.cfg.Address, "--v=2",
	}, []string{"PATH=" + n.cfg.Bin.Runtime + ":" + os.Getenv("PATH")})
}

func (n *Node) startKubeProxy() error {
	kubeconfig := n.path("kube-proxy", "kubeconfig")
	if err := n.cp.PKI.WriteCertKubeconfig(kubeconfig, n.cp.APIServer, "system:kube-proxy"); err != nil {
		return err
	}
	b, err := yaml.Marshal(map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"clientConnection": map[string]any{"kubeconfig": kubeconfig},
		"mode":             "iptables",
		"clusterCIDR":      n.cfg.ClusterCIDR,
		"hostnameOverride": n.cfg.Name,
		// The sandbox's network namespace may not set the machine-wide
		// conntrack table size and timeouts: leave the kernel's.
		"conntrack":          map[string]any{"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
		"metricsBindAddress": "127.0.0.1:10249",
		"healthzBindAddress": "127.0.0.1:10256", // kubeProxyHealthz
	})
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.path("kube-proxy", "config.yaml"), b, 0o644); err != nil {
		return err
	}
	return n.cp.Supervisor.StartExe("kube-proxy", n.cfg.Bin.KubeProxy, []string{"--config=" + n.path("kube-proxy", "config.yaml"), "--v=2"}, nil)
}

// ErrNotRoot: the node needs root (namespaces, mounts, cgroups, mknod).
var ErrNotRoot = errors.New("a real node needs root")
