#!/bin/sh
# fetch_nonfree.sh [DEST] - the real NVIDIA binaries the limiter tests run
# over the fake driver and against each other, from Debian 12's non-free
# component (no GPU needed): the CUDA 11.8 runtime (libcudart11.0), driver
# 535's libcuda (libcuda1) and NVML (libnvidia-ml1), and nvidia-smi. The
# packages are downloaded and unpacked into DEST (default limiter/nonfree),
# not installed: their dependencies (the driver's alternatives, the kernel
# module) are neither needed nor wanted. Adds the contrib/non-free
# components to apt's sources if they are missing (root). CI runs this.
set -eu
DEST=${1:-$(cd "$(dirname "$0")/.." && pwd)/nonfree}
[ -f "$DEST/.complete" ] && exit 0
PKGS="libcudart11.0 libcuda1 libnvidia-ml1 nvidia-smi"
. "$(dirname "$0")/../../hack/nonfree.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
nonfree_download "$T" $PKGS
for d in "$T"/*.deb; do dpkg -x "$d" "$T/root"; done
mkdir -p "$DEST/cudart" "$DEST/driver" "$DEST/bin"
cp "$(find "$T/root" -name 'libcudart.so.11.*' -type f | head -1)" "$DEST/cudart/libcudart.so.11.0"
cp "$(find "$T/root" -name 'libcuda.so.5*' -type f | head -1)" "$DEST/driver/libcuda.so.1"
cp "$(find "$T/root" -name 'libnvidia-ml.so.5*' -type f | head -1)" "$DEST/driver/libnvidia-ml.so.1"
cp "$(find "$T/root" -path '*/lib/nvidia/*' -name nvidia-smi -type f | head -1)" "$DEST/bin/nvidia-smi"
chmod 755 "$DEST/bin/nvidia-smi"
(cd "$T" && for d in *.deb; do dpkg-deb -f "$d" Package Version | paste -sd' '; done) >"$DEST/VERSIONS"
touch "$DEST/.complete"
