// Package configv1 is version v1 of the Tessera plugin's arguments: kind
// TesseraArgs of kubescheduler.config.k8s.io/v1, what users write under
// pluginConfig in a KubeSchedulerConfiguration:
//
//	pluginConfig:
//	  - name: Tessera
//	    args:
//	      placementPolicy: tessera
//
// Unset fields take their defaults (SetDefaults_TesseraArgs); the loader
// rejects unknown keys.
package configv1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/internal/scheduler/config"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// SchemeGroupVersion is kubescheduler.config.k8s.io/v1.
var SchemeGroupVersion = schema.GroupVersion{Group: config.GroupName, Version: "v1"}

// TesseraArgs are the Tessera plugin's arguments, version v1.
type TesseraArgs struct {
	metav1.TypeMeta `json:",inline"`

	// ResourcePrefix is the prefix of the GPU resource names pods ask for
	// (default nvidia.com: nvidia.com/gpu, nvidia.com/gpumem, …).
	ResourcePrefix *string `json:"resourcePrefix,omitempty"`
	// NodePolicy (binpack or spread) is the node policy a pod's
	// tessera.io/node-policy annotation overrides (default binpack).
	NodePolicy *string `json:"nodePolicy,omitempty"`
	// GPUPolicy (binpack, spread or topology-aware) chooses among a
	// node's GPUs for pods that name none (default binpack).
	GPUPolicy *string `json:"gpuPolicy,omitempty"`
	// PlacementPolicy names the placement policy that scores nodes
	// (binpack, spread, fgd, tessera: policies.All). Unset, it is
	// NodePolicy's.
	PlacementPolicy *string `json:"placementPolicy,omitempty"`
	// RecordSigning says where the scheduler keeps the key it signs the
	// allocation records with, or disables signing (docs/security.md).
	RecordSigning api.RecordSigning `json:"recordSigning,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (a *TesseraArgs) DeepCopyObject() runtime.Object {
	if a == nil {
		return nil
	}
	out := *a
	for _, p := range []**string{&out.ResourcePrefix, &out.NodePolicy, &out.GPUPolicy, &out.PlacementPolicy} {
		if *p != nil {
			v := **p
			*p = &v
		}
	}
	return &out
}

// SetDefaults_TesseraArgs fills the unset fields (api.ClusterConfig.Defaults).
func SetDefaults_TesseraArgs(a *TesseraArgs) {
	var in config.TesseraArgs
	convertToInternal(a, &in)
	cfg := in.ClusterConfig()
	cfg.Defaults()
	a.ResourcePrefix = &cfg.ResourcePrefix
	np, gp := string(cfg.NodePolicy), string(cfg.GPUPolicy)
	a.NodePolicy, a.GPUPolicy = &np, &gp
	a.PlacementPolicy = &cfg.PlacementPolicy
}

func convertToInternal(in *TesseraArgs, out *config.TesseraArgs) {
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	out.ResourcePrefix = deref(in.ResourcePrefix)
	out.NodePolicy = api.NodePolicy(deref(in.NodePolicy))
	out.GPUPolicy = api.GPUPolicy(deref(in.GPUPolicy))
	out.PlacementPolicy = deref(in.PlacementPolicy)
	out.RecordSigning = in.RecordSigning
}

func convertFromInternal(in *config.TesseraArgs, out *TesseraArgs) {
	ref := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	out.ResourcePrefix = ref(in.ResourcePrefix)
	out.NodePolicy = ref(string(in.NodePolicy))
	out.GPUPolicy = ref(string(in.GPUPolicy))
	out.PlacementPolicy = ref(in.PlacementPolicy)
	out.RecordSigning = in.RecordSigning
}

// AddToScheme registers TesseraArgs v1 with its defaults and its
// conversions to and from the internal form.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(SchemeGroupVersion.WithKind(config.Kind), &TesseraArgs{})
	s.AddTypeDefaultingFunc(&TesseraArgs{}, func(obj any) { SetDefaults_TesseraArgs(obj.(*TesseraArgs)) })
	if err := s.AddConversionFunc((*TesseraArgs)(nil), (*config.TesseraArgs)(nil), func(a, b any, _ conversion.Scope) error {
		convertToInternal(a.(*TesseraArgs), b.(*config.TesseraArgs))
		return nil
	}); err != nil {
		return err
	}
	return s.AddConversionFunc((*config.TesseraArgs)(nil), (*TesseraArgs)(nil), func(a, b any, _ conversion.Scope) error {
		convertFromInternal(a.(*config.TesseraArgs), b.(*TesseraArgs))
		return nil
	})
}
