#!/usr/bin/env bash
# Smoke test of the images make images wrote: each platform's image is
# unpacked from the OCI layout (as a runtime would) and its binary run with
# nothing but the image's files: chroot for the build machine's
# architecture (root), qemu-user with the image as its root (-L) for the
# other. Checks: `tessera version`, the init container's
# `tessera install-limiter` (no shell; with --hook-to it copies
# tessera-hook too, executable), tessera-hook's usage, the node agent's refusal of a
# missing driver root, and that the image has no shell.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${IMAGES_OUT:-bin/images}
version=${IMAGE_TAG:?}
platforms=${IMAGE_PLATFORMS:-amd64 arm64}
host=$(go env GOARCH)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "images smoke: linux/$a: $*" >&2; exit 1; }

for a in $platforms; do
  r=$work/$a
  (cd hack/images && GOWORK=off go run . extract --layout "$out/tessera" --platform "linux/$a" --to "$r")
  # run CMD...: CMD's paths as the image sees them; $tmp is a writable
  # directory, as the image sees it.
  if [ "$a" = "$host" ] && [ "$(id -u)" = 0 ]; then
    how=chroot; tmp=/tmp
    run() { chroot "$r" "$@"; }
  else
    case $a in amd64) q=qemu-x86_64 ;; arm64) q=qemu-aarch64 ;; esac
    how="$q -L"; tmp=$r/tmp
    run() { local p=$1; shift; "$q" -L "$r" "$r$p" "$@"; }
  fi
  [ ! -e "$r/bin/sh" ] && [ ! -e "$r/usr/bin/sh" ] || fail "the image has a shell"
  got=$(run /usr/local/bin/tessera version) || fail "tessera version failed: $got"
  case $got in "tessera v$version "*" linux/$a") ;; *) fail "tessera version printed '$got'" ;; esac
  run /usr/local/bin/tessera install-limiter --to "$tmp/host/libtessera-limiter.so" 2>/dev/null &&
    fail "install-limiter into a missing directory succeeded"
  mkdir -p "$r/tmp/host"
  run /usr/local/bin/tessera install-limiter --to "$tmp/host/libtessera-limiter.so" >/dev/null
  cmp -s "$r/tmp/host/libtessera-limiter.so" "$r/usr/local/lib/tessera/libtessera-limiter.so" ||
    fail "install-limiter did not copy the library"
  run /usr/local/bin/tessera install-limiter --to "$tmp/host/libtessera-limiter.so" --hook-to "$tmp/host/tessera-hook" >/dev/null
  cmp -s "$r/tmp/host/tessera-hook" "$r/usr/local/lib/tessera/tessera-hook" && [ -x "$r/tmp/host/tessera-hook" ] ||
    fail "install-limiter --hook-to did not copy tessera-hook, executable"
  # The hook runs (its usage, exit 2) with nothing but the image's glibc.
  if err=$(run /usr/local/lib/tessera/tessera-hook 2>&1); then fail "tessera-hook without a command succeeded"; fi
  case $err in "Usage: tessera-hook memory-limits"*) ;; *) fail "tessera-hook printed '$err'" ;; esac
  # A driver root without a driver (the image's /etc): the node agent
  # stops, naming the root and the library it looked for.
  if err=$(run /usr/local/bin/tessera node-agent --discover-only --driver-root /etc 2>&1); then
    fail "node-agent with no driver under its driver root succeeded"
  fi
  case $err in *"driver root /etc: libnvidia-ml.so.1 is in none of"*) ;; *) fail "node-agent's error does not name the driver root and NVML: $err" ;; esac
  echo "images smoke: linux/$a ($how): $got; install-limiter copied the limiter and tessera-hook; tessera-hook runs; node-agent refused a driver root without a driver; no shell; $(du -sh "$r" | cut -f1) unpacked"
done
