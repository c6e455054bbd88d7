package scheduler

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubeschedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	kubeschedv1 "k8s.io/kubernetes/pkg/scheduler/apis/config/v1"

	"github.com/tessera-gpu/tessera/internal/scheduler/config"
	"github.com/tessera-gpu/tessera/internal/scheduler/configv1"
)

var (
	registerArgsOnce sync.Once
	// argsScheme decodes arguments that reach the plugin undecoded (a
	// framework built from a configuration loaded before registerArgs).
	argsScheme = runtime.NewScheme()
	argsCodecs = serializer.NewCodecFactory(argsScheme, serializer.EnableStrict)
)

// registerArgs adds every version of TesseraArgs to kube-scheduler's
// scheme, which its configuration loader decodes with (strictly: an
// unknown key is an error), and to the scheme it defaults and converts
// plugin arguments with. Registry, and so NewCommand and RunInProcess,
// call it before any configuration is read; it is explicit, not an
// import side effect.
func registerArgs() {
	registerArgsOnce.Do(func() {
		for _, s := range []*runtime.Scheme{kubeschedscheme.Scheme, kubeschedv1.GetPluginArgConversionScheme(), argsScheme} {
			utilruntime.Must(config.AddToScheme(s))
			utilruntime.Must(configv1.AddToScheme(s))
		}
	})
}

// argsPath is where validation errors point.
var argsPath = field.NewPath("pluginConfig").Key(Name).Child("args")

// decodeArgs returns the plugin's arguments, defaulted and validated
// (placementPolicies: the names the plugin may run). The loader normally hands them over decoded; raw ones (runtime.Unknown) are
// decoded here just as strictly, as TesseraArgs v1 unless they name
// another version.
func decodeArgs(obj runtime.Object, placementPolicies []string) (*config.TesseraArgs, error) {
	registerArgs()
	var args *config.TesseraArgs
	switch o := obj.(type) {
	case *config.TesseraArgs:
		args = o
	case nil:
		v1 := &configv1.TesseraArgs{}
		argsScheme.Default(v1)
		args = &config.TesseraArgs{}
		if err := argsScheme.Convert(v1, args, nil); err != nil {
			return nil, err
		}
	case *runtime.Unknown:
		gvk := configv1.SchemeGroupVersion.WithKind(config.Kind)
		raw := o.Raw
		if len(raw) == 0 {
			raw = []byte("{}")
		}
		out, _, err := argsCodecs.UniversalDecoder().Decode(raw, &gvk, nil)
		if err != nil {
			return nil, fmt.Errorf("decoding args for plugin %s: %w", Name, err)
		}
		a, ok := out.(*config.TesseraArgs)
		if !ok {
			return nil, fmt.Errorf("args for plugin %s are a %T, not %s", Name, out, config.Kind)
		}
		args = a
	default:
		return nil, fmt.Errorf("args for plugin %s are a %T, not %s", Name, obj, config.Kind)
	}
	if err := config.ValidateTesseraArgs(argsPath, args, placementPolicies); err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
	}
	return args, nil
}
