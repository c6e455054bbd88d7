package lab

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/clusterview"
)

// Report is the cluster view `tessera-lab status` prints: the same code
// as `kubectl tessera nodes` (internal/clusterview).
type Report = clusterview.Report

// Collect reads the report from the API server (clusterview.Collect).
func Collect(ctx context.Context, client kubernetes.Interface) (*Report, error) {
	return clusterview.Collect(ctx, client)
}
