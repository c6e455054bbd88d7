package component

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/pki"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
)

// kubeletRoot is where a hollow kubelet's device manager listens; the
// node's kubelet directory is bind-mounted there in the kubelet's own
// mount namespace.
const kubeletRoot = "/var/lib/kubelet"

func runKubelet(ctx context.Context, args []string) error {
	f, err := parseNodeFlags(Kubelet, args)
	if err != nil {
		return err
	}
	if err := mountKubeletRoot(f.Dir.Kubelet()); err != nil {
		return err
	}
	client, err := Client(f.Kubeconfig)
	if err != nil {
		return err
	}
	// The runtime (its own component) may not serve yet.
	if err := poll.Until(ctx, time.Minute, func(context.Context) (bool, error) {
		_, err := os.Stat(f.Dir.CRISocket())
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("container runtime not serving on %s: %w", f.Dir.CRISocket(), err)
	}
	cert, key, err := pki.KubeletServing(f.Lab.PKI(), f.Dir.PKI(), f.Node)
	if err != nil {
		return fmt.Errorf("kubelet serving certificate: %w", err)
	}
	opts, err := kubeletOptions(f)
	if err != nil {
		return err
	}
	opts.Client = client
	opts.Serving = hollowkubelet.Serving{CertFile: cert, KeyFile: key, ClientCAFile: pki.CAFile(f.Lab.PKI())}
	if err := hollowkubelet.Run(ctx, opts); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// kubeletOptions is the node's hollow kubelet, as its mode has it.
func kubeletOptions(f *NodeFlags) (hollowkubelet.Options, error) {
	m, err := modes.Named(f.Mode)
	if err != nil {
		return hollowkubelet.Options{}, fmt.Errorf("kubelet of node %s: %w", f.Node, err)
	}
	o := hollowkubelet.Options{
		NodeName: f.Node, RootDir: kubeletRoot, Port: f.Port, MaxPods: 250,
		Cores: 64, MemoryBytes: 512 << 30,
		Labels:          f.Labels,
		Taints:          f.Taints,
		RuntimeEndpoint: "unix://" + f.Dir.CRISocket(),
		PodLogsDir:      f.Dir.PodLogs(),
	}
	if m.Kubelet != nil {
		m.Kubelet(&o)
	}
	return o, nil
}

// mountKubeletRoot makes root the kubelet's /var/lib/kubelet inside this
// process's private mount namespace (the supervisor starts the kubelet
// and the runtime with CLONE_NEWNS).
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
