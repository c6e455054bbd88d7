package component

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/standin"
)

// containerTools is where a container finds the lab's tools (tools.Dir's
// Bin), first on its PATH.
const containerTools = "/usr/local/tessera-lab/bin"

// containerPATH is the PATH of a container that sets none (an image's).
const containerPATH = containerTools + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// runRuntime is a node's container runtime: it serves the kubelet's CRI
// on the node's socket and runs the containers as processes (package
// hollowkubelet), in the node's mount namespace, so the kubelet's mounts
// resolve. It outlives a restart of the kubelet, as containerd does.
func runRuntime(ctx context.Context, args []string) error {
	f, err := parseNodeFlags(Runtime, args)
	if err != nil {
		return err
	}
	if err := mountKubeletRoot(f.Dir.Kubelet()); err != nil {
		return err
	}
	if err := f.Tools.Check(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithName("runtime")
	for _, d := range []string{f.Dir.Containers(), f.Dir.Run(), f.Dir.PodLogs()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// What the previous runtime left: its containers died with it.
	if err := os.RemoveAll(f.Dir.Run()); err != nil {
		return err
	}
	gpus, err := newGPUs(f.Dir, f.Node, f.Model, f.GPUs, f.Partitioning)
	if err != nil {
		return err
	}
	client, err := Client(f.Kubeconfig)
	if err != nil {
		return err
	}
	gpus.mig = migFromInventory(client, f.Node, f.Dir, 30*time.Second)
	driver, err := gpus.files.ListenDriver()
	if err != nil {
		return err
	}
	driverErr := make(chan error, 1)
	go func() { driverErr <- fakegpu.ServeDriver(ctx, driver) }()
	record := func(c hollowkubelet.Container) {
		if err := f.Dir.WriteContainer(c); err != nil {
			logger.Error(err, "Recording a container", "pod", c.Namespace+"/"+c.Pod, "container", c.Name)
		}
	}
	cgroups, err := containerCgroups(f)
	if err != nil {
		return err
	}
	cgroups.Clean()
	rt := hollowkubelet.NewRuntime(hollowkubelet.RuntimeOptions{
		Init: f.Tools.Init(), RunDir: f.Dir.Run(), Hide: []string{string(f.Lab)},
		DefaultCommand: []string{containerTools + "/lab-pause"},
		DefaultEnv:     map[string]string{"PATH": containerPATH, "HOME": "/root"},
		StandIn: func(image string, argv []string, env map[string]string) []string {
			cmd, _ := standin.Command(containerTools+"/gpu-fill", image, argv, env)
			return cmd
		},
		Prepare:      labContainer(f.Tools, gpus),
		PodResources: kubeletRoot + "/pod-resources/kubelet.sock",
		CDIDirs:      []string{f.Dir.CDI()},
		Cgroups:      cgroups,
		OnCreate:     record, OnUpdate: record,
		OnRemove: f.Dir.RemoveContainer,
		Logger:   logger,
	})
	err = rt.Serve(ctx, "unix://"+f.Dir.CRISocket())
	// Its containers are gone: so are their cgroups, and the lab's
	// directories above them once no other node's are left.
	cgroups.Clean()
	_ = syscall.Rmdir(filepath.Dir(cgroups.Root))
	_ = syscall.Rmdir(filepath.Dir(filepath.Dir(cgroups.Root)))
	select {
	case derr := <-driverErr:
		return errors.Join(err, derr)
	default:
		return err
	}
}

// containerCgroups is where the node's runtime makes its containers'
// cgroups (hollowkubelet.Cgroups): in the cgroup v2 hierarchy where the
// host mounts it, or mounted in the runtime's own mount namespace (the
// node's Cgroup directory), under a directory of this lab and node, so
// two labs on one machine keep apart.
func containerCgroups(f *NodeFlags) (*hollowkubelet.Cgroups, error) {
	var mnt string
	switch m, err := cgroup2.FindMount("/proc/self/mountinfo"); {
	case err == nil && m.Root == "/":
		mnt = m.Point
	case err != nil && !errors.Is(err, cgroup2.ErrNoMount):
		return nil, err
	default: // none, or only a sub-tree of the hierarchy
		mnt = f.Dir.Cgroup()
		if err := os.MkdirAll(mnt, 0o755); err != nil {
			return nil, err
		}
		if err := syscall.Mount("cgroup2", mnt, "cgroup2", 0, ""); err != nil {
			return nil, fmt.Errorf("mounting the cgroup v2 hierarchy on %s for the containers' cgroups: %w", mnt, err)
		}
	}
	lab := sha256.Sum256([]byte(f.Lab))
	return &hollowkubelet.Cgroups{Root: filepath.Join(mnt, "tessera-lab", hex.EncodeToString(lab[:4]), f.Node)}, nil
}
