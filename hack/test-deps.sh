#!/bin/sh
# test-deps.sh [go|limiter|integration|all]... - checks what the tests need
# beyond Go and, run as root, installs what is missing. The Makefile's test
# targets run it first with their part (`make test` all three); CI runs it
# for all.
#
#   go           gcc (cgo, the race detector); root and unshare (the kubelet
#                device manager's fixed socket directory, in a private
#                mount namespace); NVIDIA's MPS control daemon
#   limiter      gcc, make; root and unshare (a limits file at /etc/tessera,
#                pid namespaces); sudo; NVIDIA's CUDA runtime, libcuda, NVML
#                and nvidia-smi
#   integration  gcc, make; root and unshare (private mount namespaces)
#   all          the three, and git
#
# As root it installs missing programs from Debian's packages (apt-get
# install gcc make git util-linux sudo, saying which) and fetches NVIDIA's
# binaries from Debian 12's contrib/non-free components
# (limiter/test/fetch_nonfree.sh, hack/fetch-mps-control.sh: downloaded
# and unpacked into the tree, not installed; about 10 s). Not as root, it
# names what is missing and the command that gets it. With
# TESSERA_TEST_STRICT set (the Makefile sets it) anything missing is an
# error, as those tests would fail; with TESSERA_TEST_STRICT=0 they are
# skipped, each naming what it lacks.
set -eu
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- all

# tool:package pairs the parts need, and their other needs
parts=""
for a in "$@"; do
    case $a in all) parts="$parts go limiter integration git" ;; *) parts="$parts $a" ;; esac
done
tools="" root="" mps="" limiter=""
for part in $parts; do
    case $part in
    go) tools="$tools gcc:gcc unshare:util-linux" root="$root go" mps=1 ;;
    limiter) tools="$tools gcc:gcc make:make unshare:util-linux sudo:sudo" root="$root limiter" limiter=1 ;;
    integration) tools="$tools gcc:gcc make:make unshare:util-linux" root="$root integration" ;;
    git) tools="$tools git:git" ;;
    *) echo "test-deps: unknown part $part (go, limiter, integration, all)" >&2; exit 2 ;;
    esac
done

say() { echo "test-deps: $*"; }
strict() { [ -n "${TESSERA_TEST_STRICT:-}" ] && [ "$TESSERA_TEST_STRICT" != 0 ]; }
is_root() { [ "$(id -u)" = 0 ]; }

pkgs=""
for tp in $tools; do
    tool=${tp%%:*} pkg=${tp#*:}
    command -v "$tool" >/dev/null 2>&1 && continue
    case " $pkgs " in *" $pkg "*) ;; *) pkgs="$pkgs $pkg" ;; esac
done
pkgs=${pkgs# }

missing="" # lines: what | how to get it
lack() { missing="$missing  $1
      $2
"; }

if [ -n "$pkgs" ]; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        say "installing $pkgs with apt-get (running as root; the tests need them)"
        log=$(mktemp)
        if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs; } >"$log" 2>&1; then
            tail -5 "$log" | sed 's/^/    /'
            lack "$pkgs (apt-get install failed)" "apt-get update && apt-get install -y $pkgs"
        fi
        rm -f "$log"
    else
        lack "programs of the packages $pkgs" "as root: apt-get install -y $pkgs (or your system's package manager)"
    fi
fi

if ! is_root; then
    lack "root: the tests that use private mount or PID namespaces (of:$root)" "run the tests as root"
fi

# NVIDIA's non-free binaries: fetched, not installed. As a user, the
# fetch works where apt's sources already list contrib and non-free.
fetch() { # what script
    out=$(sh "$2" 2>&1) && return 0
    printf '%s\n' "$out" | tail -3 | sed 's/^/    /'
    lack "$1 (Debian non-free; fetching it failed)" "as root: $2 (adds contrib non-free to apt's sources if missing, downloads, unpacks)"
}
if [ -n "$limiter" ] && [ ! -f limiter/nonfree/.complete ]; then
    say "fetching NVIDIA's CUDA runtime, libcuda, NVML and nvidia-smi from Debian non-free into limiter/nonfree (not installed)"
    fetch "NVIDIA's CUDA runtime, libcuda, NVML and nvidia-smi in limiter/nonfree" limiter/test/fetch_nonfree.sh
fi
if [ -n "$mps" ] && [ ! -x bin/nonfree/nvidia-cuda-mps-control ]; then
    say "fetching NVIDIA's nvidia-cuda-mps-control from Debian non-free into bin/nonfree (not installed)"
    fetch "NVIDIA's nvidia-cuda-mps-control in bin/nonfree" hack/fetch-mps-control.sh
fi

[ -z "$missing" ] && exit 0
if strict; then
    echo "test-deps: these tests need what this machine lacks:"
else
    echo "test-deps: the tests that need these will be skipped, each naming what it lacks:"
fi
printf '%s' "$missing"
if strict; then
    echo "Run as root, make test installs and fetches these itself. TESSERA_TEST_STRICT=0 skips the tests"
    echo "that need them instead of failing (they are named: go test -v shows SKIP lines)."
    exit 1
fi
