#!/usr/bin/env bash
# gpu-check.sh - checks the limiter on a machine with an NVIDIA GPU and
# PyTorch (CUDA build). Not run in CI: CI has no GPU.
#
#   bash limiter/gpu-check.sh            # uses GPU 0
#   LIMIT_MIB=4096 DURATION=20 bash limiter/gpu-check.sh
#
# Checks:
#   1. torch.cuda.mem_get_info() reports the limit as total
#   2. allocating under the limit works, past it raises CUDA OOM
#   3. nvidia-smi run with the limiter shows the limit as memory.total
#   4. two processes sharing one state file share one limit
#   5. a process limited to 30% of SMs next to a saturating neighbour gets
#      30 +- 5 % of its solo throughput (and alone, non-elastic, also 30 +- 5)
#   6. a launch-bound microbenchmark is at most 3% slower with the limiter
# Prints a results table; exits 1 if any check failed, 2 if it cannot run.
# NVML keys per-process utilisation by host pid; the limiter finds its host
# pid (docs/isolation.md, "Host pids"), so it can also run in a container
# with its own pid namespace: run the limited process there with
# TESSERA_LIMITER_DEBUG=1 to see which host pid it found (unverified on a
# real GPU so far; on the host it is the plain case).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
DURATION=${DURATION:-20}      # seconds per throughput measurement
SHARE=${SHARE:-30}            # SM limit for check 5

command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found" >&2; exit 2; }
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    { echo "gpu-check: $PY cannot import torch with CUDA available" >&2; exit 2; }

echo "== building the limiter"
make -C "$HERE" >/dev/null || { echo "gpu-check: build failed" >&2; exit 2; }
LIB="$HERE/build/libtessera-limiter.so"

WORK=$(mktemp -d /tmp/tessera-gpu-check.XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

PHYS_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1 | tr -d ' ')
# default limit: a quarter of the GPU, at most 4 GiB, so "past the limit" is
# still far below physical memory (a real OOM would prove nothing)
if [ -z "${LIMIT_MIB:-}" ]; then
    LIMIT_MIB=$((PHYS_MIB / 4)); [ "$LIMIT_MIB" -gt 4096 ] && LIMIT_MIB=4096
fi
LIMIT=$((LIMIT_MIB * 1024 * 1024))
echo "== GPU 0: ${PHYS_MIB} MiB physical; limit ${LIMIT_MIB} MiB"

RESULTS="$WORK/results"
: >"$RESULTS"
FAILED=0
record() { # name expected measured ok(0/1)
    local v=PASS
    [ "$4" = 0 ] || { v=FAIL; FAILED=1; }
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$v" >>"$RESULTS"
    printf '%-4s %s: expected %s, measured %s\n' "$v" "$1" "$2" "$3"
}

# run python with the limiter preloaded; $1 = state file, rest = env/args
limited() {
    local st=$1; shift
    env LD_PRELOAD="$LIB" CUDA_DEVICE_MEMORY_SHARED_CACHE="$st" "$@"
}

cat >"$WORK/meminfo.py" <<'EOF'
import torch
free, total = torch.cuda.mem_get_info(0)
print(free, total)
EOF

