package scheduler

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// jsonMergePatch sets the allocation annotation; the UID makes the patch
// fail on a pod recreated under the same name instead of annotating it.
func jsonMergePatch(uid types.UID, record string) ([]byte, error) {
	return json.Marshal(map[string]any{
		"metadata": map[string]any{
			"uid":         uid,
			"annotations": map[string]string{api.AnnotationAllocation: record},
		},
	})
}
