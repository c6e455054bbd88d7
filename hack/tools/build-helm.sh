#!/usr/bin/env bash
# Builds helm, pinned in this module, into $1 as helm's own release builds
# it: the Kubernetes version helm assumes without a cluster (helm template,
# helm lint; checked against a chart's kubeVersion) is that of the
# client-go it links, not helm's fallback 1.20. The chart tests
# (internal/testenv.BuildHelm) and .ci/run build it with this script.
set -euo pipefail
out=$(realpath -m "${1:?usage: build-helm.sh OUTPUT}")
cd "$(dirname "$0")"
export GOWORK=off CGO_ENABLED=0
v=$(go list -m -f '{{.Version}}' k8s.io/client-go) # v0.MINOR.PATCH: Kubernetes 1.MINOR
minor=$(echo "$v" | cut -d. -f2)
ld=""
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ld="$ld -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done
go build -ldflags "$ld" -o "$out" helm.sh/helm/v3/cmd/helm
