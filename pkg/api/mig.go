package api

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxMIGDevicesPerGPU bounds the MIG devices one GPU may list (NVIDIA's
// GPUs hold at most 7 GPU instances).
const MaxMIGDevicesPerGPU = 8

// MaxMIGSlices bounds a MIG placement's start (GPUs have at most 8 memory
// slices).
const MaxMIGSlices = 8

// ParseMIGProfile checks a MIG GPU-instance profile name as NVIDIA writes
// it in mig-parted configs and resource names ("1g.5gb", "3g.20gb",
// "1g.5gb+me") and returns its compute slices, nominal memory in GB and
// whether it has media extensions. Compute-instance names ("1c.3g.20gb")
// are refused with a message saying why: Tessera creates one compute
// instance per GPU instance.
func ParseMIGProfile(name string) (compute, memoryGB int, media bool, err error) {
	s, media := strings.CutSuffix(name, "+me")
	parts := strings.Split(s, ".")
	if len(parts) == 3 && strings.HasSuffix(parts[0], "c") {
		return 0, 0, false, fmt.Errorf("MIG profile %q names a compute instance inside a GPU instance; Tessera creates one compute instance per GPU instance, so name the GPU-instance profile (%q)", name, parts[1]+"."+parts[2])
	}
	bad := fmt.Errorf("MIG profile %q is not of the form <compute>g.<memory>gb (e.g. \"1g.5gb\", \"1g.5gb+me\")", name)
	if len(parts) != 2 {
		return 0, 0, false, bad
	}
	g, okG := strings.CutSuffix(parts[0], "g")
	gb, okGB := strings.CutSuffix(parts[1], "gb")
	compute, errC := strconv.Atoi(g)
	memoryGB, errM := strconv.Atoi(gb)
	if !okG || !okGB || errC != nil || errM != nil || compute < 1 || compute > MaxMIGSlices || memoryGB < 1 ||
		strconv.Itoa(compute) != g || strconv.Itoa(memoryGB) != gb {
		return 0, 0, false, bad
	}
	return compute, memoryGB, media, nil
}

// migResourcePrefix starts the name of a MIG device resource under NVIDIA's
// mixed strategy: <prefix>/mig-<profile>, e.g. nvidia.com/mig-1g.5gb.
const migResourcePrefix = "mig-"

// MIG returns the resource name of a MIG profile under the mixed strategy
// (e.g. "nvidia.com/mig-1g.5gb"). A profile with media extensions is
// written with ".me" ("nvidia.com/mig-1g.5gb.me"): Kubernetes resource
// names cannot hold "+".
func (n ResourceNames) MIG(profile string) string {
	return n.Prefix + "/" + migResourcePrefix + strings.Replace(profile, "+me", ".me", 1)
}

// MIGProfileOf returns the profile named by a mixed-strategy MIG resource
// under n's prefix ("nvidia.com/mig-1g.5gb" → "1g.5gb"), and whether name
// is one.
func (n ResourceNames) MIGProfileOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, n.Prefix+"/"+migResourcePrefix)
	if !ok {
		return "", false
	}
	if p, ok := strings.CutSuffix(rest, ".me"); ok {
		rest = p + "+me"
	} else if strings.Contains(rest, "+") {
		return "", false
	}
	if _, _, _, err := ParseMIGProfile(rest); err != nil {
		return "", false
	}
	return rest, true
}
