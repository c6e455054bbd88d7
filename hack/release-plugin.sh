#!/usr/bin/env bash
# make release-plugin: kubectl-tessera release archives for each platform,
# their SHA-256 sums and a krew plugin manifest (tessera.yaml) in
# bin/release, so users install the plugin without cloning:
#   kubectl krew install --manifest=tessera.yaml --archive=kubectl-tessera_linux_amd64.tar.gz
# or `kubectl krew install --manifest-url=<release>/tessera.yaml`.
# The archives are reproducible (sorted, fixed owner and times: the commit's).
#
# Environment: VERSION (the chart's appVersion), RELEASE_PLATFORMS,
# RELEASE_URL (where the archives will be downloadable), RELEASE_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${VERSION:-$(sed -n 's/^appVersion: *//p' charts/tessera/Chart.yaml | tr -d "\"'")}
platforms=${RELEASE_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64}
url=${RELEASE_URL:-https://github.com/tessera-gpu/tessera/releases/download/v$version}
out=${RELEASE_OUT:-bin/release}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

manifest=$out/tessera.yaml
cat >"$manifest" <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: tessera
spec:
  version: v$version
  homepage: https://github.com/tessera-gpu/tessera
  shortDescription: Show GPU sharing by Tessera per node, GPU and pod
  description: |
    Tessera's view of the cluster's GPUs: per GPU what is allocated and to
    whom (nodes), per GPU pod what it holds (pods), and why a GPU pod is
    pending (why), computed with the Tessera scheduler's own code.
  platforms:
EOF
: >"$out/SHA256SUMS"
for p in $platforms; do
  os=${p%/*} arch=${p#*/}
  exe=kubectl-tessera; [ "$os" = windows ] && exe=kubectl-tessera.exe
  d=$stage/$os-$arch
  mkdir -p "$d"
  echo "release-plugin: $p"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X github.com/tessera-gpu/tessera/internal/version.Version=v$version" -o "$d/$exe" ./cmd/kubectl-tessera
  cp LICENSE "$d/LICENSE"
  chmod 755 "$d/$exe"; chmod 644 "$d/LICENSE"
  touch -d "@$SOURCE_DATE_EPOCH" "$d/$exe" "$d/LICENSE"
  a=kubectl-tessera_${os}_$arch.tar.gz
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -C "$d" -cf - "$exe" LICENSE | gzip -n -9 >"$out/$a"
  sum=$(sha256sum "$out/$a" | cut -d' ' -f1)
  echo "$sum  $a" >>"$out/SHA256SUMS"
  cat >>"$manifest" <<EOF
  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $url/$a
    sha256: $sum
    bin: $exe
    files:
    - from: $exe
      to: .
    - from: LICENSE
      to: .
EOF
done
echo "release-plugin: $out: $(cd "$out" && ls | tr '\n' ' ')"
