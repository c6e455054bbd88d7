#!/bin/sh
# run_tests.sh BUILD_DIR - runs every limiter test against the fake driver
# (and, from limiter/nonfree, the real CUDA runtime, driver library, NVML
# and nvidia-smi from Debian's non-free component; fetch_nonfree.sh gets
# them). Each check prints PASS/FAIL; the last line is "N passed, M failed"
# and the exit status is non-zero if anything failed. SANITIZE=1 runs the
# ASan/UBSan build (the sanitizer runtimes must be preloaded ahead of the
# limiter). Needs root for the namespace tests (a private mount namespace
# to put a limits file at /etc/tessera/limiter.conf, pid namespaces for a
# restarted container), sudo, and the non-free binaries: without them
# those tests print SKIP with what is missing and how to get it, or FAIL
# when TESSERA_TEST_STRICT is set (make test and CI set it).
set -u
B=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
NONFREE=${TESSERA_NONFREE:-$SRC/nonfree}
T=$(mktemp -d /tmp/tl-test.XXXXXX)
chmod 755 "$T"
trap 'rm -rf "$T"' EXIT
FAKE=$B/fake
export LD_LIBRARY_PATH="$FAKE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FAKE_GPU_MEM=17179869184
PRE="$B/libtessera-limiter.so"
SIMPRE="$B/sim/libtessera-limiter.so"
SANPRE=""
if [ "${SANITIZE:-0}" = 1 ]; then
    SANPRE="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
    PRE="$SANPRE $PRE"
    SIMPRE="$SANPRE $SIMPRE"
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
fi
L=1048576
LOG="$T/log"
: >"$LOG"

