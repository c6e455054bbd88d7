package resourcesfit

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// DRAName is the profile's DynamicResources, TesseraDynamicResources:
// kube-scheduler's own plugin, handed the pod without Tessera's
// pseudo-resources in PreFilter.
//
// Why: with the extended-resource mapping (KEP-5004) DynamicResources
// checks every extended resource a pod asks against the node's
// allocatable and the DeviceClasses that map one, and finds a node that
// serves nvidia.com/gpu through DRA unfit for nvidia.com/gpumem-percentage
// (which the webhook writes into every GPU pod and no node advertises:
// "cannot fit resource"). Without them an unchanged nvidia.com/gpu pod
// gets its GPUs on a DRA node through the mapped class (docs/dra.md).
const DRAName = "TesseraDynamicResources"

// DRAArgs are DynamicResourcesArgs and the resources to take out.
type DRAArgs struct {
	metav1.TypeMeta
	FilterTimeout    *metav1.Duration `json:"filterTimeout,omitempty"`
	BindingTimeout   *metav1.Duration `json:"bindingTimeout,omitempty"`
	IgnoredResources []string         `json:"ignoredResources,omitempty"`
}

// DeepCopyObject makes DRAArgs a runtime.Object.
func (a *DRAArgs) DeepCopyObject() runtime.Object {
	c := *a
	c.IgnoredResources = append([]string(nil), a.IgnoredResources...)
	return &c
}

type dynamicResources struct {
	*dynamicresources.DynamicResources
	stripper
	// What Filter builds its allocator with where pods were taken off
	// or put on a node (draoverlay.go); fh is nil when DRA is off.
	fh       fwk.Handle
	features structured.Features
	celCache *cel.Cache
}

// NewDRA is the plugin factory.
func NewDRA(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	var a DRAArgs
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &a); err != nil {
			return nil, fmt.Errorf("%s plugin arguments: %w", DRAName, err)
		}
	}
	v1args := configv1.DynamicResourcesArgs{FilterTimeout: a.FilterTimeout, BindingTimeout: a.BindingTimeout}
	scheme.Scheme.Default(&v1args)
	var args schedconfig.DynamicResourcesArgs
	if err := scheme.Scheme.Convert(&v1args, &args, nil); err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", DRAName, err)
	}
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	inner, err := dynamicresources.New(ctx, &args, h, fts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", DRAName, err)
	}
	d, ok := inner.(*dynamicresources.DynamicResources)
	if !ok {
		return nil, fmt.Errorf("%s: DynamicResources is a %T", DRAName, inner)
	}
	out := &dynamicResources{DynamicResources: d, stripper: newStripper(a.IgnoredResources, nil)}
	if fts.EnableDynamicResourceAllocation && h.SharedDRAManager() != nil {
		out.fh = h
		out.features, out.celCache = newOverlayParts(fts)
	}
	return out, nil
}

func (d *dynamicResources) Name() string { return DRAName }

// PreFilter hands DynamicResources the pod without the ignored resources.
// For a pod with claims it also starts the cycle's overlay
// (draoverlay.go), so that the copies of the state a preemption's dry
// runs take read the allocated devices once, not once per node.
func (d *dynamicResources) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if d.fh != nil && len(pod.Spec.ResourceClaims) > 0 {
		cs.Write(overlayKey, &draOverlay{base: &draBase{}, nodes: map[string]*nodeOverlay{}})
	}
	return d.DynamicResources.PreFilter(ctx, cs, d.withoutIgnored(pod), nodes)
}
