#!/bin/sh
# test_gpu_check.sh LIB - the logic of limiter/gpu-check.sh without a GPU:
# it runs the script with stub `python3` and `nvidia-smi` (through its PY
# and NVSMI variables) that answer like a machine in a given state, and
# checks the verdicts: physical use over the limit fails, a check the
# machine cannot run is NOT RUN (never a pass, exit status 3), the holder
# killed is the python process itself, the launch-overhead check runs with
# an SM limit, a share off target or a long stall fails, the driver's own
# memory limits are checked from r615 on (NOT RUN before) in a leaf cgroup
# the check process is moved into and that is removed after its soft limit
# was zeroed.
set -u
LIB=$1
HERE=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d /tmp/tl-gpucheck.XXXXXX)
trap '[ -n "${KEEP_T:-}" ] || rm -rf "$T"' EXIT
REALPY=$(command -v python3)
pass() { echo "PASS gpu-check: $1"; }
fail() { echo "FAIL gpu-check: $1${2:+: $2}"; }

# stub nvidia-smi: STUB_NGPU GPUs of 16384 MiB; compute apps are the pids
# the checks announced, each holding STUB_USED_MIB
cat >"$T/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
*--query-gpu=index*) i=0; while [ $i -lt "${STUB_NGPU:-1}" ]; do echo $i; i=$((i + 1)); done ;;
*--query-gpu=memory.total*)
    if [ -n "${CUDA_DEVICE_MEMORY_LIMIT:-}" ]; then echo "${CUDA_DEVICE_MEMORY_LIMIT%m}"; else echo 16384; fi ;;
*--query-gpu=name*) echo "Stub GPU" ;;
*--query-gpu=driver_version*) echo "${STUB_DRIVER:-535.0}" ;;
*--query-gpu=memory.free*) echo 12000 ;;
*pmon*)
    # the work.py processes (their pids in work.pids) at STUB_PMON_SM % each
    echo "# gpu         pid   type     sm    mem"
    while :; do
        while read -r p; do
            kill -0 "$p" 2>/dev/null && echo "    0       $p     C     ${STUB_PMON_SM:-30}      7   -   python3"
        done <"$STUB_WORK/work.pids" 2>/dev/null
        sleep 0.1
    done ;;
*utilization.gpu*)
    # the GPU's utilisation: what the running work.py stub wrote (its
    # share, 100 solo), 0 between runs; the SM clock boosts below 50 %
    while :; do
        u=$(cat "$STUB_WORK/util" 2>/dev/null); u=${u:-0}
        if [ "$u" -lt 50 ]; then c=1980; else c=1430; fi
        echo "2026/01/01 00:00:00.000, $u %, $c MHz, 300.00 W"
        sleep 0.05
    done ;;
*--query-compute-apps*)
    # run in the nvidia-smi check's container (its state file s5), the
    # limiter lists only that container's holder, unless told to leak
    only=""
    case "${CUDA_DEVICE_MEMORY_SHARED_CACHE:-}" in
    */s5) [ -n "${STUB_SMI_UNFILTERED:-}" ] || only=$(cat "$STUB_WORK/ready-me" 2>/dev/null) ;;
    esac
    for f in "$STUB_WORK"/*.pids; do
        [ -f "$f" ] || continue
        while read -r p; do
            [ -z "$only" ] || [ "$p" = "$only" ] || continue
            kill -0 "$p" 2>/dev/null && echo "$p, ${STUB_USED_MIB:-1000}"
        done <"$f"
    done ;;
esac
EOF

# stub python3: the scripts by name; -c for the availability probes
cat >"$T/python3" <<EOF
#!/bin/sh
REALPY=$REALPY
EOF
cat >>"$T/python3" <<'EOF'
L=${CUDA_DEVICE_MEMORY_LIMIT:-16384m}; L=${L%m}
case "$1" in
-c) case "$2" in *nccl*) [ "${STUB_NCCL:-0}" = 1 ]; exit $? ;; *) exit 0 ;; esac ;;
-) shift; exec "$REALPY" - "$@" ;;
esac
# STUB_NATIVE=real: the check's own native.py, on the fake driver
case "$1" in */native.py) [ "${STUB_NATIVE:-}" = real ] && exec "$REALPY" "$@" ;; esac
script=$(basename "$1"); shift
announce() { echo $$ >>"$GPU_CHECK_PIDS"; }
# seen: stay alive until the check's sampler has listed this process (at
# most 10 s), as a real allocation would hold its memory that long: a
# fixed short sleep left no sample on a loaded 2-core CI machine
seen() {
    i=0
    while [ $i -lt 200 ] && ! grep -q " $$," "${GPU_CHECK_PIDS%.pids}.samples" 2>/dev/null; do
        sleep 0.05; i=$((i + 1))
    done
}
case $script in
meminfo.py)
    l0=${CUDA_DEVICE_MEMORY_LIMIT_0:-${L}m}; l0=${l0%m}
    echo "0 $((l0 * 1048576 - 300 * 1048576)) $((l0 * 1048576))"
    [ -n "${CUDA_DEVICE_MEMORY_LIMIT_1:-}" ] && echo "1 0 $((${CUDA_DEVICE_MEMORY_LIMIT_1%m} * 1048576))"
    ;;
