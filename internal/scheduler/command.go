package scheduler

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/scheduler/resourcesfit"
)

// Option changes what the scheduler's Tessera plugin runs.
type Option func(*settings)

type settings struct {
	policies policies.Catalogue
	extra    []app.Option
}

// WithPolicies makes the Tessera plugin run the placement policies of cat
// instead of the shipped ones (policies.All): a test that replays the
// simulator's research baselines through the real scheduler passes the
// simulator's catalogue. placementPolicy must name one of cat's.
func WithPolicies(cat policies.Catalogue) Option {
	return func(s *settings) { s.policies = cat }
}

// WithSchedulerOptions adds kube-scheduler options (a test's own plugins,
// app.WithPlugin) to the scheduler RunInProcess and NewCommand start.
func WithSchedulerOptions(extra ...app.Option) Option {
	return func(s *settings) { s.extra = append(s.extra, extra...) }
}

func settingsOf(opts []Option) settings {
	s := settings{policies: policies.All()}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// NewCommand returns kube-scheduler's command with the Tessera plugin
// registered; every kube-scheduler flag works (--config, --kubeconfig,
// --leader-elect, …).
func NewCommand(opts ...Option) *cobra.Command {
	return app.NewSchedulerCommand(withPlugins(opts)...)
}

// Registry holds Tessera's plugins: the Tessera plugin, its preemption
// (PreemptionName) and the profile's NodeResourcesFit (resourcesfit.Name)
// and DynamicResources (resourcesfit.DRAName).
// It also registers the Tessera plugin's argument types with
// kube-scheduler's configuration loader (registerArgs).
func Registry(opts ...Option) frameworkruntime.Registry {
	registerArgs()
	cat := settingsOf(opts).policies
	tessera := func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return newWithPolicies(ctx, obj, h, cat)
	}
	return frameworkruntime.Registry{Name: tessera, PreemptionName: NewPreemption, resourcesfit.Name: resourcesfit.New, resourcesfit.DRAName: resourcesfit.NewDRA}
}

func withPlugins(opts []Option) []app.Option {
	var out []app.Option
	for name, factory := range Registry(opts...) {
		out = append(out, app.WithPlugin(name, factory))
	}
	return append(out, settingsOf(opts).extra...)
}

// RunInProcess runs a scheduler with the Tessera plugin from a
// KubeSchedulerConfiguration file until ctx ends, without the HTTP
// endpoints and leader election of the command. Tests use it to start,
// kill and restart schedulers inside one process (the command's configz
// registration allows only one per process).
func RunInProcess(ctx context.Context, configFile string, opts ...Option) error {
	o := options.NewOptions()
	o.ConfigFile = configFile
	o.SecureServing.BindPort = 0
	cc, sched, err := app.Setup(ctx, o, withPlugins(opts)...)
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
