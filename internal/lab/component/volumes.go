package component

import (
	"context"
	"flag"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/volumes"
)

// VolumeProvisionerArgs runs the volume provisioner under kubeconfig for
// the lab in dir.
func VolumeProvisionerArgs(kubeconfig string, dir labdir.Dir) []string {
	return Args(VolumeProvisioner, "--kubeconfig="+kubeconfig, "--dir="+string(dir))
}

func runVolumeProvisioner(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(VolumeProvisioner, flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	dir := fs.String("dir", "", "the lab's state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	client, err := Client(*kubeconfig)
	if err != nil {
		return err
	}
	return volumes.Run(klog.NewContext(ctx, klog.Background()), client, labdir.Dir(*dir))
}
