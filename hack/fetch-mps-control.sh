#!/bin/sh
# fetch-mps-control.sh [DEST] - NVIDIA's real MPS control daemon
# (nvidia-cuda-mps-control, driver 535, Debian 12's non-free component),
# downloaded and unpacked into DEST (default bin/nonfree), not installed.
# internal/nodeagent/mps tests the node agent's MPS commands against it
# (no GPU needed: the control daemon runs and answers without one). Adds
# the contrib/non-free components to apt's sources if they are missing
# (root). `make test-go` runs this; about 2 s.
set -eu
DEST=${1:-$(cd "$(dirname "$0")/.." && pwd)/bin/nonfree}
[ -x "$DEST/nvidia-cuda-mps-control" ] && exit 0
. "$(dirname "$0")/nonfree.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
nonfree_download "$T" nvidia-cuda-mps
dpkg -x "$T"/nvidia-cuda-mps_*.deb "$T/root"
mkdir -p "$DEST"
cp "$T/root/usr/bin/nvidia-cuda-mps-control" "$DEST/nvidia-cuda-mps-control"
chmod 755 "$DEST/nvidia-cuda-mps-control"
dpkg-deb -f "$T"/nvidia-cuda-mps_*.deb Package Version | paste -sd' ' >"$DEST/VERSIONS.mps"
