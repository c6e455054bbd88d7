package webhook

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
)

// QuotaMemoryResource is the resource a ResourceQuota counts to cap a
// namespace's GPU memory: the mutating webhook writes it on every GPU
// container as equal request and limit, in bytes, resolved from whatever
// form the container asked in (docs/operations.md, "Quotas"):
//
//	requests.tessera.io/gpu-memory: 40Gi
//
// Kubernetes' own ResourceQuota admission then charges it, exactly and
// under concurrent creations (it updates the quota's usage with an
// optimistic-concurrency write per admitted pod), and refuses a pod over
// the quota with a message naming the quota, the used and the asked
// amounts. The scheduler ignores the resource (NodeResourcesFit
// ignoredResources) and the kubelet drops extended resources no node
// advertises before its admission check, so the request places nothing.
const QuotaMemoryResource = "tessera.io/gpu-memory"

// chargedMiB is what one container is charged, in MiB: per GPU its
// memory in MiB, or its percentage of the largest GPU in the cluster (the
// model is picked later, so the most the pod may get), times the GPU
// count; a MIG device its profile's memory ("1g.5gb": 5 GiB); a whole GPU
// (a count without memory, or all of a GPU's cores, which takes the GPU
// whole whatever memory is asked) the largest GPU. A share is charged at
// least the MIG device it would be given on the cluster's MIG nodes
// (migMiB: 0 when none gives shares MIG devices): gpumem 1024 with
// gpucores 90 is given a 7g instance there. Unknown largest GPU (no node
// inventory yet) charges the percentage of 0: such a pod cannot be
// placed until inventories exist, and is charged as created.
func chargedMiB(d kubeobj.Resources, largestMiB, migMiB int64) int64 {
	count := d.GPUMilli / 1000
	if count <= 0 {
		return 0
	}
	if d.MIGProfile != "" {
		return kubeobj.MulMiB(count, migProfileMiB(d.MIGProfile))
	}
	if gpushareAsk(d).Exclusive() {
		return kubeobj.MulMiB(count, largestMiB)
	}
	per := d.MemoryMiB
	if per == 0 {
		per = (kubeobj.MulMiB(d.MemoryPercent, largestMiB) + 99) / 100
	}
	return kubeobj.MulMiB(count, max(per, migMiB))
}

// gpushareAsk is a defaulted container's ask of each GPU.
func gpushareAsk(d kubeobj.Resources) gpushare.Ask {
	return gpushare.Ask{MemoryMiB: d.MemoryMiB, MemoryPercent: int(d.MemoryPercent), Cores: int(d.Cores)}
}

// migShareMiB is what a share of d is given as a MIG device on the
// cluster's MIG nodes at most (0: none gives shares MIG devices).
func (p *Admission) migShareMiB(d kubeobj.Resources) int64 {
	if p.MIGShareMiB == nil || d.MIGProfile != "" {
		return 0
	}
	return p.MIGShareMiB(d.MemoryMiB, d.MemoryPercent, int(d.Cores))
}

// pluginChargeMiB is what container c is charged for its device-plugin
// GPU resources (what Mutate has writeQuotaCharge write), in MiB; 0 for
// a container without any.
func (p *Admission) pluginChargeMiB(c *corev1.Container) (int64, error) {
	r, err := kubeobj.ReadResources(c, p.Names)
	if err != nil || !r.Any() {
		return 0, err
	}
	d, err := kubeobj.Defaulted(c.Name, r, p.Names)
	if err != nil {
		return 0, err
	}
	return chargedMiB(d, p.largest(), p.migShareMiB(d)), nil
}

// migProfileMiB is the memory a MIG profile's name states ("3g.20gb" →
// 20480; "1g.10gb+me" → 10240), 0 when it states none.
func migProfileMiB(profile string) int64 {
	_, mem, ok := strings.Cut(profile, ".")
	if !ok {
		return 0
	}
	mem, _, _ = strings.Cut(mem, "+")
	gb, ok := strings.CutSuffix(mem, "gb")
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(gb, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n * 1024
}

// writeQuotaCharge sets c's QuotaMemoryResource request and limit to its
// charge (replacing whatever the pod wrote there: the value is Tessera's,
// not the user's) and reports whether it changed.
func (p *Admission) writeQuotaCharge(c *corev1.Container, d kubeobj.Resources) bool {
	q := *resource.NewQuantity(chargedMiB(d, p.largest(), p.migShareMiB(d))<<20, resource.BinarySI)
	changed := false
	for _, list := range []*corev1.ResourceList{&c.Resources.Limits, &c.Resources.Requests} {
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		old, had := (*list)[QuotaMemoryResource]
		if !had || old.Cmp(q) != 0 {
			(*list)[QuotaMemoryResource] = q
			changed = true
		}
	}
	return changed
}
