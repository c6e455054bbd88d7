package placement

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ReasonKind classifies why a pod does not fit a node.
type ReasonKind uint8

const (
	Fits ReasonKind = iota
	ReasonCPU
	ReasonMemory
	ReasonNoGPUs
	ReasonUnhealthy
	ReasonModelExcluded
	ReasonModelNotIncluded
	ReasonUUID
	ReasonSharingMode
	ReasonHeldWhole
	ReasonGPUMemory
	ReasonGPUMemoryPhysical
	ReasonGPUCores
	ReasonShares
	ReasonWholeGPUs
	ReasonGPUCount
	ReasonNUMA
	ReasonMIG
	ReasonMPSOneGPU
)

var reasonNames = [...]string{
	Fits:                    "Fits",
	ReasonCPU:               "InsufficientCPU",
	ReasonMemory:            "InsufficientMemory",
	ReasonNoGPUs:            "NoGPUs",
	ReasonUnhealthy:         "GPUsUnhealthy",
	ReasonModelExcluded:     "GPUModelExcluded",
	ReasonModelNotIncluded:  "GPUModelNotIncluded",
	ReasonUUID:              "GPUUUIDNotAllowed",
	ReasonSharingMode:       "GPUSharingMode",
	ReasonHeldWhole:         "GPUsHeldWhole",
	ReasonGPUMemory:         "InsufficientGPUMemory",
	ReasonGPUMemoryPhysical: "GPUMemoryTooSmall",
	ReasonGPUCores:          "InsufficientGPUCores",
	ReasonShares:            "GPUSharesExhausted",
	ReasonWholeGPUs:         "InsufficientWholeGPUs",
	ReasonGPUCount:          "InsufficientGPUs",
	ReasonNUMA:              "NUMABinding",
	ReasonMIG:               "MIGUnavailable",
	ReasonMPSOneGPU:         "MPSOneGPU",
}

// String is the kind's stable name, for metrics labels.
func (k ReasonKind) String() string {
	if int(k) < len(reasonNames) {
		return reasonNames[k]
	}
	return "Unknown(" + strconv.Itoa(int(k)) + ")"
}

// Reason says why a pod does not fit one node. It is a plain value so that
// fit checks build it without allocating; the text is made only when asked.
type Reason struct {
	Kind ReasonKind
	// Container is the container that could not be placed ("" for pod-wide reasons).
	Container string
	// Need is what the pod asks (MiB, millicores, percent or a GPU count)
	// and Have the best the node offers of it.
	Need, Have int64
	// Total is the number of GPUs concerned, when it matters.
	Total int
	// GPU is the GPU that offers Have; Detail a model name or selector.
	GPU, Detail string
}

// OK reports whether the pod fits.
func (r Reason) OK() bool { return r.Kind == Fits }

// String is the reason in words a user can act on.
func (r Reason) String() string {
	s := r.summary(true)
	if r.Container != "" {
		return "container " + strconv.Quote(r.Container) + ": " + s
	}
	return s
}

