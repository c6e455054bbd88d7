// Package resourcesfit is the profile's NodeResourcesFit,
// TesseraNodeResourcesFit: kube-scheduler's own plugin, with the ignored
// resources taken out of the pod once per scheduling cycle instead of
// skipped on every node.
package resourcesfit

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// Name is the plugin's name in KubeSchedulerConfiguration.
//
// Why the plugin exists: NodeResourcesFit's Filter checks each requested extended resource
// name against a regular expression on every node it visits, before it
// looks at ignoredResources. A Tessera pod names two or three
// pseudo-resources besides nvidia.com/gpu, so that check cost ~0.7 ms of
// CPU per pod on 1,000 nodes (docs/benchmarks.md), more than the Tessera
// plugin's own Filter. Removed before PreFilter computes the request, the
// pseudo-resources cost nothing per node; what the plugin decides is the
// same, because an ignored resource is never checked either way.
const Name = "TesseraNodeResourcesFit"

// fitPlugin is what the profile uses of NodeResourcesFit.
type fitPlugin interface {
	fwk.PreFilterPlugin
	fwk.FilterPlugin
	fwk.PreScorePlugin
	fwk.ScorePlugin
	fwk.EnqueueExtensions
	fwk.SignPlugin
}

// resourcesFit embeds the upstream plugin: every extension point but
// PreFilter is NodeResourcesFit's own.
type resourcesFit struct {
	fitPlugin
	stripper
}

// stripper takes the ignored resources out of a pod.
type stripper struct {
	ignored      map[corev1.ResourceName]bool
	ignoredGroup map[string]bool
}

func newStripper(names, groups []string) stripper {
	s := stripper{ignored: map[corev1.ResourceName]bool{}, ignoredGroup: map[string]bool{}}
	for _, n := range names {
		s.ignored[corev1.ResourceName(n)] = true
	}
	for _, g := range groups {
		s.ignoredGroup[g] = true
	}
	return s
}

var (
	_ fwk.PreFilterPlugin   = (*resourcesFit)(nil)
	_ fwk.FilterPlugin      = (*resourcesFit)(nil)
	_ fwk.EnqueueExtensions = (*resourcesFit)(nil)
)

// New is the plugin factory. Its arguments are
// NodeResourcesFitArgs (kubescheduler.config.k8s.io/v1), defaulted and
// validated as kube-scheduler does for NodeResourcesFit.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	var v1args configv1.NodeResourcesFitArgs
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &v1args); err != nil {
			return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
		}
	}
	scheme.Scheme.Default(&v1args)
	var args schedconfig.NodeResourcesFitArgs
	if err := scheme.Scheme.Convert(&v1args, &args, nil); err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
	}
	if err := validation.ValidateNodeResourcesFitArgs(nil, &args); err != nil {
		return nil, fmt.Errorf("%s plugin arguments: %w", Name, err)
	}
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	inner, err := noderesources.NewFit(ctx, &args, h, fts)
	if err != nil {
		return nil, err
	}
	f, ok := inner.(fitPlugin)
	if !ok {
		return nil, fmt.Errorf("%s: NodeResourcesFit no longer implements the extension points it wraps", Name)
	}
	return &resourcesFit{fitPlugin: f, stripper: newStripper(args.IgnoredResources, args.IgnoredResourceGroups)}, nil
}

func (r *resourcesFit) Name() string { return Name }

// PreFilter hands NodeResourcesFit the pod without its ignored resources.
func (r *resourcesFit) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	return r.fitPlugin.PreFilter(ctx, cs, r.withoutIgnored(pod), nodes)
}

func (r *stripper) isIgnored(name corev1.ResourceName) bool {
	if r.ignored[name] {
		return true
	}
	group, _, ok := strings.Cut(string(name), "/")
	return ok && r.ignoredGroup[group]
}

// withoutIgnored returns the pod itself when it requests no ignored
// resource, else a copy whose containers' and pod-level requests and
// limits lack them (the original is shared with the informer's cache and
// must not change).
func (r *stripper) withoutIgnored(pod *corev1.Pod) *corev1.Pod {
	if !r.requestsIgnored(pod) {
		return pod
	}
	cp := *pod
	cp.Spec.Containers = r.containersWithout(pod.Spec.Containers)
	cp.Spec.InitContainers = r.containersWithout(pod.Spec.InitContainers)
	if pod.Spec.Resources != nil {
		res := r.requirementsWithout(*pod.Spec.Resources)
		cp.Spec.Resources = &res
	}
	return &cp
}

func (r *stripper) requestsIgnored(pod *corev1.Pod) bool {
	has := func(rr corev1.ResourceRequirements) bool {
		for n := range rr.Requests {
			if r.isIgnored(n) {
				return true
			}
		}
		for n := range rr.Limits {
			if r.isIgnored(n) {
				return true
			}
		}
		return false
	}
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if has(cs[i].Resources) {
				return true
			}
		}
	}
	return pod.Spec.Resources != nil && has(*pod.Spec.Resources)
}

func (r *stripper) containersWithout(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i := range cs {
		out[i] = cs[i]
		out[i].Resources = r.requirementsWithout(cs[i].Resources)
	}
	return out
}

func (r *stripper) requirementsWithout(rr corev1.ResourceRequirements) corev1.ResourceRequirements {
	filter := func(l corev1.ResourceList) corev1.ResourceList {
		if l == nil {
			return nil
		}
		out := make(corev1.ResourceList, len(l))
		for n, q := range l {
			if !r.isIgnored(n) {
				out[n] = q
			}
		}
		return out
	}
	rr.Requests = filter(rr.Requests)
	rr.Limits = filter(rr.Limits)
	return rr
}
