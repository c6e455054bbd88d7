package scheduler

// Nodes in mode dra (docs/dra.md): their GPUs are allocated through
// ResourceClaims by kube-scheduler's DynamicResources plugin, never by
// the placement core, so the core holds them without GPUs. A pod asking
// whole GPUs (nvidia.com/gpu alone) may go there: the DeviceClass that
// maps the extended resource (KEP-5004) serves it and the pod gets no
// allocation record. A pod asking a share, a MIG device or GPU selectors
// the mapping cannot honour is kept off with a reason it sees.

import (
	"fmt"
	"math"
	"strings"

	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// draUnfit says why a request cannot be served by a DRA node's
// extended-resource mapping ("" when it can: whole GPUs only).
func draUnfit(r *placement.Request, gpu string) string {
	var why []string
	for _, cs := range [][]placement.Container{r.InitContainers, r.Containers} {
		for _, c := range cs {
			if c.GPUs == 0 {
				continue
			}
			switch {
			case c.MIGProfile != "":
				why = append(why, fmt.Sprintf("container %q asks MIG profile %s", c.Name, c.MIGProfile))
			case c.MemoryMiB > 0:
				why = append(why, fmt.Sprintf("container %q asks %d MiB of GPU memory", c.Name, c.MemoryMiB))
			case c.MemoryPercent > 0 && c.MemoryPercent < 100:
				why = append(why, fmt.Sprintf("container %q asks %d%% of GPU memory", c.Name, c.MemoryPercent))
			case c.Cores > 0 && c.Cores < api.MaxCores:
				why = append(why, fmt.Sprintf("container %q asks %d%% of GPU cores", c.Name, c.Cores))
			}
		}
	}
	if len(r.IncludeModels)+len(r.ExcludeModels)+len(r.IncludeUUIDs)+len(r.ExcludeUUIDs) > 0 || r.NUMABind {
		why = append(why, "the pod selects GPUs by type, UUID or NUMA node")
	}
	if len(why) == 0 {
		return ""
	}
	return fmt.Sprintf("node serves its GPUs through DRA (mode %s) and gives %s only whole GPUs through DeviceClass %s: %s; ask with a ResourceClaim for capacity memory and cores there (docs/dra.md)",
		api.ModeDRA, gpu, api.DeviceClassExtendedResource, strings.Join(why, ", "))
}

// draScore is Score's answer for a node in mode dra: a whole-GPU pod
// goes there only when no node Tessera places on fits it (or it selects
// the node), so the packing of device-plugin nodes stays Tessera's.
const draScore = math.MinInt64

// isDRA reports whether the node is in mode dra; the caller holds st.mu.
func (s *state) isDRA(node string) bool { return s.mode[node] == api.ModeDRA }

// onDRA reports whether the node is in mode dra.
func (p *Plugin) onDRA(node string) bool {
	p.st.mu.RLock()
	defer p.st.mu.RUnlock()
	return p.st.isDRA(node)
}

// filterDRA is Filter's (and Reserve's) answer on a node in mode dra.
func (s *cycleState) filterDRA() *fwk.Status {
	if s.draWhy == "" {
		return nil
	}
	s.mu.Lock()
	s.draNodes++
	s.mu.Unlock()
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node serves GPUs through DRA: whole GPUs only")
}

// summary is PostFilter's text: the placement core's reasons, then the
// nodes in mode dra that refused the pod.
func (s *cycleState) summary(reasons []placement.Reason) string {
	s.mu.Lock()
	n := s.draNodes
	s.mu.Unlock()
	if n == 0 {
		return placement.Summarize(max(s.total, len(reasons)), reasons)
	}
	if len(reasons) == 0 {
		return fmt.Sprintf("0/%d nodes fit: %d %s", s.total, n, s.draWhy)
	}
	return fmt.Sprintf("%s; %d %s", placement.Summarize(max(s.total, len(reasons)+n), reasons), n, s.draWhy)
}
