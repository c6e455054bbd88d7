// Package nodelabels computes the Node labels the node agent keeps on its
// Node, named as NVIDIA's GPU feature discovery (GFD) names them, so node
// selectors and affinities written for GFD-labelled clusters select the
// same nodes under Tessera, plus Tessera's sharing mode. The package is
// pure: the agent passes what NVML reported and its inventory.
//
// The mapping from the guides' example labels is in docs/operations.md.
package nodelabels

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// The labels. GFD's names, prefix nvidia.com/.
const (
	Product         = "nvidia.com/gpu.product"
	Memory          = "nvidia.com/gpu.memory" // MiB
	Count           = "nvidia.com/gpu.count"
	Family          = "nvidia.com/gpu.family"
	ComputeMajor    = "nvidia.com/gpu.compute.major"
	ComputeMinor    = "nvidia.com/gpu.compute.minor"
	DriverMajor     = "nvidia.com/cuda.driver.major"
	DriverMinor     = "nvidia.com/cuda.driver.minor"
	DriverRev       = "nvidia.com/cuda.driver.rev"
	RuntimeMajor    = "nvidia.com/cuda.runtime.major"
	RuntimeMinor    = "nvidia.com/cuda.runtime.minor"
	MIGCapable      = "nvidia.com/mig.capable"
	SharingStrategy = "nvidia.com/gpu.sharing-strategy"
	// Sharing is Tessera's sharing mode of the node's GPUs (api.SharingMode).
	Sharing = "tessera.io/sharing"
)

// Managed lists every label the agent owns: one it does not compute now
// (the node lost its GPUs, a driver field is unknown) is removed.
var Managed = []string{Product, Memory, Count, Family, ComputeMajor, ComputeMinor, DriverMajor, DriverMinor,
	DriverRev, RuntimeMajor, RuntimeMinor, MIGCapable, SharingStrategy, Sharing}

// Driver is what NVML says of the driver.
type Driver struct {
	// Version is SystemGetDriverVersion ("550.54.15"); "" unknown.
	Version string
	// CUDA is SystemGetCudaDriverVersion (12040 = 12.4); 0 unknown.
	CUDA int
}

// For returns the labels of a node with the inventory inv (the first GPU
// describes the node when its GPUs differ, as GFD does; the count is of
// every GPU in the inventory).
func For(inv *api.NodeInventory, drv Driver) map[string]string {
	out := map[string]string{}
	if inv == nil || len(inv.GPUs) == 0 {
		return out
	}
	gpus := append([]api.GPU(nil), inv.GPUs...)
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	g := gpus[0]
	out[Product] = Sanitize(g.Model)
	out[Memory] = strconv.FormatInt(g.MemoryMiB, 10)
	out[Count] = strconv.Itoa(len(gpus))
	if major, minor, ok := strings.Cut(g.ComputeCapability, "."); ok {
		out[ComputeMajor], out[ComputeMinor] = major, minor
		if f := family(major, minor); f != "" {
			out[Family] = f
		}
	}
	parts := strings.Split(drv.Version, ".")
	if drv.Version != "" {
		keys := []string{DriverMajor, DriverMinor, DriverRev}
		for i, p := range parts {
			if i < len(keys) {
				out[keys[i]] = p
			}
		}
	}
	if drv.CUDA > 0 {
		out[RuntimeMajor] = strconv.Itoa(drv.CUDA / 1000)
		out[RuntimeMinor] = strconv.Itoa(drv.CUDA % 1000 / 10)
	}
	out[MIGCapable] = strconv.FormatBool(g.MIG.Capable)
	out[Sharing] = string(g.Sharing)
	out[SharingStrategy] = strategy(g.Sharing)
	return out
}

// strategy is GFD's nvidia.com/gpu.sharing-strategy for a mode.
func strategy(m api.SharingMode) string {
	switch m {
	case api.SharingMPS:
		return "mps"
	case api.SharingTimeSlicing:
		return "time-slicing"
	default:
		// Tessera's shared mode, exclusive GPUs and MIG have no GFD value;
		// Tessera's own label tells them apart.
		return "none"
	}
}

// family is the architecture by compute capability, GFD's values.
func family(major, minor string) string {
	switch major {
	case "6":
		return "pascal"
	case "7":
		if minor == "5" {
			return "turing"
		}
		return "volta"
	case "8":
		if minor == "9" {
			return "ada-lovelace"
		}
		return "ampere"
	case "9":
		return "hopper"
	case "10", "12":
		return "blackwell"
	}
	return ""
}

// Sanitize makes a product name a label value: spaces become '-', any
// other character not allowed in a label value is dropped, and the value
// is cut to 63 characters ("NVIDIA A100-SXM4-40GB" → "NVIDIA-A100-SXM4-40GB").
func Sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.TrimSpace(s) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		}
	}
	v := strings.Trim(b.String(), "-_.")
	if len(v) > 63 {
		v = strings.Trim(v[:63], "-_.")
	}
	return v
}

// Patch is the metadata.labels part of a JSON merge patch that makes
// current carry want: changed or new labels set, managed labels not in
// want removed (null). It is nil when nothing changes.
func Patch(current, want map[string]string) map[string]any {
	p := map[string]any{}
	for k, v := range want {
		if cur, ok := current[k]; !ok || cur != v {
			p[k] = v
		}
	}
	for _, k := range Managed {
		if _, ok := want[k]; ok {
			continue
		}
		if _, ok := current[k]; ok {
			p[k] = nil
		}
	}
	if len(p) == 0 {
		return nil
	}
	return p
}

// Describe is one line for logs: the labels sorted.
func Describe(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%s", k, l[k])
	}
	return strings.Join(parts, ",")
}