smifree.py) f=$(( (L - 1024) * 1048576 )); echo "smifree $f $((f + ${STUB_NVML_FREE_OFF_MIB:-0} * 1048576)) $((L * 1048576)) $((L * 1048576))" ;;
fill.py) announce; seen; echo "filled $((L - 320))" ;;
vmm.py) announce; seen; echo "vmm $((L - 512)) $((L - 512)) 2 2" ;;
heap.py) announce; seen; echo "heap 0 1 ${STUB_HEAP_KERNEL:-none}" ;;
graph.py)
    # STUB_GRAPH_CRASH=before: killed by SIGSEGV before its result line;
    # =after: after it (a crash at teardown)
    announce; seen
    [ "${STUB_GRAPH_CRASH:-}" = before ] && kill -SEGV $$
    echo "phase small: captured and replayed"; echo "graph 1 1"
    if [ "${STUB_GRAPH_CRASH:-}" = after ]; then echo "Fatal Python error: Segmentation fault" >&2; kill -SEGV $$; fi
    ;;
smiprocs.py)
    me=$(cat "$STUB_WORK/ready-me" 2>/dev/null); nb=""
    [ -n "${STUB_NVML_UNFILTERED:-}" ] && nb=$(cat "$STUB_WORK/ready-nb" 2>/dev/null)
    echo "procs nvmlDeviceGetComputeRunningProcesses_v2 $nb $me" ;;
nccl.py) announce; seen; echo "nccl 1048576.0" ;;
hold.py) announce; echo $$ >"$2"; exec sleep "$3" ;;
try.py)
    holder=$(cat "$STUB_WORK/ready4" 2>/dev/null)
    if [ $(($1 / 1048576)) -gt $((L / 2)) ] && [ -n "$holder" ] && kill -0 "$holder" 2>/dev/null; then echo oom; else echo ok; fi ;;
work.py)
    # synthetic completion times (4 iterations each): 100 it/s solo, the
    # share when limited, a stall if asked
    dur=$1; out=$3
    echo $$ >>"$STUB_WORK/work.pids"
    share=${CUDA_DEVICE_SM_LIMIT:+${STUB_SHARE:-30}}; share=${share:-100}
    awk -v dur="$dur" -v r="$share" -v stall="${STUB_STALL:-0}" -v lim="${CUDA_DEVICE_SM_LIMIT:-}" 'BEGIN {
        t = 0; while (t < dur) { t += 4 / r; if (stall && lim != "" && t > dur * 0.7 && t < dur * 0.7 + 1.5) t = dur * 0.7 + 1.5; printf "%.4f\n", t } }' >"$out"
    if [ -n "${STUB_UTIL_ALT:-}" ] && [ -n "${CUDA_DEVICE_SM_LIMIT:-}" ]; then
        # a limiter that alternates busy (the share) and idle phases
        for i in 1 2 3 4 5 6; do
            echo "$share" >"$STUB_WORK/util"; sleep 0.15; echo 0 >"$STUB_WORK/util"; sleep 0.15
        done
        echo "$share" >"$STUB_WORK/util"; sleep 0.15
    else
        echo "$share" >"$STUB_WORK/util"
        sleep 0.5
    fi
    rm -f "$STUB_WORK/util" ;;
