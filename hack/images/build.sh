#!/usr/bin/env bash
# make images: Tessera's image index (linux/amd64 + linux/arm64) as an OCI
# image layout in bin/images/tessera and a tar of it in
# bin/images/tessera.oci.tar, then hack/images/smoke.sh. No registry, no
# Docker daemon. docs/install.md says what is in the image and how to push it.
#
# Environment: IMAGE_REPOSITORY and IMAGE_TAG (the chart's default image:
# values.yaml's image.repository, Chart.yaml's appVersion), IMAGE_PLATFORMS ("amd64 arm64"),
# SOURCE_DATE_EPOCH (the commit's time), K8S_LDFLAGS (from the Makefile),
# IMAGES_OUT (bin/images).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${IMAGES_OUT:-bin/images}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The chart's default image (values.yaml) is what this builds.
repo=${IMAGE_REPOSITORY:-$(sed -n '/^image:/,/^[^ ]/s/^  repository: *//p' charts/tessera/values.yaml)}
version=${IMAGE_TAG:-$(sed -n 's/^appVersion: *//p' charts/tessera/Chart.yaml | tr -d "\"'")}
platforms=${IMAGE_PLATFORMS:-amd64 arm64}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then revision="$revision-dirty"; fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
host=$(go env GOARCH)

# The cross compilers, the libc6 packages of each architecture and qemu-user
# come from Debian; install what is missing (as root) or say how.
pkgs=()
arches=()
for a in $platforms; do
  case $a in amd64) triplet=x86_64-linux-gnu ;; arm64) triplet=aarch64-linux-gnu ;;
    *) echo "images: IMAGE_PLATFORMS: unknown architecture $a (want amd64, arm64)" >&2; exit 1 ;; esac
  if [ "$a" != "$host" ]; then
    # Debian's package names: gcc-aarch64-linux-gnu, gcc-x86-64-linux-gnu.
    command -v "$triplet-gcc" >/dev/null || pkgs+=("gcc-${triplet//_/-}" "libc6-dev-$a-cross")
    command -v "qemu-$(echo "$triplet" | cut -d- -f1)" >/dev/null || pkgs+=(qemu-user)
    [ "$(dpkg --print-architecture)" = "$a" ] || dpkg --print-foreign-architectures | grep -qx "$a" || arches+=("$a")
  fi
done
if [ ${#pkgs[@]} -gt 0 ] || [ ${#arches[@]} -gt 0 ]; then
  pkgs=($(echo "${pkgs[@]}" | tr ' ' '\n' | sort -u))
  cmd="$(for a in "${arches[@]}"; do printf 'dpkg --add-architecture %s && ' "$a"; done)apt-get update && apt-get install -y ${pkgs[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "images: missing Debian packages or architectures (${pkgs[*]} ${arches[*]}); as root run: $cmd" >&2
    exit 1
  fi
  echo "images: installing the cross-build prerequisites: $cmd"
  sh -c "$cmd" >"$out/apt.log" 2>&1 || { cat "$out/apt.log" >&2; echo "images: '$cmd' failed" >&2; exit 1; }
fi

args=()
for a in $platforms; do
  case $a in amd64) triplet=x86_64-linux-gnu ;; arm64) triplet=aarch64-linux-gnu ;; esac
  cc=gcc; [ "$a" = "$host" ] || cc=$triplet-gcc
  dir=$out/$a
  mkdir -p "$dir" "$out/cache"
  echo "images: linux/$a: tessera (cgo, $cc)"
  CGO_ENABLED=1 GOOS=linux GOARCH=$a CC=$cc go build -trimpath -buildvcs=false -tags netgo,osusergo \
    -ldflags "-s -w ${K8S_LDFLAGS:-} -X github.com/tessera-gpu/tessera/internal/version.Version=v$version" \
    -o "$dir/tessera" ./cmd/tessera
  # The OCI hook the container runtime runs on the host where the driver
  # holds memory limits (cgo: go-nvml loads the host's NVML; glibc 2.34+).
  echo "images: linux/$a: tessera-hook (cgo, $cc)"
  CGO_ENABLED=1 GOOS=linux GOARCH=$a CC=$cc go build -trimpath -buildvcs=false -tags netgo,osusergo \
    -ldflags "-s -w" -o "$dir/tessera-hook" ./cmd/tessera-hook
  echo "images: linux/$a: libtessera-limiter.so ($cc)"
  make -s -C limiter B="$dir/limiter" CC="$cc" EXTRA_CFLAGS="-ffile-prefix-map=$root=." >/dev/null
  install -m 644 "$dir/limiter/libtessera-limiter.so" "$dir/libtessera-limiter.so"
  # Debian's libc6 of that architecture: the current version, kept in
  # bin/images/cache so warm builds do not download it again.
  v=$(apt-cache show --no-all-versions "libc6:$a" 2>/dev/null | sed -n 's/^Version: //p' | head -1)
  if [ -z "$v" ]; then echo "images: apt knows no libc6:$a (run apt-get update)" >&2; exit 1; fi
  deb=$out/cache/libc6_${v//:/%3a}_$a.deb
  if [ ! -f "$deb" ]; then
    echo "images: linux/$a: downloading libc6 $v"
    (cd "$out/cache" && apt-get download -q "libc6:$a=$v" 2>&1 | grep -v "unsandboxed" || true)
    [ -f "$deb" ] || { echo "images: apt-get download libc6:$a=$v did not write $deb" >&2; exit 1; }
  fi
  rm -rf "$dir/libc6"
  dpkg-deb -x "$deb" "$dir/libc6"
  dpkg-deb -f "$deb" >"$dir/libc6.control"
  args+=(--platform "linux/$a=$dir")
done

echo "images: assembling the index (go-containerregistry, hack/images)"
digest=$(cd hack/images && GOWORK=off go run . build --out "$out/tessera" --tar "$out/tessera.oci.tar" \
  --repository "$repo" --version "$version" --revision "$revision" --created "$SOURCE_DATE_EPOCH" "${args[@]}")
echo "$digest" >"$out/tessera.digest"
echo "images: $repo:$version $digest"
echo "images:   OCI layout $out/tessera, tar $out/tessera.oci.tar ($(du -h "$out/tessera.oci.tar" | cut -f1))"

IMAGES_OUT=$out IMAGE_TAG=$version IMAGE_PLATFORMS=$platforms hack/images/smoke.sh
