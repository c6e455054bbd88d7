#!/usr/bin/env bash
# The images of make e2e's containers, built here (no registry, no network
# pull in the test), each an OCI layout tar that `ctr images import` reads,
# into $1 (bin/e2e/images):
#   pause.oci.tar    e2e.tessera.local/pause:1.0    the pods' sandbox: fakegpu/tools/lab-pause, static
#   debian.oci.tar   e2e.tessera.local/debian:12    a Debian 12 userland (bash, coreutils, dash as sh,
#                                                   findutils, grep, sed and their libraries, from
#                                                   Debian's packages) with gpu-fill (fakegpu/tools)
#   busybox.oci.tar  e2e.tessera.local/busybox:1.35 Debian's busybox-static, no libc
# Debian's packages are downloaded once into $1/debs (apt-get download; the
# versions apt knows now). hack/images (go-containerregistry) assembles them.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: images.sh OUTPUT_DIR}")
tools=${LAB_TOOLS:-bin/lab-tools}
arch=$(dpkg --print-architecture)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
mkdir -p "$out/debs"
[ -x "$tools/bin/gpu-fill" ] || { echo "e2e images: $tools/bin/gpu-fill missing: run make lab-tools" >&2; exit 1; }

# deb PACKAGE: the path of the current version's .deb, downloaded once.
deb() {
  local v f
  v=$(apt-cache show --no-all-versions "$1:$arch" 2>/dev/null | sed -n 's/^Version: //p' | head -1)
  [ -n "$v" ] || { echo "e2e images: apt knows no $1:$arch (run apt-get update)" >&2; return 1; }
  f=$out/debs/${1}_${v//:/%3a}_$arch.deb
  [ -f "$f" ] || f=$out/debs/${1}_${v//:/%3a}_all.deb
  if [ ! -f "$f" ]; then
    (cd "$out/debs" && apt-get download -q "$1:$arch=$v" >/dev/null 2>&1) || { echo "e2e images: apt-get download $1:$arch=$v failed" >&2; return 1; }
    f=$(ls "$out/debs/${1}_${v//:/%3a}_"*.deb | head -1)
  fi
  echo "$f"
}

image() { # image NAME TAR ROOT [images rootfs flags...]
  local name=$1 tar=$2 root=$3
  shift 3
  (cd hack/images && GOWORK=off go run . rootfs --root "$root" --name "$name" --tar "$tar" --created "$SOURCE_DATE_EPOCH" "$@") >/dev/null
  echo "e2e images: $name ($(du -h "$tar" | cut -f1))"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The pause image: one static binary.
mkdir -p "$work/pause"
gcc -static -O2 -Wall -Werror -o "$work/pause/pause" fakegpu/tools/lab-pause.c
image e2e.tessera.local/pause:1.0 "$out/pause.oci.tar" "$work/pause" --entrypoint /pause \
  --description "make e2e's pod sandbox: waits, reaps, exits at SIGTERM"

# Debian 12: the packages unpacked as dpkg would lay them out.
mkdir -p "$work/debian"
for p in base-files bash coreutils dash findutils grep sed libacl1 libattr1 libc6 libgmp10 libpcre2-8-0 libselinux1 libtinfo6; do
  dpkg-deb -x "$(deb "$p")" "$work/debian"
done
ln -sf dash "$work/debian/bin/sh"
mkdir -p "$work/debian/etc" "$work/debian/tmp"
chmod 1777 "$work/debian/tmp"
printf 'root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$work/debian/etc/passwd"
printf 'root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n' >"$work/debian/etc/group"
# In /usr/bin: a pod may mount its own volume over /usr/local.
install -m 755 "$tools/bin/gpu-fill" "$work/debian/usr/bin/gpu-fill"
image e2e.tessera.local/debian:12 "$out/debian.oci.tar" "$work/debian" --cmd /bin/bash \
  --description "make e2e's Debian 12 userland with gpu-fill"

# busybox-static: /bin/busybox and a link per applet.
mkdir -p "$work/busybox-deb" "$work/busybox/bin" "$work/busybox/tmp"
dpkg-deb -x "$(deb busybox-static)" "$work/busybox-deb"
install -m 755 "$work/busybox-deb/bin/busybox" "$work/busybox/bin/busybox"
for a in $("$work/busybox/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$work/busybox/bin/$a"; done
chmod 1777 "$work/busybox/tmp"
image e2e.tessera.local/busybox:1.35 "$out/busybox.oci.tar" "$work/busybox" --cmd /bin/sh \
  --description "make e2e's busybox-static userland (no C library)"
