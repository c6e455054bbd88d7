package config

import (
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/internal/placement/policies"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ValidateTesseraArgs checks defaulted arguments: every error names the
// key, the value and what it may be. A placement policy must be one this
// binary runs (policies.Names: all of them, in every binary).
func ValidateTesseraArgs(path *field.Path, a *TesseraArgs) error {
	var errs field.ErrorList
	if _, err := api.NewResourceNames(a.ResourcePrefix); err != nil {
		errs = append(errs, field.Invalid(path.Child("resourcePrefix"), a.ResourcePrefix, err.Error()))
	}
	if !a.NodePolicy.Valid() {
		errs = append(errs, field.NotSupported(path.Child("nodePolicy"), a.NodePolicy, api.NodePolicies()))
	}
	if !a.GPUPolicy.Valid() {
		errs = append(errs, field.NotSupported(path.Child("gpuPolicy"), a.GPUPolicy, api.GPUPolicies()))
	}
	// An unset placementPolicy defaults to nodePolicy: one error for it.
	if !known(a.PlacementPolicy) && (a.PlacementPolicy != string(a.NodePolicy) || a.NodePolicy.Valid()) {
		errs = append(errs, field.NotSupported(path.Child("placementPolicy"), a.PlacementPolicy, policies.Names()))
	}
	rs, rsPath := a.RecordSigning, path.Child("recordSigning")
	if rs.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(rs.Namespace) {
			errs = append(errs, field.Invalid(rsPath.Child("namespace"), rs.Namespace, msg))
		}
	}
	for name, v := range map[string]string{"keySecret": rs.KeySecret, "publicKeys": rs.PublicKeys} {
		if v == "" {
			continue
		}
		for _, msg := range validation.IsDNS1123Subdomain(v) {
			errs = append(errs, field.Invalid(rsPath.Child(name), v, msg))
		}
	}
	return errs.ToAggregate()
}

func known(policy string) bool {
	for _, n := range policies.Names() {
		if n == policy {
			return true
		}
	}
	return false
}
