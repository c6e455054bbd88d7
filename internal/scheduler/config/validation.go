package config

import (
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// ValidateTesseraArgs checks defaulted arguments: every error names the
// key, the value and what it may be. A placement policy must be one of
// placementPolicies, the names of the policies the scheduler runs.
func ValidateTesseraArgs(path *field.Path, a *TesseraArgs, placementPolicies []string) error {
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
	if !slices.Contains(placementPolicies, a.PlacementPolicy) && (a.PlacementPolicy != string(a.NodePolicy) || a.NodePolicy.Valid()) {
		errs = append(errs, field.NotSupported(path.Child("placementPolicy"), a.PlacementPolicy, placementPolicies))
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
