#!/bin/sh
# run_bench.sh BUILD_DIR - added cost per intercepted call, fake driver.
# Runs test/bench.c four ways: plain, preloaded with no limits configured,
# preloaded with a memory limit, and preloaded with an SM limit (50 %) whose
# gate never binds (each kernel costs 0.1 ns of fake GPU time), so the
# figure is the pacing bookkeeping, not waiting.
set -eu
B=$(cd "$1" && pwd)
N=${BENCH_N:-10000000}
LIB=${LIB:-$B/libtessera-limiter.so} # LIB=other.so compares another build
T=$(mktemp -d /tmp/tl-bench.XXXXXX)
trap 'rm -rf "$T"' EXIT
export LD_LIBRARY_PATH="$B/fake"
export FAKE_GPU_MEM=17179869184 FAKE_BLOCK_US=0.0001 FAKE_GRAPH_US=0.0001
"$B/bench" "$N" >"$T/base"
LD_PRELOAD="$LIB" "$B/bench" "$N" >"$T/nolimit"
CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE="$T/state" LD_PRELOAD="$LIB" "$B/bench" "$N" >"$T/limit"
CUDA_DEVICE_SM_LIMIT=50 CUDA_DEVICE_MEMORY_SHARED_CACHE="$T/state.sm" LD_PRELOAD="$LIB" "$B/bench" "$N" >"$T/sm"
echo "ns/call, best of 10 rounds of $((N / 10)) calls (alloc+free: $((N / 100))) (fake driver; 'added' = preloaded minus plain)"
printf '%-32s %8s %10s %7s %10s %7s %10s %7s\n' call plain "no limits" added "8g limit" added "SM 50%" added
paste "$T/base" "$T/nolimit" "$T/limit" "$T/sm" | awk '{
    printf "%-32s %8.1f %10.1f %7.1f %10.1f %7.1f %10.1f %7.1f\n", $1, $2, $4, $4 - $2, $6, $6 - $2, $8, $8 - $2 }'
