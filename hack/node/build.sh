#!/usr/bin/env bash
# Builds make e2e's container runtime, pinned in this module (go.mod), into
# $1: containerd, containerd-shim-runc-v2 and ctr; runc (with seccomp:
# Debian's libseccomp-dev, the profile RuntimeDefault needs); and the CNI
# plugins bridge, host-local, loopback and portmap in $1/cni. Each reports
# its pinned version, as its own release build does. Go's build cache makes
# a second run take seconds; a cold one takes several minutes on 2 cores.
set -euo pipefail
out=$(realpath -m "${1:?usage: build.sh OUTPUT_DIR}")
cd "$(dirname "$0")"
export GOWORK=off
if ! pkg-config --exists libseccomp 2>/dev/null; then
  echo "node: runc is built with seccomp, which needs Debian's libseccomp-dev (and pkg-config): apt-get install -y libseccomp-dev pkg-config" >&2
  exit 1
fi
version() { go list -m -f '{{.Version}}' "$1"; }
ctrd=$(version github.com/containerd/containerd/v2)
runc=$(version github.com/opencontainers/runc)
cni=$(version github.com/containernetworking/plugins)
mkdir -p "$out/cni"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$ctrd -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2" \
  -o "$out/" github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
CGO_ENABLED=1 go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${runc#v}" -o "$out/runc" github.com/opencontainers/runc
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni" \
  -o "$out/cni/" github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/meta/portmap
echo "node: containerd $ctrd, runc $runc, CNI plugins $cni in $out"