// summary renders the reason; with detail=false it leaves out the values
// that differ from node to node, so reasons can be grouped.
func (r Reason) summary(detail bool) string {
	switch r.Kind {
	case Fits:
		return "fits"
	case ReasonCPU:
		if detail {
			return fmt.Sprintf("insufficient CPU: pod needs %dm, node has %dm free", r.Need, r.Have)
		}
		return fmt.Sprintf("insufficient CPU (pod needs %dm, most free %dm)", r.Need, r.Have)
	case ReasonMemory:
		if detail {
			return fmt.Sprintf("insufficient memory: pod needs %d MiB, node has %d MiB free", r.Need, r.Have)
		}
		return fmt.Sprintf("insufficient memory (pod needs %d MiB, most free %d MiB)", r.Need, r.Have)
	case ReasonNoGPUs:
		return "node has no GPUs"
	case ReasonUnhealthy:
		return fmt.Sprintf("all %d GPUs unhealthy", r.Total)
	case ReasonModelExcluded:
		return fmt.Sprintf("GPU model %s excluded by nouse-gputype=%s", r.GPU, r.Detail)
	case ReasonModelNotIncluded:
		return fmt.Sprintf("GPU model %s not selected by use-gputype=%s", r.GPU, r.Detail)
	case ReasonUUID:
		return "no GPU allowed by the pod's GPU UUID selection (use-gpuuuid/nouse-gpuuuid)"
	case ReasonSharingMode:
		return "GPUs are in exclusive mode and take only whole-GPU requests"
	case ReasonHeldWhole:
		return fmt.Sprintf("every usable GPU is held whole by another pod (%d)", r.Total)
	case ReasonGPUMemory:
		if detail {
			return fmt.Sprintf("no GPU with %d MiB free; largest free is %d MiB on %s", r.Need, r.Have, shortUUID(r.GPU))
		}
		return fmt.Sprintf("no GPU with %d MiB free (largest %d MiB)", r.Need, r.Have)
	case ReasonGPUMemoryPhysical:
		return fmt.Sprintf("asks %d MiB per GPU but the largest GPU has %d MiB", r.Need, r.Have)
	case ReasonGPUCores:
		if detail {
			return fmt.Sprintf("no GPU with %d%% cores free; most free is %d%% on %s", r.Need, r.Have, shortUUID(r.GPU))
		}
		return fmt.Sprintf("no GPU with %d%% cores free (most %d%%)", r.Need, r.Have)
	case ReasonShares:
		return fmt.Sprintf("every GPU with room already holds its maximum number of shares (%d)", r.Have)
	case ReasonWholeGPUs:
		return fmt.Sprintf("needs %d whole free GPUs, %d of %d free", r.Need, r.Have, r.Total)
	case ReasonGPUCount:
		return fmt.Sprintf("needs %d GPUs with the requested share free, %d have it", r.Need, r.Have)
	case ReasonMPSOneGPU:
		return fmt.Sprintf("asks %d GPUs, but an MPS client uses one GPU (it connects to one GPU's control daemon)", r.Need)
	case ReasonMIG:
		return "no MIG device or instance fits: " + r.Detail
	case ReasonNUMA:
		return fmt.Sprintf("no NUMA node has %d suitable GPUs (NUMA binding requested), at most %d", r.Need, r.Have)
	}
	return r.Kind.String()
}

// shortUUID abbreviates a GPU UUID for messages ("GPU-3f2a9c…").
func shortUUID(u string) string {
	if len(u) > 10 {
		return u[:10] + "…"
	}
	return u
}

// Summarize groups per-node reasons the way kube-scheduler reports them:
// "0/12 nodes fit: 8 no GPU with 20000 MiB free (largest 16384 MiB), 4 GPU
// model T4 not selected by use-gputype=A100". Within a group Have is the
// best any node offers.
func Summarize(total int, reasons []Reason) string {
	type group struct {
		r     Reason
		count int
		text  string
	}
	groups := map[string]*group{}
	var keys []string
	for _, r := range reasons {
		g := r
		g.Have, g.GPU = 0, ""
		if g.Kind == ReasonModelExcluded || g.Kind == ReasonModelNotIncluded || g.Kind == ReasonUnhealthy {
			g.GPU, g.Total = r.GPU, r.Total
		} else {
			g.Total = 0
		}
		key := fmt.Sprintf("%d|%s|%d|%s|%s|%d", g.Kind, g.Container, g.Need, g.Detail, g.GPU, g.Total)
		gr := groups[key]
		if gr == nil {
			gr = &group{r: r, text: g.summary(false)}
			groups[key] = gr
			keys = append(keys, key)
		}
		gr.count++
		if r.Have > gr.r.Have {
			gr.r.Have = r.Have
		}
	}
	sort.SliceStable(keys, func(i, j int) bool {
		a, b := groups[keys[i]], groups[keys[j]]
		if a.count != b.count {
			return a.count > b.count
		}
		return a.text < b.text
	})
	var b strings.Builder
	fmt.Fprintf(&b, "0/%d nodes fit", total)
	for i, k := range keys {
		g := groups[k]
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d ", g.count)
		if g.r.Container != "" {
			b.WriteString("container " + strconv.Quote(g.r.Container) + " ")
		}
		b.WriteString(g.r.summary(false))
	}
	return b.String()
}
