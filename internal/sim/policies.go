package sim

import (
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/sim/baselines"
)

// Policies is what the simulator runs: the scheduler's policies
// (policies.All) and the research baselines (baselines.All).
func Policies() policies.Catalogue {
	return append(policies.All(), baselines.All()...)
}

// Compared lists the seven policies the simulator compares by default, in
// report order (the published baselines, then tessera).
func Compared() []string {
	return []string{baselines.NameRandom, baselines.NameDotProduct, baselines.NameGPUClustering,
		baselines.NameGPUPacking, baselines.NameBestFit, policies.NameFGD, policies.NameTessera}
}
