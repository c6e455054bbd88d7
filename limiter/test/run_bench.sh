#!/bin/sh
# run_bench.sh BUILD_DIR - added cost per intercepted call, fake driver.
# Runs test/bench.c three ways: plain, preloaded with no limits configured,
# and preloaded with a memory limit (no SM limit, so no throttling).
set -eu
B=$(cd "$1" && pwd)
N=${BENCH_N:-10000000}
LIB=${LIB:-$B/libtessera-limiter.so} # LIB=other.so compares another build
T=$(mktemp -d /tmp/tl-bench.XXXXXX)
trap 'rm -rf "$T"' EXIT
export LD_LIBRARY_PATH="$B/fake"
export FAKE_GPU_MEM=17179869184
"$B/bench" "$N" >"$T/base"
LD_PRELOAD="$LIB" "$B/bench" "$N" >"$T/nolimit"
CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE="$T/state" \
    LD_PRELOAD="$LIB" "$B/bench" "$N" >"$T/limit"
echo "ns/call, best of 10 rounds of $((N / 10)) calls (alloc+free: $((N / 100))) (fake driver; 'added' = preloaded minus plain)"
printf '%-32s %10s %14s %8s %14s %8s\n' call plain "preload,nolim" added "preload,8g" added
paste "$T/base" "$T/nolimit" "$T/limit" | awk '{
    printf "%-32s %10.1f %14.1f %8.1f %14.1f %8.1f\n", $1, $2, $4, $4 - $2, $6, $6 - $2 }'
