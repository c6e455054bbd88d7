package webhook

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
)

// The memory ceiling (nvidia.com/gpumem-ceiling, docs/upgrading.md,
// tessera.io/v3). kubeobj.Defaulted holds the rules that need no GPU (a
// guarantee in MiB below it, not on a whole GPU or a MIG device); what
// needs the cluster's GPUs is here. The GPU memory quota charges the
// guarantee alone (quota.go's chargedMiB reads the memory, never the
// ceiling).

// ceilingErrors checks a container's ceiling against the largest GPU the
// cluster's inventories list (largest 0: none known yet, not checked; the
// scheduler then finds no GPU large enough and says so).
func (p *Admission) ceilingErrors(lim *field.Path, r kubeobj.Resources, largest int64) field.ErrorList {
	if !r.HasCeiling || largest <= 0 || r.CeilingMiB <= largest {
		return nil
	}
	return field.ErrorList{field.Invalid(lim.Key(p.Names.MemoryCeiling), r.CeilingMiB,
		fmt.Sprintf("exceeds the largest GPU in the cluster (%d MiB): a ceiling is at most one GPU's memory", largest))}
}