launch.py)
    echo "$script SM=${CUDA_DEVICE_SM_LIMIT:-none}" >>"$STUB_WORK/launch.log"
    echo 100000 ;;
native.py)
    # "clear DIR": logs whether DIR still existed; "check SOFT HARD": a
    # driver that enforces (STUB_NATIVE unset), ignores the limits
    # (=ignored) or a MIG GPU (=mig). The process must already be in its
    # leaf (NATIVE_CGROUP_PARENT/*/cgroup.procs), and leaves it at exit as
    # the kernel would take it out.
    if [ "$1" = clear ]; then
        if [ -d "$2" ]; then echo "clear $2 exists" >>"$STUB_WORK/native.log"; else echo "clear $2 gone" >>"$STUB_WORK/native.log"; fi
        echo "native clear 0"; exit 0
    fi
    procs=$(grep -l "^$$\$" "$NATIVE_CGROUP_PARENT"/*/cgroup.procs 2>/dev/null)
    [ -n "$procs" ] && echo "in-leaf $procs" >>"$STUB_WORK/native.log"
    trap 'rm -f $procs' EXIT
    [ "${STUB_NATIVE:-}" = mig ] && { echo native-mig; exit 0; }
    announce; seen
    S=$2; H=$3; M=1048576
    echo "native cgroup ${procs%/cgroup.procs}"
    echo "native set 0"; echo "native get 0 $S $H 0"
    if [ "${STUB_NATIVE:-}" = ignored ]; then
        echo "native meminfo $((16000 * M)) $((16384 * M)) $((16000 * M)) $((16384 * M))"
        echo "native alloc $((H + 128 * M)) 0"; echo "native filled 0 $S $H $((H + 300 * M))"
    else
        echo "native meminfo $((H - 300 * M)) $H $((H - 300 * M)) $H"
        echo "native alloc $((H - 384 * M)) 2"; echo "native filled 0 $S $H $((H - 84 * M))"
    fi
    echo "native cleared 0"; echo "native after 6 0 0 0"; echo "native past 0" ;;
esac
EOF
chmod +x "$T/nvidia-smi" "$T/python3"

# run SCENARIO ENV...: gpu-check with the stubs; its output in $T/SCENARIO.out
gc() {
    name=$1; shift
    W=$T/work.$name
    mkdir -p "$W"
    env "$@" STUB_WORK="$W" WORK="$W" KEEP_WORK=1 PY="$T/python3" NVSMI="$T/nvidia-smi" LIB="$LIB" \
        LIMIT_MIB=4096 DURATION=4 SAMPLE_MS=50 NEIGHBOUR_WARMUP=0 bash "$HERE/gpu-check.sh" >"$T/$name.out" 2>&1
    echo $?
}
verdict() { # scenario check-name-prefix -> PASS/FAIL/NOT RUN
    grep -F "$2" "$T/work.$1/results" | head -1 | awk -F'\t' '{print $4}'
}

# 1. a machine where all is well, one GPU, no NCCL, no kernel compiler
rc=$(gc good STUB_USED_MIB=3000)
[ "$rc" = 3 ] && pass "one GPU, all well: exit 3 (some NOT RUN, none failed)" || fail "one GPU, all well: exit $rc" "$(grep "^FAIL" "$T/good.out")"
for c in "nccl two-process" "two-gpus different limits" "heap backed by an in-kernel malloc" "native memory limits"; do
    [ "$(verdict good "$c")" = "NOT RUN" ] && pass "'$c' NOT RUN on one GPU" || fail "'$c' is $(verdict good "$c"), want NOT RUN"
done
for c in "mem-info total" "fill-default physical" "fill-backend:cudaMallocAsync allocated" "vmm physical" \
         "kill-9 of the holder" "share-alone: GPU utilisation" "share-vs-saturating-neighbour: mean" "share-vs-saturating-neighbour: longest stall" "launch-bound slowdown"; do
    [ "$(verdict good "$c")" = PASS ] && pass "'$c' passes" || fail "'$c' is $(verdict good "$c")" "$(grep -F "$c" "$T/good.out")"
done
grep -q "passed, 0 failed, 4 not run" "$T/good.out" && pass "summary counts NOT RUN apart" || fail "summary" "$(tail -1 "$T/good.out")"
# the holder killed is the python process itself, not a shell around it
h=$(cat "$T/work.good/ready4" 2>/dev/null)
[ -n "$h" ] && ! kill -0 "$h" 2>/dev/null && pass "kill -9 reached the holder process ($h)" || fail "holder $h still alive"
# the launch overhead is measured with an SM limit active
grep -q "SM=99" "$T/work.good/launch.log" && grep -q "SM=none" "$T/work.good/launch.log" &&
    pass "launch overhead: with an SM limit and without" || fail "launch overhead runs" "$(cat "$T/work.good/launch.log")"

# the nvidia-smi checks: a neighbour hidden, NVML's free = cuMemGetInfo's
for c in "nvidia-smi in the container lists only its processes" "NVML free = cuMemGetInfo free" \
         "NVML free in the container <= real free"; do
    [ "$(verdict good "$c")" = PASS ] && pass "'$c' passes" || fail "'$c' is $(verdict good "$c")" "$(grep -F "$c" "$T/good.out")"
done
gc leak STUB_USED_MIB=3000 STUB_SMI_UNFILTERED=1 STUB_NVML_FREE_OFF_MIB=64 ONLY=smi >/dev/null
[ "$(verdict leak "nvidia-smi in the container lists only its processes")" = FAIL ] &&
    pass "a neighbour shown in the container: FAIL" || fail "neighbour shown: $(verdict leak "nvidia-smi in the container")"
[ "$(verdict leak "NVML free = cuMemGetInfo free")" = FAIL ] &&
    pass "NVML free 64 MiB above cuMemGetInfo's: FAIL" || fail "NVML free off: $(verdict leak "NVML free = cuMemGetInfo free")"

gc leak2 STUB_USED_MIB=3000 STUB_NVML_UNFILTERED=1 ONLY=smi >/dev/null
[ "$(verdict leak2 "NVML process list (exported")" = FAIL ] && [ "$(verdict leak2 "nvidia-smi in the container")" = PASS ] &&
    pass "a neighbour in NVML's exported process list: FAIL" || fail "NVML list leak: $(verdict leak2 "NVML process list")"
[ "$(verdict good "NVML process list (exported")" = PASS ] && pass "NVML's exported process list filtered: PASS" ||
    fail "NVML list: $(verdict good "NVML process list")" "$(grep -F "NVML process list" "$T/good.out")"

# the kill checks' sizes follow the measured context (the stub's: 300 MiB)
grep -q "context charge per process.*: 300$" "$T/good.out" && [ "$(verdict good "2nd process 0.6 L")" = PASS ] &&
    [ "$(verdict good "MiB (L - 0.4 L - 2 contexts")" = PASS ] && pass "kill: sizes from the measured context" ||
    fail "kill sizes" "$(grep -E "context charge|2nd process" "$T/good.out")"

# a graph check that crashes: no result line, or a crash at teardown
gc gcrash STUB_USED_MIB=3000 STUB_GRAPH_CRASH=before ONLY=memory >/dev/null
[ "$(verdict gcrash "graph-default: L/2")" = FAIL ] && [ "$(verdict gcrash "graph-default: the process exits")" = FAIL ] &&
    grep -q "exits cleanly.*139 (SIGSEGV)" "$T/work.gcrash/results" && pass "graph: crash before the result: both FAIL, SIGSEGV named" ||
    fail "graph crash before" "$(grep graph- "$T/work.gcrash/results")"
gc gcrash2 STUB_USED_MIB=3000 STUB_GRAPH_CRASH=after ONLY=memory >/dev/null
[ "$(verdict gcrash2 "graph-default: L/2")" = PASS ] && [ "$(verdict gcrash2 "graph-default: the process exits")" = FAIL ] &&
    grep -q "Segmentation fault" "$T/work.gcrash2/results" && [ -s "$T/work.gcrash2/diag/graph-default.err" ] &&
    pass "graph: crash at teardown: result kept, exit FAIL, stderr kept" ||
    fail "graph crash after" "$(grep graph- "$T/work.gcrash2/results")"

# 2. physical use over the limit (what nvidia-smi on the host sees) fails
rc=$(gc over STUB_USED_MIB=4500 ONLY=memory)
[ "$rc" = 1 ] && [ "$(verdict over "fill-default physical")" = FAIL ] &&
    pass "physical 4500 MiB over a 4096 MiB limit: FAIL, exit 1" || fail "physical over the limit: exit $rc, $(verdict over "fill-default physical")"

# 3. two GPUs, NCCL, a kernel compiler: everything runs
rc=$(gc full STUB_USED_MIB=3000 STUB_NGPU=2 STUB_NCCL=1 STUB_HEAP_KERNEL=ran ONLY=memory,nccl,gpus)
[ "$rc" = 0 ] && pass "two GPUs and NCCL: all run, exit 0" || fail "two GPUs: exit $rc" "$(grep -E 'FAIL|NOT RUN' "$T/full.out" | head -3)"

# 4. a share off target, and a stall, fail
gc off STUB_USED_MIB=3000 STUB_SHARE=50 ONLY=share >/dev/null
[ "$(verdict off "share-alone: GPU utilisation")" = FAIL ] && [ "$(verdict off "share-vs-saturating-neighbour: mean")" = FAIL ] &&
    pass "50 % for a 30 % share (GPU time alone, throughput next to the neighbour): FAIL" ||
    fail "share off target: $(verdict off "share-alone: GPU utilisation") $(verdict off "share-vs-saturating-neighbour: mean")"
# GPU utilisation alternating 30 % and 0 % is 15 %, not 30 (only the idle
# start-up and teardown are left out of the mean)
gc alt STUB_USED_MIB=3000 STUB_UTIL_ALT=1 ONLY=share >/dev/null
[ "$(verdict alt "share-alone: GPU utilisation")" = FAIL ] &&
    pass "utilisation alternating 30 % and 0 %: share-alone FAIL" ||
    fail "alternating 30/0 %: $(verdict alt "share-alone: GPU utilisation")" "$(grep -F "share-alone: GPU utilisation" "$T/work.alt/results")"
# alone, throughput against solo is reported with the clocks, not judged
grep -q "share-alone: mean % of solo throughput, 1 s windows (min [0-9.]*); SM clock MHz, limited vs solo.*1980 vs 1430" "$T/good.out" &&
    pass "share-alone: throughput and clocks reported" || fail "share-alone throughput INFO" "$(grep -F "share-alone: mean" "$T/good.out")"
gc stall STUB_USED_MIB=3000 STUB_STALL=1 ONLY=share >/dev/null
[ "$(verdict stall "share-alone: longest stall")" = FAIL ] && pass "a 1.5 s stall: FAIL" || fail "stall: $(verdict stall "share-alone: longest stall")"
# the limited process's SM % from the host's pmon is reported (INFO)
grep -q "share-alone: limited process's mean SM % (host nvidia-smi pmon): 30.0 (" "$T/good.out" &&
    pass "share-alone: the limited process's pmon SM % reported" ||
    fail "pmon SM % not reported" "$(grep -F "pmon" "$T/good.out")"

# 5. the driver's own memory limits: the driver version is reported; before
# r615 the group is NOT RUN (above), never a pass
grep -q "driver version (nvidia-smi): 535.0" "$T/good.out" && grep -F "native memory limits" "$T/work.good/results" | grep -q "driver 535.0" &&
    pass "driver version reported; native NOT RUN on driver 535" || fail "driver version / native on 535" "$(grep -E 'driver version|native' "$T/good.out")"
mkdir -p "$T/cg"
rc=$(gc native STUB_USED_MIB=3000 STUB_DRIVER=615.10 NATIVE_CGROUP_PARENT="$T/cg" ONLY=native)
nat=$(grep -c '^native.*PASS$' "$T/work.native/results")
[ "$rc" = 0 ] && [ "$nat" = 10 ] && pass "driver 615: 10 native checks pass, exit 0" ||
    fail "driver 615: exit $rc, $nat native passes" "$(grep -E '^native|native' "$T/native.out" | grep -v PASS | head -5)"
grep -q "^in-leaf $T/cg/tessera-gpu-check-[0-9]*/cgroup.procs" "$T/work.native/native.log" &&
    pass "native: the check process ran inside its own leaf cgroup" || fail "native: not moved into the leaf" "$(cat "$T/work.native/native.log")"
grep -q "^clear $T/cg/tessera-gpu-check-[0-9]* exists" "$T/work.native/native.log" && [ -z "$(ls "$T/cg")" ] &&
    pass "native: soft limit zeroed while the leaf existed, then the leaf removed" ||
    fail "native: clear/remove order" "$(cat "$T/work.native/native.log"; ls "$T/cg")"
rc=$(gc nativebad STUB_USED_MIB=4500 STUB_DRIVER=615.10 STUB_NATIVE=ignored NATIVE_CGROUP_PARENT="$T/cg" ONLY=native)
[ "$rc" = 1 ] && [ "$(verdict nativebad "native: cuMemAlloc 64 MiB steps refused")" = FAIL ] &&
    [ "$(verdict nativebad "native: cuMemGetInfo total")" = FAIL ] && [ "$(verdict nativebad "native physical")" = FAIL ] &&
    pass "driver 615 that does not enforce: alloc, cuMemGetInfo and physical FAIL, exit 1" ||
    fail "native not enforced: exit $rc" "$(grep '^native' "$T/work.nativebad/results")"
rc=$(gc nativemig STUB_DRIVER=615.10 STUB_NATIVE=mig NATIVE_CGROUP_PARENT="$T/cg" ONLY=native)
[ "$rc" = 3 ] && grep -F "native memory limits" "$T/work.nativemig/results" | grep -q "MIG mode" && [ -z "$(ls "$T/cg")" ] &&
    ! grep -q "PASS$" "$T/work.nativemig/results" &&
    pass "MIG GPU: native NOT RUN (no PASS), exit 3, leaf removed" || fail "native on MIG: exit $rc" "$(cat "$T/work.nativemig/results"; ls "$T/cg")"
rc=$(gc nativenocg STUB_DRIVER=615.10 NATIVE_CGROUP_PARENT=/nonexistent/cg ONLY=native)
[ "$rc" = 3 ] && grep -F "native memory limits" "$T/work.nativenocg/results" | grep -q "cannot make" &&
    pass "no cgroup v2 leaf to make: native NOT RUN, exit 3" || fail "native without a leaf: exit $rc" "$(cat "$T/work.nativenocg/results")"

# 6. the native group's own python (ctypes structures, its cgroup found
# from /proc/self/cgroup, the limits set, enforced and cleared) against the
# fake driver, which partitions memory per cgroup as r615 does, in a real
# leaf cgroup under this host's cgroup v2 mount (root)
FAKE=$(dirname "$LIB")/fake
CG2=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break } $(i + 1) == "cgroup2" && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
if [ "$(id -u)" != 0 ] || [ -z "$CG2" ]; then
    fail "native on the fake driver" "needs root and a mounted cgroup v2 hierarchy (uid $(id -u), cgroup2 at '${CG2:-none}')"
else
    rc=$(gc nativefake STUB_USED_MIB=3000 STUB_DRIVER=615.00 STUB_NATIVE=real NATIVE_CGROUP_PARENT="$CG2" \
         LD_LIBRARY_PATH="$FAKE" FAKE_GPU_STATE_DIR="$T/fakegpus" FAKE_NVML_PARTITIONING=1 FAKE_GPU_COUNT=1 \
         FAKE_GPU_MEM=17179869184 ONLY=native)
    nat=$(grep -c '^native.*PASS$' "$T/work.nativefake/results")
    [ "$rc" = 0 ] && [ "$nat" = 10 ] && ! ls -d "$CG2"/tessera-gpu-check-* >/dev/null 2>&1 &&
        pass "native.py on the fake r615 driver: 10 checks pass, the leaf cgroup is gone" ||
        fail "native.py on the fake driver: exit $rc, $nat passes" "$(grep -v PASS "$T/nativefake.out" | head -8; tail -3 "$T/work.nativefake/diag/native.err" 2>/dev/null)"
fi
