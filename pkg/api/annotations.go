package api

import (
	"fmt"
	"slices"
	"strings"
)

// Annotation keys Tessera writes. Every annotation key of the project is
// defined in this file.
const (
	// AnnotationInventory is set on a Node by the node agent; its value is
	// an encoded NodeInventory (EncodeInventory).
	AnnotationInventory = "tessera.io/gpu-inventory"
	// AnnotationAllocation is set on a Pod by the scheduler; its value is an
	// encoded PodAllocation (EncodeAllocation).
	AnnotationAllocation = "tessera.io/allocation"
)

// Pod annotation keys users write to constrain placement. Each has a HAMi
// alias (see AliasesOf) so HAMi manifests keep working.
const (
	// AnnotationUseGPUType restricts the pod to GPU models matching one of
	// a comma-separated list of selectors (see ModelMatches).
	AnnotationUseGPUType = "tessera.io/use-gputype"
	// AnnotationNoUseGPUType excludes GPU models matching any selector.
	AnnotationNoUseGPUType = "tessera.io/nouse-gputype"
	// AnnotationUseGPUUUID restricts the pod to the listed GPU UUIDs.
	AnnotationUseGPUUUID = "tessera.io/use-gpuuuid"
	// AnnotationNoUseGPUUUID excludes the listed GPU UUIDs.
	AnnotationNoUseGPUUUID = "tessera.io/nouse-gpuuuid"
	// AnnotationNodePolicy overrides the cluster's node policy for the pod.
	AnnotationNodePolicy = "tessera.io/node-policy"
	// AnnotationGPUPolicy overrides the cluster's GPU policy for the pod.
	AnnotationGPUPolicy = "tessera.io/gpu-policy"
	// AnnotationNUMABind ("true"/"false") requires all GPUs of each
	// container to sit on one NUMA node.
	AnnotationNUMABind = "tessera.io/numa-bind"
)

// annotationAliases maps each Tessera pod annotation key to the HAMi keys
// accepted with the same meaning on input. Tessera never writes the aliases.
var annotationAliases = map[string][]string{
	AnnotationUseGPUType:   {"nvidia.com/use-gputype"},
	AnnotationNoUseGPUType: {"nvidia.com/nouse-gputype"},
	AnnotationUseGPUUUID:   {"nvidia.com/use-gpuuuid"},
	AnnotationNoUseGPUUUID: {"nvidia.com/nouse-gpuuuid"},
	AnnotationNodePolicy:   {"hami.io/node-scheduler-policy"},
	AnnotationGPUPolicy:    {"hami.io/gpu-scheduler-policy"},
	AnnotationNUMABind:     {"nvidia.com/numa-bind"},
}

// PodSelectorAnnotations returns the Tessera pod annotation keys that
// ParsePodSelectors reads (aliases excluded), in a fixed order, for tests
// and documentation to iterate.
func PodSelectorAnnotations() []string {
	return []string{
		AnnotationUseGPUType, AnnotationNoUseGPUType,
		AnnotationUseGPUUUID, AnnotationNoUseGPUUUID,
		AnnotationNodePolicy, AnnotationGPUPolicy,
		AnnotationNUMABind,
	}
}

// AliasesOf returns the other keys accepted on input for the Tessera
// annotation key, or nil if it has none. The result is a copy.
func AliasesOf(key string) []string {
	return slices.Clone(annotationAliases[key])
}

// PodSelectors are the placement constraints a pod states in annotations.
// Zero values mean "no constraint": empty lists select every GPU, empty
// policies defer to the cluster configuration.
type PodSelectors struct {
	// IncludeModels and ExcludeModels are model selectors (ModelMatches).
	IncludeModels []string
	ExcludeModels []string
	// IncludeUUIDs and ExcludeUUIDs are GPU UUIDs.
	IncludeUUIDs []string
	ExcludeUUIDs []string
	NodePolicy   NodePolicy
	GPUPolicy    GPUPolicy
	NUMABind     bool
}

