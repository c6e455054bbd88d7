#!/usr/bin/env bash
# Builds Volcano's scheduler and controller manager, pinned in this module
# (volcano.sh/volcano, see tools.go), into $1 (vc-scheduler,
# vc-controller-manager) and copies the same release's CRDs into $1/crd.
# The lab's `tessera-lab up --volcano $1` runs them; the Volcano tests
# build them with this script. Cold: several minutes on 2 cores.
set -euo pipefail
out=$(realpath -m "${1:?usage: build.sh OUTPUT_DIR}")
cd "$(dirname "$0")"
export GOWORK=off
mkdir -p "$out/crd"
v=$(go list -m -f '{{.Version}}' volcano.sh/volcano)
go build -ldflags "-X volcano.sh/volcano/pkg/version.Version=$v" -o "$out/vc-scheduler" volcano.sh/volcano/cmd/scheduler
go build -ldflags "-X volcano.sh/volcano/pkg/version.Version=$v" -o "$out/vc-controller-manager" volcano.sh/volcano/cmd/controller-manager
dir=$(go list -m -f '{{.Dir}}' volcano.sh/volcano)
install -m 0644 "$dir"/config/crd/volcano/bases/*.yaml "$out/crd/"
echo "$v" > "$out/VERSION"