# record lines from a test program; a crash or a non-zero exit without any
# FAIL line still counts as a failure
run() { # name cmd...
    name=$1; shift
    out=$("$@" 2>"$T/err"); rc=$?
    printf '%s\n' "$out" | grep -E '^(PASS|FAIL|#)' | tee -a "$LOG"
    if [ $rc -ne 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL'; then
        echo "FAIL $name: exit $rc: $(head -c 600 "$T/err")" | tee -a "$LOG"
    fi
}
check() { # name condition-exit-status [detail]
    if [ "$2" -eq 0 ]; then echo "PASS $1" | tee -a "$LOG"; else echo "FAIL $1${3:+: $3}" | tee -a "$LOG"; fi
}
# need NAME WHAT HOW: the test NAME cannot run here, for want of WHAT
# (HOW gets it): SKIP, or FAIL when TESSERA_TEST_STRICT is set (make test
# and CI set it: a run that must run everything never skips silently)
need() {
    if [ -n "${TESSERA_TEST_STRICT:-}" ] && [ "${TESSERA_TEST_STRICT:-}" != 0 ]; then
        echo "FAIL $1: needs $2: $3 (TESSERA_TEST_STRICT=1: a missing need fails)" | tee -a "$LOG"
    else
        echo "SKIP $1: needs $2: $3" | tee -a "$LOG"
    fi
}
state() { echo "$T/state.$1"; }
lim() { # run a client with the limiter preloaded: lim STATE ENV... -- client args
    # (context charges off unless a test sets TESSERA_CONTEXT_RESERVE: exact boundaries)
    st=$1; shift
    env CUDA_DEVICE_MEMORY_SHARED_CACHE="$st" LD_PRELOAD="$PRE" TESSERA_CONTEXT_RESERVE=0 "$@"
}
limm() { # the same with the default (measured) context charge
    st=$1; shift
    env CUDA_DEVICE_MEMORY_SHARED_CACHE="$st" LD_PRELOAD="$PRE" "$@"
}
wait_file() { i=0; while [ ! -s "$1" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done; }

# 1. pure unit tests; the shipped build loads on glibc 2.17
run units "$B/test_units"
run pacer "$B/test_pacer"
[ "${SANITIZE:-0}" = 1 ] || run glibc sh "$SRC/test/check_glibc.sh" "$B/libtessera-limiter.so"

# 2. the fake driver alone does not enforce anything
run nolimit-sym "$B/client_sym" nolimit $L
run nolimit-dl "$B/client_dl" nolimit $L

G=1073741824
for c in client_sym client_dl; do
    # 3. every allocation path at the boundary, both access routes
    run "boundary-$c" lim "$(state b$c)" CUDA_DEVICE_MEMORY_LIMIT=1m CUDA_DEVICE_MEMORY_LIMIT_1=2m \
        EXPECT_LIMIT_1=$((2 * L)) "$B/$c" boundary $L
    # 4. context footprint
    run "ctx-$c" lim "$(state c$c)" CUDA_DEVICE_MEMORY_LIMIT=$L TESSERA_CONTEXT_RESERVE=64k \
        "$B/$c" ctx $L 65536
    # context footprint measured by default (the fake's contexts take FAKE_CTX_MEM), clamped
    run "ctxmeasure-$c" limm "$(state cm$c)" CUDA_DEVICE_MEMORY_LIMIT=$G FAKE_CTX_MEM=$((100 * L)) \
        "$B/$c" ctxmeasure $G $((100 * L))
    run "ctxmeasure-primary-$c" limm "$(state cm$c)" CUDA_DEVICE_MEMORY_LIMIT=$G FAKE_CTX_MEM=$((100 * L)) \
        PRIMARY_FIRST=1 "$B/$c" ctxmeasure $G $((100 * L))
    run "ctxmeasure-min-$c" limm "$(state cm$c)" CUDA_DEVICE_MEMORY_LIMIT=$G "$B/$c" ctxmeasure $G $((32 * L))
    run "ctxmeasure-max-$c" limm "$(state cm$c)" CUDA_DEVICE_MEMORY_LIMIT=8g FAKE_CTX_MEM=$((3 * G)) \
        "$B/$c" ctxmeasure $((8 * G)) $((2 * G))
    run "ctxmeasure-nonvml-$c" limm "$(state cm$c)" CUDA_DEVICE_MEMORY_LIMIT=$G FAKE_CTX_MEM=$((100 * L)) \
        FAKE_NVML_MEM_FAIL=1 "$B/$c" ctxmeasure $G $((256 * L))
    run "ctxmeasure-over-$c" limm "$(state cm$c)" CUDA_DEVICE_MEMORY_LIMIT=64m FAKE_CTX_MEM=$((100 * L)) \
        "$B/$c" ctxmeasure $((64 * L)) $((100 * L))
    run "ctxmeasure-off-$c" limm "$(state cm$c)" CUDA_DEVICE_MEMORY_LIMIT=$G FAKE_CTX_MEM=$((100 * L)) \
        TESSERA_CONTEXT_RESERVE=0 "$B/$c" ctxmeasure $G 0
    # graph memory: alloc nodes, child graphs, stream capture, upload, trim
    run "graph-$c" lim "$(state g$c)" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/$c" graph $L
    run "graphover-$c" lim "$(state go$c)" CUDA_DEVICE_MEMORY_LIMIT=$L FAKE_GRAPH_GRANULE=$((L / 2)) \
        "$B/$c" graphover $L
    # 5. reporting
    run "report-$c" lim "$(state r$c)" CUDA_DEVICE_MEMORY_LIMIT_0=$L EXPECT_DEV1_UNLIMITED=1 \
        "$B/$c" report $L
    # entry points come from the limiter whichever way they were looked up
    run "routes-$c" lim "$(state r$c)" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/$c" routes
    # eight threads of one process
    run "threads-$c" lim "$(state t$c)" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/$c" threads $L
    # 6. eight processes, one limit
    run "multi-$c" lim "$(state m$c)" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/$c" multi $L 8
    # hole 1: VMM memory charged until the last mapping and handle are gone
    run "vmm-$c" lim "$(state v$c)" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/$c" vmm $L
    # hole 6: pool reserve, heap, stack, module globals, context growth
    run "unseen-$c" lim "$(state u$c)" CUDA_DEVICE_MEMORY_LIMIT=$L FAKE_MODULE_MEM=$((L / 4)) \
        FAKE_CTX_GROWTH=$((L / 8)) FAKE_SM_COUNT=4 "$B/$c" unseen $L
    # hole 8: NVML index, pool and stream devices matched by UUID (NVML
    # enumerates the two GPUs in the other order)
    run "multigpu-$c" lim "$(state mg$c)" CUDA_DEVICE_MEMORY_LIMIT_0=$L CUDA_DEVICE_MEMORY_LIMIT_1=$((2 * L)) \
        FAKE_NVML_ORDER=1,0 "$B/$c" multigpu $L
    # hole 9: nvidia-smi sees only the container; NVML free = cuMemGetInfo free <= real free
    run "smi-$c" lim "$(state s$c)" CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_MEM=2g \
        FAKE_NVML_NEIGHBOURS=3999000:50:1536 "$B/$c" smi $G 3999000
done
run smi-v3-stride-32 lim "$(state s32)" CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_MEM=2g FAKE_NVML_V3_STRIDE=32 \
    FAKE_NVML_NEIGHBOURS=3999000:50:1536 "$B/client_sym" smi $G 3999000
run ctx-measured-on-the-right-gpu limm "$(state cg)" CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CTX_MEM=$((100 * L)) \
    FAKE_NVML_ORDER=1,0 "$B/client_sym" ctxgpu $G $((100 * L))

# hole 7: every hooked name, version (11.0 .. 13.x) and flag resolves to
# its hook, whatever address the driver gives (thunks) or not
run gpa-thunks lim "$(state gt)" CUDA_DEVICE_MEMORY_LIMIT=$L FAKE_GPA_THUNKS=1 "$B/client_dl" gpa
run gpa-exported lim "$(state ge)" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_dl" gpa
run boundary-thunks lim "$(state th)" CUDA_DEVICE_MEMORY_LIMIT=1m FAKE_GPA_THUNKS=1 "$B/client_dl" boundary $L
run routes-thunks lim "$(state th)" CUDA_DEVICE_MEMORY_LIMIT=1m FAKE_GPA_THUNKS=1 "$B/client_dl" routes

# 7. SIGKILL of a process holding memory returns its share
# (env directly, not the lim function, so that $! is the client itself)
S=$(state kill)
env CUDA_DEVICE_MEMORY_SHARED_CACHE="$S" LD_PRELOAD="$PRE" CUDA_DEVICE_MEMORY_LIMIT=$L \
    "$B/client_sym" hold $((3 * L / 4)) "$T/ready" >/dev/null 2>&1 &
HOLDER=$!
wait_file "$T/ready"
check "holder allocated 3/4 L" "$(grep -qx 0 "$T/ready"; echo $?)"
run kill-before lim "$S" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_dl" try $((L / 2)) oom "second-process-refused-while-holder-lives"
kill -9 $HOLDER; wait $HOLDER 2>/dev/null
run kill-after lim "$S" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_dl" try $((L / 2)) ok "sigkilled-holder-share-reclaimed"

# 8. a process with a smaller limit than what is in use: never negative
S=$(state over); rm -f "$T/ready"
env CUDA_DEVICE_MEMORY_SHARED_CACHE="$S" LD_PRELOAD="$PRE" CUDA_DEVICE_MEMORY_LIMIT=$((2 * L)) \
    "$B/client_sym" hold $((3 * L / 2)) "$T/ready" >/dev/null 2>&1 &
HOLDER=$!
wait_file "$T/ready"
run overfull lim "$S" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_sym" overfull $L
kill -9 $HOLDER; wait $HOLDER 2>/dev/null

# hole 10: a stopped process holding the shared lock freezes nobody for
# long: the allocation is refused after the bounded wait, with a message
S=$(state stop)
"$B/test_units" holdlock "$S" &
HOLDER=$!
i=0; while [ ! -e "$S.locked" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
run lock-holder-stopped timeout 20 env CUDA_DEVICE_MEMORY_SHARED_CACHE="$S" LD_PRELOAD="$PRE" \
    CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_sym" timedtry $((L / 2)) oom 5 lock-holder-stopped-bounded-wait
grep -q "held for more than" "$T/err"; check "lock-holder-stopped: stderr says why" $?
kill -9 $HOLDER; wait $HOLDER 2>/dev/null

# 9. malformed environment fails closed, naming the variable and value
for kv in CUDA_DEVICE_MEMORY_LIMIT=12x CUDA_DEVICE_MEMORY_LIMIT_0=4gb CUDA_DEVICE_MEMORY_LIMIT=-1 \
          CUDA_DEVICE_SM_LIMIT=150 CUDA_DEVICE_SM_LIMIT=half TESSERA_CONTEXT_RESERVE=big \
          CUDA_DEVICE_MEMORY_LIMIT_=1m CUDA_DEVICE_SM_LIMIT_=30 CUDA_DEVICE_MEMORY_LIMIT_00=1m \
          CUDA_DEVICE_MEMORY_LIMIT_16=1m CUDA_DEVICE_MEMORY_LIMITS=1g TESSERA_LIMITER_FOO=1 \
          TESSERA_LIMITER_DEBUG=yes CUDA_DEVICE_MEMORY_SHARED_CACHE=; do
    var=${kv%%=*}; val=${kv#*=}
    run "malformed $kv" lim "$(state bad)" CUDA_DEVICE_MEMORY_LIMIT=$L "$kv" "$B/client_dl" malformed
    env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state bad)" LD_PRELOAD="$PRE" CUDA_DEVICE_MEMORY_LIMIT=$L "$kv" \
        "$B/client_sym" malformed >/dev/null 2>"$T/err"
    grep -q "$var=\"$val\"" "$T/err"
    check "malformed $kv: stderr names variable and value" $?
done
# a variable given twice (execve allows it) is not trusted either
run "malformed twice" env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state bad)" LD_PRELOAD="$PRE" \
    CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_sym" envtwice CUDA_DEVICE_MEMORY_LIMIT=1t
# HAMi-core's switches that loosen its limits are not honoured, and said so
lim "$(state hami)" CUDA_DEVICE_MEMORY_LIMIT=$L CUDA_DISABLE_CONTROL=true "$B/client_sym" try $((L + 1)) oom \
    hami-disable-control-ignored >"$T/out" 2>"$T/err"
grep -q '^PASS' "$T/out" && grep -q "CUDA_DISABLE_CONTROL" "$T/err"
check "hami-disable-control-ignored-with-a-message" $? "$(cat "$T/out" "$T/err" | head -c 300)"
# an unusable shared-state file also fails closed
mkdir -p "$T/dir.state"
run "unusable-state-file" lim "$T/dir.state" CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_sym" malformed

# 10. compute pacing, in simulated time (FAKE_SIM=1, build/sim): mixed
# workloads get 30 +- 5 % with no stall over 1 s
sim() { env FAKE_SIM=1 CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state sim)" LD_PRELOAD="$SIMPRE" "$@"; }
for sc in grids graphs-then-grids persistent deep-queue sync-each mixed; do
    run "pacesim-$sc" sim CUDA_DEVICE_SM_LIMIT=30 "$B/client_sym" pacesim $sc 30 20
done
run pacesim-mixed-60 sim CUDA_DEVICE_SM_LIMIT=60 "$B/client_sym" pacesim mixed 60 20
# next to a saturating neighbour (time-slicing): 30 % of solo throughput
run pacesim-neighbour sim CUDA_DEVICE_SM_LIMIT=30 FAKE_GPU_NEIGHBOUR=1 "$B/client_sym" pacesim mixed 30 20
# a time-sliced GPU as NVML reports it (run 2, H200): ~99 % for ours and
# for the neighbour alike, whatever the GPU time; NVML's word must not
# throttle below the share (before: the rate fell to its floor, ~0 %)
run pacesim-sliced-nvml sim CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_SLICED=1 FAKE_NVML_NEIGHBOURS=3999000:99 \
    "$B/client_sym" pacesim mixed 30 20
run pacesim-sliced-nvml-grids sim CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_SLICED=1 FAKE_NVML_NEIGHBOURS=3999000:99 \
    "$B/client_sym" pacesim grids 30 20
# NVML with a new sample only every other period, reported one sample late
run pacesim-sparse-late sim CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_SPARSE=1 FAKE_NVML_LAG=1 "$B/client_sym" \
    pacesim graphs-then-grids 30 20
# without NVML: the events' timings alone
run pacesim-no-nvml sim CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_FAIL=1 "$B/client_sym" pacesim mixed 30 20
# host pids (a container's pid namespace), with and without process lists
run pacesim-pidns-fallback sim CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_PID_OFFSET=1000000 FAKE_NVML_NO_PROCLIST=1 \
    "$B/client_sym" pacesim grids 30 20
# its host pid never resolved (no process lists) and alone on the GPU, with
# event timings that see half the work (estimates too low): its samples,
# under a pid it cannot recognise, are no neighbour, so NVML (the device's
# utilisation) must still pull the rate below the share (before: the
# contention rule held it at the share, ~60 %)
run pacesim-pidns-alone-underestimated sim CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_PID_OFFSET=1000000 \
    FAKE_NVML_NO_PROCLIST=1 FAKE_EVENT_SCALE=0.5 "$B/client_sym" pacesim grids 30 20
run pacesim-pidns-neighbour sim CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_PID_OFFSET=1000000 \
    FAKE_NVML_NEIGHBOURS=3999000:100,3999001:0 "$B/client_sym" pacesim grids 30 20
# every launch variant is paced (NVML unavailable: the share on event timings)
run pace-each lim "$(state pe)" CUDA_DEVICE_SM_LIMIT=30 FAKE_NVML_FAIL=1 FAKE_BLOCK_US=1 "$B/client_dl" paceeach 1
grep -q "NVML unavailable" "$T/err"; check "NVML unavailable: warned on stderr" $?
run pace-each-off lim "$(state pe)" FAKE_NVML_FAIL=1 FAKE_BLOCK_US=1 "$B/client_dl" paceeach 0
run nopace lim "$(state p)" CUDA_DEVICE_MEMORY_LIMIT=$L FAKE_BLOCK_US=10 "$B/client_sym" nopace

mkdir -p "$T/tr"
# 10b. host pid discovery. hpcheck NAME ERRFILE [HOW]: the limiter's debug
# line names pid + FAKE_NVML_PID_OFFSET as this process's host pid (and was
# found by HOW)
OFF=100000
hpcheck() {
    line=$(grep "host pid" "$2" | grep -v "not resolved" | head -n 1)
    hp=$(printf '%s\n' "$line" | sed -n 's/.*host pid \([0-9]*\) (pid \([0-9]*\) here).*/\1 \2/p')
    ok=1
    [ -n "$hp" ] && [ "${hp% *}" -eq $((${hp#* } + OFF)) ] && ok=0
    [ $ok -eq 0 ] && [ -n "${3:-}" ] && ! printf '%s\n' "$line" | grep -q "$3" && ok=1
    check "$1" $ok
    [ $ok -eq 0 ] || echo "# $1: $(head -c 400 "$2")" | tee -a "$LOG"
}
HP="CUDA_DEVICE_SM_LIMIT=30 TESSERA_LIMITER_DEBUG=1 FAKE_NVML_PID_OFFSET=$OFF FAKE_NVML_NEIGHBOURS=3999000:50:300"
for v in 0 1 2; do # _v3, _v2, v1 process lists
    env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state hp$v)" LD_PRELOAD="$PRE" $HP FAKE_NVML_NO_V3=$v \
        "$B/client_sym" hostpid 0.4 0 >/dev/null 2>"$T/hp.err"
    hpcheck "hostpid-simple-list-v$((3 - v))" "$T/hp.err" "context-creation diff"
done
# two processes of different containers create their contexts at the same
# moment (both appear between both before/after lists): told apart by
# usedGpuMemory against what each has accounted
for c in a b; do
    env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state hpc$c)" LD_PRELOAD="$PRE" $HP FAKE_GPU_STATE_DIR="$T/procs1" \
        FAKE_CTX_RENDEZVOUS=2 CUDA_DEVICE_MEMORY_LIMIT=1g TESSERA_CONTEXT_RESERVE=0 TESSERA_LIMITER_TRACE="$T/tr/hpc" \
        "$B/client_sym" hostpid 2 $([ $c = a ] && echo $((64 * L)) || echo $((512 * L))) >/dev/null 2>"$T/hp.$c" &
    eval "P$c=\$!"
done
wait $Pa; wait $Pb
grep -q "not resolved yet (2 candidates)" "$T/hp.a"; check "hostpid-concurrent: ambiguous at first" $?
hpcheck hostpid-concurrent-a "$T/hp.a" "usedGpuMemory"
hpcheck hostpid-concurrent-b "$T/hp.b" "usedGpuMemory"
# the trace (TESSERA_LIMITER_TRACE, a file the tenant reads) holds nothing
# of the neighbours the NVML hooks hide: no pid, no SM %, no count of their
# entries (the pacing steps and host pid lines of the run above, the NVML
# list lines of nvidia-smi's calls next to a neighbour)
env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state trs)" LD_PRELOAD="$PRE" TESSERA_LIMITER_TRACE="$T/tr/smi" \
    CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_MEM=2g FAKE_NVML_NEIGHBOURS=3999000:50:1536 "$B/client_sym" smi $G 3999000 \
    >/dev/null 2>&1
grep -q "step dev 0" "$T"/tr/hpc.* && grep -q "not resolved" "$T"/tr/hpc.* && grep -q "nvml-list" "$T"/tr/smi.*
check "trace-written" $? "$(ls "$T/tr")"
leak=$(grep -hE '3999000|[0-9]+ of [0-9]+|processes listed' "$T"/tr/* | head -n 3)
check "trace-holds-no-neighbour" "$([ -z "$leak" ]; echo $?)" "$leak"
# the trace across fork (the child's own descriptors untouched, its own
# file) and a symbolic link planted at the trace path (not followed)
run trace-fork env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state trf)" LD_PRELOAD="$PRE" \
    TESSERA_LIMITER_TRACE="$T/tr/fork" "$B/client_sym" tracefork "$T/tr/victim"
# the same with a memory limit only (no pacing step to retry later; run 2's
# holder next to the neighbour): resolved once an allocation tells them
# apart, so the NVML process-list filter keeps the container's own process
# (also when the memory comes from cuMemCreate or a stream-ordered pool)
HPM="TESSERA_LIMITER_DEBUG=1 FAKE_NVML_PID_OFFSET=$OFF FAKE_NVML_NEIGHBOURS=3999000:50:300"
for via in cuMemAlloc_v2 cuMemCreate cuMemAllocAsync; do
    for c in a b; do
        env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state hpm$via$c)" LD_PRELOAD="$PRE" $HPM HOSTPID_ALLOC=$via \
            FAKE_GPU_STATE_DIR="$T/procs1m$via" FAKE_CTX_RENDEZVOUS=2 CUDA_DEVICE_MEMORY_LIMIT=2g \
            TESSERA_CONTEXT_RESERVE=0 "$B/client_sym" hostpid 1 $([ $c = a ] && echo $((256 * L)) || echo $((1024 * L))) \
            >/dev/null 2>"$T/hp.$c" &
        eval "P$c=\$!"
    done
    wait $Pa; wait $Pb
    sfx=$([ $via = cuMemAlloc_v2 ] || echo "-$via")
    hpcheck "hostpid-memory-only-concurrent$sfx-a" "$T/hp.a" "usedGpuMemory"
    hpcheck "hostpid-memory-only-concurrent$sfx-b" "$T/hp.b" "usedGpuMemory"
done
# the same with nothing to compare (no memory limit): resolved by
# intersecting the candidates over time once the other process has gone
env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state hpi)" LD_PRELOAD="$PRE" $HP FAKE_GPU_STATE_DIR="$T/procs2" \
    FAKE_CTX_RENDEZVOUS=2 "$B/client_sym" hostpid 0.5 0 >/dev/null 2>"$T/hp.a" &
Pa=$!
env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state hpi)" LD_PRELOAD="$PRE" $HP FAKE_GPU_STATE_DIR="$T/procs2" \
    FAKE_CTX_RENDEZVOUS=2 "$B/client_dl" hostpid 2.5 0 >/dev/null 2>"$T/hp.b" &
Pb=$!
wait $Pa; wait $Pb
hpcheck hostpid-intersection "$T/hp.b" "intersected"
# two processes of one container, one after the other: each resolves its own
# host pid (and publishes it in its slot, where the other excludes it)
env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state hps)" LD_PRELOAD="$PRE" $HP FAKE_GPU_STATE_DIR="$T/procs3" \
    "$B/client_sym" hostpid 1.5 0 >/dev/null 2>"$T/hp.a" &
Pa=$!
sleep 0.5
env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state hps)" LD_PRELOAD="$PRE" $HP FAKE_GPU_STATE_DIR="$T/procs3" \
    "$B/client_dl" hostpid 0.4 0 >/dev/null 2>"$T/hp.b"
wait $Pa
hpcheck hostpid-container-first "$T/hp.a"
hpcheck hostpid-container-second "$T/hp.b"
# two processes of one container pace on their summed utilisation (next to
# a 50 % neighbour): together they stay at the container's share (real
# time: two processes do not share a simulated clock; loose bounds)
PC="CUDA_DEVICE_MEMORY_SHARED_CACHE=$(state pc) CUDA_DEVICE_SM_LIMIT=30 FAKE_BLOCK_US=10 \
    FAKE_NVML_PID_OFFSET=$OFF FAKE_NVML_NEIGHBOURS=3999000:50 FAKE_GPU_STATE_DIR=$T/procs4 PACE_SHARED=1"
env LD_PRELOAD="$PRE" $PC "$B/client_sym" pace 30 4 >"$T/pc.a" 2>/dev/null &
Pa=$!
sleep 0.3
env LD_PRELOAD="$PRE" $PC "$B/client_dl" pace 30 3.7 >"$T/pc.b" 2>/dev/null
wait $Pa
sum=$(cat "$T/pc.a" "$T/pc.b" | sed -n 's/^# pacing: target 30% measured \([0-9.]*\)%.*/\1/p' | awk '{s += $1; n++} END {if (n == 2) print s; else print -1}')
echo "# pacing, two processes of one container: sum $sum% (target 30%)" | tee -a "$LOG"
check "pace-container-sum-within-share" "$(awk -v s="$sum" 'BEGIN {exit !(s < 35)}'; echo $?)"
check "pace-container-sum-not-starved" "$(awk -v s="$sum" 'BEGIN {exit !(s > 10)}'; echo $?)"

# 10b. another preloaded library that replaces malloc, as tcmalloc and
# jemalloc do (a pod's LD_PRELOAD, or its image's preload list): both load,
# every allocation of the process (the limiter's tables too) comes from it,
# and the limit holds at its boundary, whichever comes first. Under the
# sanitizers the ASan runtime must come first and serves malloc itself, so
# only the limit is checked there.
MI="$B/libtest-malloc.so"
orders="$PRE $MI"
[ "${SANITIZE:-0}" = 1 ] || orders="$MI $PRE
$PRE $MI"
printf '%s\n' "$orders" | while IFS= read -r order; do
    first=$(basename "$(printf '%s' "$order" | awk '{print $1}')")
    rm -f "$T/mark"
    run "malloc-interposer-boundary ($first first)" env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state mi$first)" LD_PRELOAD="$order" \
        TESSERA_CONTEXT_RESERVE=0 CUDA_DEVICE_MEMORY_LIMIT=1m CUDA_DEVICE_MEMORY_LIMIT_1=2m EXPECT_LIMIT_1=$((2 * L)) \
        TEST_MALLOC_MARK="$T/mark" "$B/client_sym" boundary $L
    if [ "${SANITIZE:-0}" != 1 ]; then
        n=$(cat "$T/mark" 2>/dev/null || echo 0)
        check "malloc-interposer-served-the-process ($first first)" "$([ "$n" -gt 0 ]; echo $?)" "$n allocations"
    fi
    run "malloc-interposer-over ($first first)" env CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state mo$first)" LD_PRELOAD="$order" \
        TESSERA_CONTEXT_RESERVE=0 CUDA_DEVICE_MEMORY_LIMIT=$L "$B/client_dl" try $((L + 1)) oom interposer-over-the-limit-refused
done

# 11. harmless in processes that never touch CUDA (e.g. via /etc/ld.so.preload)
S=$(state none)
out=$(lim "$S" CUDA_DEVICE_MEMORY_LIMIT=$L sh -c 'echo hello' 2>&1)
check "non-CUDA process unaffected" "$([ "$out" = hello ]; echo $?)"
check "non-CUDA process creates no state" "$([ ! -e "$S" ]; echo $?)"

# gpu-check.sh's own logic, with stub python3 and nvidia-smi (no GPU)
[ "${SANITIZE:-0}" = 1 ] || run gpu-check-logic sh "$SRC/test/test_gpu_check.sh" "$B/libtessera-limiter.so"

# 12. as root: the read-only limits file (hole 3), a restarted container
# (hole 4). The shipped library itself, with a file at the fixed path
# /etc/tessera/limiter.conf in a private mount namespace (an overlay over
# /etc that also carries ld.so.preload: processes started without the
# environment get the library as they would in a container).
. "$SRC/test/run_root_tests.sh"

# 13. the real NVIDIA binaries from Debian non-free (fetch_nonfree.sh)
. "$SRC/test/run_nonfree_tests.sh"

P=$(grep -c '^PASS' "$LOG")
F=$(grep -c '^FAIL' "$LOG")
S=$(grep -c '^SKIP' "$LOG")
[ "$S" -eq 0 ] || echo "skipped: $(sed -n 's/^SKIP \([^:]*\):.*/\1/p' "$LOG" | paste -sd' ')"
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ] && [ "$P" -gt 0 ]
