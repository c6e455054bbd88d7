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
	ReasonMemoryOvercommitted

	// numReasonKinds counts the kinds; it sizes the table of their texts.
	numReasonKinds
)

// ReasonText is what every caller says about a kind of reason, beside the
// reason's own words (Reason.String, Summarize): one table, so that the
// scheduler's events, `kubectl tessera why` and the metrics cannot drift
// apart.
type ReasonText struct {
	// Name is the kind's stable name, for metrics labels (String).
	Name string
	// Short is the kind in a few words: the scheduler's per-node status,
	// which kube-scheduler counts in the FailedScheduling event ("3 not
	// enough free GPU memory").
	Short string
	// Hint is what a user can do about it (`kubectl tessera why`); empty
	// where Tessera has nothing to add to kube-scheduler's own message.
	Hint string
	// Unresolvable: removing pods from the node cannot cure it, so
	// preemption does not try.
	Unresolvable bool
}

// Texts shared by several kinds.
const (
	shortCPUOrMemory  = "not enough CPU or memory"
	shortSelection    = "GPUs not selected by the pod's GPU selectors"
	shortGPUMemory    = "not enough free GPU memory"
	shortGPUs         = "not enough free GPUs"
	hintWaitOrSmaller = "wait for GPU pods there to end, or ask for a smaller share (nvidia.com/gpumem, nvidia.com/gpucores)"
	hintFewerGPUs     = "fewer GPUs per container, or wait for GPUs there to free"
	hintSelection     = "the pod's GPU selection (use-gputype/nouse-gputype/use-gpuuuid annotations) excludes these GPUs"
)

// reasonTexts has an entry for every kind (TestEveryReasonKindHasText).
var reasonTexts = [numReasonKinds]ReasonText{
	Fits:         {Name: "Fits"},
	ReasonCPU:    {Name: "InsufficientCPU", Short: shortCPUOrMemory},
	ReasonMemory: {Name: "InsufficientMemory", Short: shortCPUOrMemory},
	ReasonNoGPUs: {Name: "NoGPUs", Short: "node has no Tessera GPUs", Unresolvable: true,
		Hint: "the node has no GPUs Tessera offers"},
	ReasonUnhealthy: {Name: "GPUsUnhealthy", Short: "GPUs unhealthy", Unresolvable: true,
		Hint: "the GPUs there are unhealthy: `kubectl tessera nodes` shows why; the node agent marks them healthy after the recovery period"},
	ReasonModelExcluded:    {Name: "GPUModelExcluded", Short: shortSelection, Unresolvable: true, Hint: hintSelection},
	ReasonModelNotIncluded: {Name: "GPUModelNotIncluded", Short: shortSelection, Unresolvable: true, Hint: hintSelection},
	ReasonUUID:             {Name: "GPUUUIDNotAllowed", Short: shortSelection, Unresolvable: true, Hint: hintSelection},
	ReasonSharingMode: {Name: "GPUSharingMode", Short: "GPUs offered only whole (exclusive mode)",
		Hint: "ask for a whole GPU (nvidia.com/gpu: 1 without gpumem) or use nodes in shared mode"},
	ReasonHeldWhole: {Name: "GPUsHeldWhole", Short: "GPUs held whole by other pods", Hint: hintWaitOrSmaller},
	ReasonGPUMemory: {Name: "InsufficientGPUMemory", Short: shortGPUMemory, Hint: hintWaitOrSmaller},
	ReasonGPUMemoryPhysical: {Name: "GPUMemoryTooSmall", Short: shortGPUMemory, Unresolvable: true,
		Hint: "the request is larger than any GPU there: ask for less memory per GPU or more GPUs"},
	ReasonGPUCores:  {Name: "InsufficientGPUCores", Short: "not enough free GPU cores", Hint: hintWaitOrSmaller},
	ReasonShares:    {Name: "GPUSharesExhausted", Short: "GPU share slots exhausted", Hint: hintWaitOrSmaller},
	ReasonWholeGPUs: {Name: "InsufficientWholeGPUs", Short: shortGPUs, Hint: hintFewerGPUs},
	ReasonGPUCount:  {Name: "InsufficientGPUs", Short: shortGPUs, Hint: hintFewerGPUs},
	ReasonNUMA: {Name: "NUMABinding", Short: "no NUMA node with enough suitable GPUs",
		Hint: "drop the NUMA binding or ask for fewer GPUs"},
	// The MIG and MPS kinds keep the scheduler's wording from before this
	// table (its generic "does not fit" and the kind's name).
	ReasonMIG: {Name: "MIGUnavailable", Short: "GPU request does not fit: MIGUnavailable",
		Hint: "ask for a MIG profile the nodes offer, or wait for MIG devices to free"},
	ReasonMPSOneGPU: {Name: "MPSOneGPU", Short: "GPU request does not fit: MPSOneGPU",
		Hint: "an MPS client uses one GPU: ask for one GPU, or use nodes not in mps mode"},
	ReasonMemoryOvercommitted: {Name: "GPUMemoryOvercommitted", Short: "GPU memory overcommitted (no room for a guarantee)", Unresolvable: true,
		Hint: "a memory ceiling (nvidia.com/gpumem-ceiling) needs GPUs whose memory is not overcommitted: nodes with memoryOvercommit 1.0, or drop the ceiling"},
}

// Text is the kind's entry in the one table of reason texts. A kind
// outside the table (none is) gets its number as its name.
func (k ReasonKind) Text() ReasonText {
	if k < numReasonKinds && k != Fits {
		return reasonTexts[k]
	}
	name := reasonTexts[Fits].Name
	if k != Fits {
		name = "Unknown(" + strconv.Itoa(int(k)) + ")"
	}
	return ReasonText{Name: name, Short: "GPU request does not fit: " + name}
}

// String is the kind's stable name, for metrics labels.
func (k ReasonKind) String() string { return k.Text().Name }

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
	case ReasonMemoryOvercommitted:
		return fmt.Sprintf("asks a memory ceiling of %d MiB, but the memory of its %d usable GPUs is overcommitted (memoryOvercommit above 1), so no guarantee holds there", r.Need, r.Total)
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
