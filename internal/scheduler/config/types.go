// Package config holds the Tessera plugin's arguments in the form the
// plugin uses (the internal, unversioned TesseraArgs), their validation and
// the registration of every version of them into kube-scheduler's schemes,
// so that the scheduler's own configuration loader decodes them strictly
// (an unknown or misspelled key is an error at start) and defaults them.
// The versions users write live in subpackages (v1).
package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// GroupName is kube-scheduler's configuration group, which plugin
// arguments join: the loader decodes a plugin's args as <Name>Args of it.
const GroupName = "kubescheduler.config.k8s.io"

// Kind is the kind of the Tessera plugin's arguments.
const Kind = "TesseraArgs"

// SchemeGroupVersion is the internal version.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: runtime.APIVersionInternal}

// TesseraArgs are the Tessera plugin's arguments after defaulting, in
// every version's common form. The fields mean what api.ClusterConfig's
// do.
type TesseraArgs struct {
	metav1.TypeMeta

	ResourcePrefix  string
	NodePolicy      api.NodePolicy
	GPUPolicy       api.GPUPolicy
	PlacementPolicy string
	RecordSigning   api.RecordSigning
}

// ClusterConfig is the placement configuration the arguments describe.
func (a *TesseraArgs) ClusterConfig() api.ClusterConfig {
	return api.ClusterConfig{
		ResourcePrefix:  a.ResourcePrefix,
		NodePolicy:      a.NodePolicy,
		GPUPolicy:       a.GPUPolicy,
		PlacementPolicy: a.PlacementPolicy,
		RecordSigning:   a.RecordSigning,
	}
}

// DeepCopyObject implements runtime.Object.
func (a *TesseraArgs) DeepCopyObject() runtime.Object {
	if a == nil {
		return nil
	}
	out := *a
	return &out
}

// AddToScheme registers the internal TesseraArgs.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(SchemeGroupVersion.WithKind(Kind), &TesseraArgs{})
	return nil
}