cat >"$WORK/oom.py" <<'EOF'
import os, torch
L = int(os.environ["EXPECT_LIMIT"])
under = over_raised = False
try:
    x = torch.empty(L // 2, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    under = True
    del x
except RuntimeError as e:
    print("under-limit allocation failed:", e)
torch.cuda.empty_cache()
try:
    y = torch.empty(L + L // 4, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("over-limit allocation succeeded")
except torch.cuda.OutOfMemoryError:
    over_raised = True
print(int(under), int(over_raised))
EOF

cat >"$WORK/hold.py" <<'EOF'
import os, sys, time, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open(sys.argv[2], "w").write("ok")
time.sleep(float(sys.argv[3]))
EOF

cat >"$WORK/try.py" <<'EOF'
import sys, torch
try:
    x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("ok")
except torch.cuda.OutOfMemoryError:
    print("oom")
EOF

# saturating matmul loop; prints iterations/s over the second half of the run
cat >"$WORK/work.py" <<'EOF'
import sys, time, torch
dur = float(sys.argv[1])
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.float16)
b = torch.randn(n, n, device="cuda", dtype=torch.float16)
for _ in range(10):
    a @ b
torch.cuda.synchronize()
t0 = time.time()
it = 0
mark_t = mark_it = None
while True:
    for _ in range(4):
        c = a @ b
    torch.cuda.synchronize()      # keep the queue short so pacing shows
    it += 4
    now = time.time()
    if mark_t is None and now - t0 >= dur / 2:
        mark_t, mark_it = now, it
    if now - t0 >= dur:
        break
print((it - mark_it) / (now - mark_t))
EOF

# launch-bound: many tiny kernels
cat >"$WORK/launch.py" <<'EOF'
import time, torch
x = torch.zeros(1, device="cuda")
for _ in range(2000):
    x.add_(1)
torch.cuda.synchronize()
n = 200000
t0 = time.perf_counter()
for _ in range(n):
    x.add_(1)
torch.cuda.synchronize()
print(n / (time.perf_counter() - t0))
EOF

within() { # value lo hi -> exit status
    "$PY" -c "import sys; v=float('$1'); sys.exit(0 if $2 <= v <= $3 else 1)"
}

echo "== 1. torch.cuda.mem_get_info"
out=$(limited "$WORK/s1" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/meminfo.py" 2>&1 | tail -1)
total=$(echo "$out" | awk '{print $2}')
[ "$total" = "$LIMIT" ]; record "mem_get_info total" "$LIMIT" "${total:-error: $out}" $?

echo "== 2. allocation under / past the limit"
out=$(limited "$WORK/s2" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m EXPECT_LIMIT=$LIMIT "$PY" "$WORK/oom.py" 2>&1 | tail -1)
[ "$(echo "$out" | awk '{print $1}')" = 1 ]; record "alloc L/2 works" "ok" "$out" $?
[ "$(echo "$out" | awk '{print $2}')" = 1 ]; record "alloc 1.25 L raises OutOfMemoryError" "raised" "$out" $?

echo "== 3. nvidia-smi with the limiter"
smi=$(limited "$WORK/s3" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m \
      nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>&1 | head -1 | tr -d ' ')
[ "$smi" = "$LIMIT_MIB" ]; record "nvidia-smi memory.total (MiB)" "$LIMIT_MIB" "$smi" $?

echo "== 4. two processes share one limit"
S4="$WORK/s4"
limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/hold.py" $((LIMIT * 6 / 10)) "$WORK/ready4" 120 \
    >/dev/null 2>&1 &
HOLDER=$!; PIDS="$PIDS $HOLDER"
for _ in $(seq 1 600); do [ -s "$WORK/ready4" ] && break; sleep 0.1; done
a=$(limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/try.py" $((LIMIT * 6 / 10)) 2>&1 | tail -1)
b=$(limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/try.py" $((LIMIT * 3 / 10)) 2>&1 | tail -1)
[ "$a" = oom ]; record "2nd process 0.6 L while 1st holds 0.6 L" "oom" "$a" $?
[ "$b" = ok ]; record "2nd process 0.3 L while 1st holds 0.6 L" "ok" "$b" $?
kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null
c=$(limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/try.py" $((LIMIT * 6 / 10)) 2>&1 | tail -1)
[ "$c" = ok ]; record "0.6 L after the holder was killed" "ok" "$c" $?

echo "== 5. compute share (${SHARE}%), ${DURATION}s per run"
solo=$("$PY" "$WORK/work.py" "$DURATION" 2>/dev/null | tail -1)
alone=$(limited "$WORK/s5a" CUDA_DEVICE_SM_LIMIT=$SHARE "$PY" "$WORK/work.py" "$DURATION" 2>/dev/null | tail -1)
"$PY" "$WORK/work.py" $((DURATION + 30)) >/dev/null 2>&1 &
NEIGH=$!; PIDS="$PIDS $NEIGH"
sleep 5
shared=$(limited "$WORK/s5b" CUDA_DEVICE_SM_LIMIT=$SHARE "$PY" "$WORK/work.py" "$DURATION" 2>/dev/null | tail -1)
kill "$NEIGH" 2>/dev/null; wait "$NEIGH" 2>/dev/null
pct() { "$PY" -c "print(round(100.0 * float('$1') / float('$2'), 1))" 2>/dev/null || echo error; }
p_alone=$(pct "$alone" "$solo"); p_shared=$(pct "$shared" "$solo")
within "$p_alone" $((SHARE - 5)) $((SHARE + 5)) 2>/dev/null
record "limited ${SHARE}% alone: % of solo it/s (solo ${solo})" "$SHARE+-5" "$p_alone" $?
within "$p_shared" $((SHARE - 5)) $((SHARE + 5)) 2>/dev/null
record "limited ${SHARE}% vs saturating neighbour: % of solo" "$SHARE+-5" "$p_shared" $?

echo "== 6. launch overhead (tiny kernels, median of 3)"
base=(); with=()
for i in 1 2 3; do
    base+=("$("$PY" "$WORK/launch.py" 2>/dev/null | tail -1)")
    with+=("$(limited "$WORK/s6" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/launch.py" 2>/dev/null | tail -1)")
done
slow=$("$PY" - "${base[@]}" "${with[@]}" <<'EOF'
import statistics, sys
v = [float(x) for x in sys.argv[1:]]
b, w = statistics.median(v[:3]), statistics.median(v[3:])
print(round(100.0 * (b / w - 1.0), 2))
EOF
)
within "${slow:-error}" -100 3 2>/dev/null
record "launch-bound slowdown % (${base[*]} vs ${with[*]} launches/s)" "<= 3" "${slow:-error}" $?

echo
echo "== results"
{
    printf 'check\texpected\tmeasured\tresult\n'
    cat "$RESULTS"
} >"$WORK/table"
if command -v column >/dev/null; then column -t -s "$(printf '\t')" "$WORK/table"; else cat "$WORK/table"; fi
[ "$FAILED" = 0 ]