// ParsePodSelectors reads the pod's placement annotations, accepting HAMi's
// keys as aliases. A value that is empty or blank counts as unset. If a key
// and its alias are both set to different values the pod's intent is
// ambiguous and an error names both; if they agree, either is used.
//
// Lists are comma-separated; entries are trimmed, empty entries dropped and
// duplicates removed keeping the first occurrence (models compare
// case-insensitively, UUIDs exactly).
func ParsePodSelectors(annotations map[string]string) (PodSelectors, error) {
	var s PodSelectors
	var err error
	if s.IncludeModels, err = parseListAnnotation(annotations, AnnotationUseGPUType, strings.EqualFold); err != nil {
		return PodSelectors{}, err
	}
	if s.ExcludeModels, err = parseListAnnotation(annotations, AnnotationNoUseGPUType, strings.EqualFold); err != nil {
		return PodSelectors{}, err
	}
	if s.IncludeUUIDs, err = parseListAnnotation(annotations, AnnotationUseGPUUUID, equalExact); err != nil {
		return PodSelectors{}, err
	}
	if s.ExcludeUUIDs, err = parseListAnnotation(annotations, AnnotationNoUseGPUUUID, equalExact); err != nil {
		return PodSelectors{}, err
	}
	for _, m := range s.IncludeModels {
		if slices.ContainsFunc(s.ExcludeModels, func(x string) bool { return strings.EqualFold(x, m) }) {
			return PodSelectors{}, fmt.Errorf("GPU model %q is both selected (%s) and excluded (%s)", m, AnnotationUseGPUType, AnnotationNoUseGPUType)
		}
	}
	for _, u := range s.IncludeUUIDs {
		if slices.Contains(s.ExcludeUUIDs, u) {
			return PodSelectors{}, fmt.Errorf("GPU UUID %q is both selected (%s) and excluded (%s)", u, AnnotationUseGPUUUID, AnnotationNoUseGPUUUID)
		}
	}

	key, v, err := lookupAnnotation(annotations, AnnotationNodePolicy)
	if err != nil {
		return PodSelectors{}, err
	}
	if v != "" {
		p := NodePolicy(v)
		if !p.Valid() {
			return PodSelectors{}, fmt.Errorf("annotation %s: node policy %q is not one of %s", key, v, joinQuoted(NodePolicies()))
		}
		s.NodePolicy = p
	}

	key, v, err = lookupAnnotation(annotations, AnnotationGPUPolicy)
	if err != nil {
		return PodSelectors{}, err
	}
	if v != "" {
		p := GPUPolicy(v)
		if !p.Valid() {
			return PodSelectors{}, fmt.Errorf("annotation %s: GPU policy %q is not one of %s", key, v, joinQuoted(GPUPolicies()))
		}
		s.GPUPolicy = p
	}

	key, v, err = lookupAnnotation(annotations, AnnotationNUMABind)
	if err != nil {
		return PodSelectors{}, err
	}
	if v != "" {
		switch strings.ToLower(v) {
		case "true", "1":
			s.NUMABind = true
		case "false", "0":
			s.NUMABind = false
		default:
			return PodSelectors{}, fmt.Errorf("annotation %s: %q is not a boolean (use \"true\" or \"false\")", key, v)
		}
	}
	return s, nil
}

// lookupAnnotation returns the trimmed value of key or of one of its
// aliases, and the key it was found under. Blank values count as unset.
func lookupAnnotation(annotations map[string]string, key string) (foundKey, value string, err error) {
	for _, k := range append([]string{key}, annotationAliases[key]...) {
		v := strings.TrimSpace(annotations[k])
		if v == "" {
			continue
		}
		if foundKey == "" {
			foundKey, value = k, v
			continue
		}
		if v != value {
			return "", "", fmt.Errorf("annotations %s=%q and %s=%q disagree; set only one", foundKey, value, k, v)
		}
	}
	return foundKey, value, nil
}

// parseListAnnotation reads a comma-separated list annotation (or its
// alias), dropping blank entries and duplicates under equal.
func parseListAnnotation(annotations map[string]string, key string, equal func(a, b string) bool) ([]string, error) {
	_, v, err := lookupAnnotation(annotations, key)
	if err != nil || v == "" {
		return nil, err
	}
	var out []string
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" || slices.ContainsFunc(out, func(x string) bool { return equal(x, e) }) {
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

func equalExact(a, b string) bool { return a == b }

// joinQuoted formats names as "a", "b" or "c" for error messages.
func joinQuoted[S ~string](names []S) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", string(n))
	}
	switch len(q) {
	case 0:
		return ""
	case 1:
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
