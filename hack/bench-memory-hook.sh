#!/usr/bin/env bash
# bench-memory-hook.sh [RUNS] - what the memory-limits hook adds to a GPU
# container's start where the driver holds its memory limits: the
# container runtime waits for the createContainer hook (`tessera-hook
# memory-limits`: the OCI state read, the container's cgroup found, NVML
# loaded, soft and hard limits set on its GPU, the confirmation written)
# before the container's first instruction. The hook runs RUNS times
# (200) against the fake driver (fakegpu/, partitioning as r615 does) on a
# real cgroup v2 leaf with a process in it, each run timed from its start
# to its exit; the limits are cleared between runs (--release, the
# poststop hook; not counted). Prints p50, p90, p99 and the maximum in
# milliseconds. Root and a cgroup v2 hierarchy (this machine's
# /sys/fs/cgroup/unified) are needed. Record it:
#
#   hack/record-result.sh bench-memory-hook hack/bench-memory-hook.sh
set -euo pipefail
runs=${1:-200}
root=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "bench-memory-hook: needs root (cgroups, the driver's limits)" >&2; exit 2; }
cg2=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break } $(i + 1) == "cgroup2" && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
[ -n "$cg2" ] || { echo "bench-memory-hook: no cgroup v2 hierarchy mounted (mount -t cgroup2 none /sys/fs/cgroup/unified)" >&2; exit 2; }
tmp=$(mktemp -d)
leaf=$cg2/tessera-bench-hook-$$
holder=
cleanup() {
    if [ -n "$holder" ]; then kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null || true; fi
    rmdir "$leaf" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
(cd "$root" && go build -o "$tmp/tessera-hook" ./cmd/tessera-hook && make -s -C fakegpu B="$tmp/fake")
export FAKE_GPU_STATE_DIR=$tmp/gpus FAKE_NVML_PARTITIONING=1 FAKE_GPU_COUNT=1
mkdir -p "$FAKE_GPU_STATE_DIR"
uuid=$(LD_LIBRARY_PATH=$tmp/fake/lib "$tmp/fake/bin/nvidia-smi" -L | sed -n 's/.*(UUID: \(GPU-[^)]*\)).*/\1/p' | head -1)
[ -n "$uuid" ] || { echo "bench-memory-hook: the fake driver lists no GPU" >&2; exit 1; }
mkdir "$leaf"
sh -c 'echo $$ > "$0/cgroup.procs" && exec sleep 3600' "$leaf" &
holder=$!
until grep -q "tessera-bench-hook-$$" "/proc/$holder/cgroup" 2>/dev/null; do sleep 0.01; done
state="{\"ociVersion\":\"1.2.0\",\"id\":\"bench\",\"status\":\"created\",\"pid\":$holder,\"bundle\":\"$tmp\"}"
confirm=$tmp/driver-memory
lib=$tmp/fake/lib/libnvidia-ml.so.1
echo "hook: tessera-hook memory-limits ($(du -m "$tmp/tessera-hook" | cut -f1) MiB binary), GPU $uuid, leaf $leaf, $runs runs"
: >"$tmp/ms"
for _ in $(seq "$runs"); do
    : >"$confirm"
    t0=$EPOCHREALTIME
    "$tmp/tessera-hook" memory-limits --nvml "$lib" --confirm "$confirm" --gpu "$uuid=1024:2048" <<<"$state"
    t1=$EPOCHREALTIME
    grep -q "^device=$uuid soft=1024m hard=2048m" "$confirm" || { echo "bench-memory-hook: not confirmed: $(cat "$confirm")" >&2; exit 1; }
    echo "$t0 $t1" | awk '{ printf "%.3f\n", ($2 - $1) * 1000 }' >>"$tmp/ms"
    "$tmp/tessera-hook" memory-limits --nvml "$lib" --release --confirm "$confirm" <<<"$state"
done
LD_LIBRARY_PATH=$tmp/fake/lib "$tmp/fake/bin/nvidia-smi" memory-limits -n "$leaf" || true
sort -n "$tmp/ms" | awk '{ v[NR] = $1 } END {
    n = NR; i50 = int(0.50 * n + 0.5); i90 = int(0.90 * n + 0.5); i99 = int(0.99 * n + 0.5)
    if (i99 > n) i99 = n
    printf "hook latency over %d runs: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n", n, v[i50], v[i90], v[i99], v[n]
}'
