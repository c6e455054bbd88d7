package scheduler

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/internal/scheduler/resourcesfit"
)

// NewCommand returns kube-scheduler's command with the Tessera plugin
// registered; every kube-scheduler flag works (--config, --kubeconfig,
// --leader-elect, …).
func NewCommand() *cobra.Command {
	return app.NewSchedulerCommand(withPlugins()...)
}

// Registry holds Tessera's plugins: the Tessera plugin, its preemption
// (PreemptionName) and the profile's NodeResourcesFit (resourcesfit.Name)
// and DynamicResources (resourcesfit.DRAName).
// It also registers the Tessera plugin's argument types with
// kube-scheduler's configuration loader (registerArgs).
func Registry() frameworkruntime.Registry {
	registerArgs()
	return frameworkruntime.Registry{Name: New, PreemptionName: NewPreemption, resourcesfit.Name: resourcesfit.New, resourcesfit.DRAName: resourcesfit.NewDRA}
}

func withPlugins() []app.Option {
	var opts []app.Option
	for name, factory := range Registry() {
		opts = append(opts, app.WithPlugin(name, factory))
	}
	return opts
}

// RunInProcess runs a scheduler with the Tessera plugin from a
// KubeSchedulerConfiguration file until ctx ends, without the HTTP
// endpoints and leader election of the command. Tests use it to start,
// kill and restart schedulers inside one process (the command's configz
// registration allows only one per process). extra are more options for
// kube-scheduler (a test's own plugins, app.WithPlugin).
func RunInProcess(ctx context.Context, configFile string, extra ...app.Option) error {
	opts := options.NewOptions()
	opts.ConfigFile = configFile
	opts.SecureServing.BindPort = 0
	cc, sched, err := app.Setup(ctx, opts, append(withPlugins(), extra...)...)
	if err != nil {
		return fmt.Errorf("setting up the scheduler: %w", err)
	}
	cc.EventBroadcaster.StartRecordingToSink(ctx.Done())
	defer cc.EventBroadcaster.Shutdown()
	cc.InformerFactory.Start(ctx.Done())
	if cc.DynInformerFactory != nil {
		cc.DynInformerFactory.Start(ctx.Done())
	}
	cc.InformerFactory.WaitForCacheSync(ctx.Done())
	if cc.DynInformerFactory != nil {
		cc.DynInformerFactory.WaitForCacheSync(ctx.Done())
	}
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		return fmt.Errorf("waiting for the scheduler's handlers: %w", err)
	}
	sched.Run(ctx)
	return nil
}
