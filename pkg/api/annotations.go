package api

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
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

// AnnotationPreload on a pod lists libraries its containers' images
// preload through their own /etc/ld.so.preload (jemalloc, tcmalloc): the
// node agent mounts its own preload list over that file (naming the GPU
// limiter) and cannot read the image, so the pod declares them here and
// the agent writes them after the limiter in each limited container's
// list. Comma- or newline-separated absolute paths (ParsePreloads).
const AnnotationPreload = "tessera.io/preload"

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

// Limits of the placement annotations a pod sets. The values are hostile
// input read by the webhook and by every scheduling cycle, so they are
// bounded and parsed in time linear in their length: a selector list far
// longer than any real one (a cluster has a few GPU models, a node at most
// MaxGPUsPerNode GPUs) is refused, not scanned.
const (
	// MaxSelectorValueBytes bounds the value of one placement annotation.
	MaxSelectorValueBytes = 16 << 10
	// MaxSelectorEntries bounds the entries of one selector list.
	MaxSelectorEntries = 512
)

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
	if s.IncludeModels, err = parseListAnnotation(annotations, AnnotationUseGPUType, foldKey); err != nil {
		return PodSelectors{}, err
	}
	if s.ExcludeModels, err = parseListAnnotation(annotations, AnnotationNoUseGPUType, foldKey); err != nil {
		return PodSelectors{}, err
	}
	if s.IncludeUUIDs, err = parseListAnnotation(annotations, AnnotationUseGPUUUID, exactKey); err != nil {
		return PodSelectors{}, err
	}
	if s.ExcludeUUIDs, err = parseListAnnotation(annotations, AnnotationNoUseGPUUUID, exactKey); err != nil {
		return PodSelectors{}, err
	}
	if m, ok := firstCommon(s.IncludeModels, s.ExcludeModels, foldKey); ok {
		return PodSelectors{}, fmt.Errorf("GPU model %q is both selected (%s) and excluded (%s)", m, AnnotationUseGPUType, AnnotationNoUseGPUType)
	}
	if u, ok := firstCommon(s.IncludeUUIDs, s.ExcludeUUIDs, exactKey); ok {
		return PodSelectors{}, fmt.Errorf("GPU UUID %q is both selected (%s) and excluded (%s)", u, AnnotationUseGPUUUID, AnnotationNoUseGPUUUID)
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
		raw := annotations[k]
		if len(raw) > MaxSelectorValueBytes {
			return "", "", fmt.Errorf("annotation %s is %d bytes, more than the limit of %d", k, len(raw), MaxSelectorValueBytes)
		}
		v := strings.TrimSpace(raw)
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
// alias), dropping blank entries and duplicates (entries with the same key),
// in time linear in the value's length.
func parseListAnnotation(annotations map[string]string, key string, keyOf func(string) string) ([]string, error) {
	found, v, err := lookupAnnotation(annotations, key)
	if err != nil || v == "" {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" || seen[keyOf(e)] {
			continue
		}
		if len(out) == MaxSelectorEntries {
			return nil, fmt.Errorf("annotation %s lists more than %d distinct entries", found, MaxSelectorEntries)
		}
		seen[keyOf(e)] = true
		out = append(out, e)
	}
	return out, nil
}

// firstCommon returns the first entry of a whose key is also one of b's.
func firstCommon(a, b []string, keyOf func(string) string) (string, bool) {
	keys := make(map[string]bool, len(b))
	for _, x := range b {
		keys[keyOf(x)] = true
	}
	for _, x := range a {
		if keys[keyOf(x)] {
			return x, true
		}
	}
	return "", false
}

func exactKey(s string) string { return s }

// foldKey maps s to a key that two strings share exactly when
// strings.EqualFold reports them equal: every rune is replaced by the
// smallest rune of its simple case-folding orbit.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		b.WriteRune(m)
	}
	return b.String()
}

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
