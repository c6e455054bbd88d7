#!/usr/bin/env bash
# gpu-check.sh - the limiter on a real NVIDIA GPU: the run that decides.
# Needs the NVIDIA driver, nvidia-smi, gcc, and python3 with a CUDA build of
# PyTorch; run it on the host (NVML reports host pids), as root or a user
# that may read every process's GPU usage.
#
#   bash limiter/gpu-check.sh                 # GPU 0 (and GPU 1 if present)
#   LIMIT_MIB=4096 DURATION=20 SHARE=30 bash limiter/gpu-check.sh
#
# Every memory figure is checked against the GPU itself: while a check runs,
# `nvidia-smi --query-compute-apps=pid,used_memory` is sampled every 200 ms
# and the physical memory its processes hold must stay within the limit
# + 1 %. Checks:
#   mem-info        torch.cuda.mem_get_info() reports the limit
#   fill-*          PyTorch fills to the limit in 64 MiB steps, with the
#                   default allocator, expandable_segments:True and
#                   backend:cudaMallocAsync: it gets close to the limit, never
#                   past it
#   vmm             cuMemCreate/cuMemMap/cuMemRelease in a loop (the NCCL idiom)
#   heap            cuCtxSetLimit(malloc heap) is charged; an in-kernel malloc
#                   (needs cupy or numba to build the kernel)
#   graph-*         torch.cuda.graph, and captured cudaMallocAsync
#   nccl            a two-process NCCL all-reduce (needs NCCL and 2 GPUs)
#   two-gpus        two GPUs with different limits
#   nvidia-smi      nvidia-smi run with the limiter shows the limit as total
#                   memory and only the container's processes (a neighbour
#                   outside it is hidden); NVML's free memory equals
#                   cuMemGetInfo's and is never above the real free memory
#   kill-9          a holder killed with SIGKILL gives its share back
#   share-*         a SHARE % process gets SHARE +- 5 % of its solo throughput
#                   next to a saturating neighbour, alone, and with CUDA graphs,
#                   in a 1 s time series whose longest stall is under 1 s
#   launch-overhead a launch-bound loop with an SM limit active is at most 3 %
#                   slower than without the limiter
#   native-*        the driver's own memory limits (r615 and later, no
#                   limiter): nvmlDeviceSetMemoryLimits_v1 sets a soft limit
#                   L/2 and a hard limit L on the checking process's own
#                   cgroup (a fresh leaf under the script's cgroup v2
#                   directory; NATIVE_CGROUP_PARENT overrides where),
#                   nvmlDeviceGetMemoryLimits_v1 reads them back,
#                   cuMemGetInfo reports the hard limit, cuMemAlloc in 64 MiB
#                   steps is refused at it (host nvidia-smi agrees), and once
#                   the limits are cleared L + 256 MiB fits; the soft limit
#                   is zeroed before the cgroup is removed. On an older
#                   driver, a MIG GPU or without a cgroup v2 leaf to use, the
#                   group is NOT RUN
# A check the machine cannot run (one GPU, no NCCL, no kernel compiler) is
# reported NOT RUN, never as a pass. Prints a table; exit status 0: all
# passed; 1: a check failed; 3: none failed but some were not run; 2: cannot
# run at all. ONLY=memory,nccl,gpus,smi,kill,share,launch,native runs some of the
# groups. PY, NVSMI and WORK override the tools and the work directory
# (limiter/test/test_gpu_check.sh runs the script's logic without a GPU
# through them). DIAG (default $WORK/diag; kept when given) receives what
# explains a result: every python check's stdout/stderr, the limiter's
# pacing traces (TESSERA_LIMITER_TRACE) of the share runs, nvidia-smi pmon
# and utilisation samples during them, nvidia-smi's output in the
# container. WORK_N sets the share workload's matrix size (default 8192:
# the GPU stays busy between the loop's synchronisations, so a share of GPU
# time is the same share of solo throughput).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-${PYTHON:-python3}}
NVSMI=${NVSMI:-nvidia-smi}
DURATION=${DURATION:-20}   # seconds per throughput measurement
SHARE=${SHARE:-30}         # SM limit for the share checks
SAMPLE_MS=${SAMPLE_MS:-200}

command -v "$NVSMI" >/dev/null || { echo "gpu-check: $NVSMI not found" >&2; exit 2; }
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    { echo "gpu-check: $PY cannot import torch with CUDA available" >&2; exit 2; }

if [ -z "${LIB:-}" ]; then
    echo "== building the limiter"
    make -C "$HERE" >/dev/null || { echo "gpu-check: build failed" >&2; exit 2; }
    LIB="$HERE/build/libtessera-limiter.so"
fi

WORK=${WORK:-$(mktemp -d /tmp/tessera-gpu-check.XXXXXX)}
mkdir -p "$WORK"
DIAG=${DIAG:-$WORK/diag}
mkdir -p "$DIAG"
# results are printed before a crash at exit can lose them (a pipe is
# block-buffered); faulthandler (common.py) names where a process died
export PYTHONUNBUFFERED=1
BG=""
cleanup() {
    for p in $BG; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

NGPU=$("$NVSMI" --query-gpu=index --format=csv,noheader | wc -l)
PHYS_MIB=$("$NVSMI" --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1 | tr -d ' ')
GPU_NAME=$("$NVSMI" --query-gpu=name --format=csv,noheader -i 0 | head -1)
DRIVER=$("$NVSMI" --query-gpu=driver_version --format=csv,noheader -i 0 | head -1)
# default limit: a quarter of the GPU, at most 4 GiB, so "past the limit" is
# still far below physical memory (a real OOM would prove nothing)
if [ -z "${LIMIT_MIB:-}" ]; then
    LIMIT_MIB=$((PHYS_MIB / 4)); [ "$LIMIT_MIB" -gt 4096 ] && LIMIT_MIB=4096
fi
LIMIT=$((LIMIT_MIB * 1024 * 1024))
echo "== $GPU_NAME, driver $DRIVER, $NGPU GPU(s); GPU 0: ${PHYS_MIB} MiB; limit ${LIMIT_MIB} MiB; $(date -u +%Y-%m-%dT%H:%MZ)"

RESULTS="$WORK/results"
: >"$RESULTS"
record() { # name expected measured status(0 pass, 1 fail, NOTRUN)
    local v=PASS
    case $4 in 0) v=PASS ;; NOTRUN) v="NOT RUN" ;; *) v=FAIL ;; esac
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$v" >>"$RESULTS"
    printf '%-7s %s: expected %s, measured %s\n' "$v" "$1" "$2" "$3"
}
notrun() { record "$1" "$2" "$3" NOTRUN; }
info() { # name measured: a figure that explains others, neither pass nor fail
    printf '%s\t%s\t%s\t%s\n' "$1" "-" "$2" INFO >>"$RESULTS"
    printf '%-7s %s: %s\n' INFO "$1" "$2"
}
errtail() { # the last line of a check's stderr, for a result that is missing
    tail -1 "$DIAG/$1.err" 2>/dev/null | cut -c1-160
}
exitdesc() { # exit status -> "0", or "139 (SIGSEGV)"
    if [ "$1" -gt 128 ] 2>/dev/null; then echo "$1 (SIG$(kill -l $(($1 - 128)) 2>/dev/null))"; else echo "$1"; fi
}
within() { # value lo hi -> exit status
    awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v != "" && v + 0 == v && v >= lo && v <= hi) }'
}
info "driver version (nvidia-smi)" "$DRIVER"

# run python with the limiter preloaded: limited STATE ENV... -- args
limited() {
    local st=$1; shift
    env LD_PRELOAD="$LIB" CUDA_DEVICE_MEMORY_SHARED_CACHE="$st" "$@"
}

# ---- the physical check: host nvidia-smi while a check runs ----
# sample_start NAME; ... sample_stop NAME -> max MiB the pids listed in
# $WORK/NAME.pids (one per line, written by the check's processes) held
# at any sample, summed over them
sample_start() {
    : >"$WORK/$1.pids"
    ( while :; do
          "$NVSMI" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
              sed "s/^/$(date +%s.%N) /"
          sleep "$(awk -v m="$SAMPLE_MS" 'BEGIN { print m / 1000 }')"
      done >"$WORK/$1.samples" ) &
    SAMPLER=$!
    BG="$BG $SAMPLER"
}
sample_stop() {
    kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null
    awk -v pf="$WORK/$1.pids" '
        BEGIN { while ((getline p < pf) > 0) pids[p + 0] = 1 }
        { gsub(/,/, " "); t = $1; pid = $2 + 0; mib = $3 + 0
          if (pid in pids) sum[t] += mib }
        END { m = 0; for (t in sum) if (sum[t] > m) m = sum[t]; print m }' "$WORK/$1.samples"
}
physical() { # name max_mib -> records "<name> physical"
    local max=$2
    [ "$(wc -l <"$WORK/$1.samples")" -gt 0 ] || { record "$1 physical (MiB, host nvidia-smi)" "<= $((LIMIT_MIB * 101 / 100))" "no samples" 1; return; }
    within "$max" 0 "$((LIMIT_MIB * 101 / 100))"
    record "$1 physical (MiB, host nvidia-smi)" "<= $((LIMIT_MIB * 101 / 100))" "$max" $?
}

# ---- the python side ----
cat >"$WORK/common.py" <<'EOF'
import faulthandler, os, sys, time
faulthandler.enable()
def announce(name):
    # the process's pid for the host-side sampler
    with open(os.environ["GPU_CHECK_PIDS"], "a") as f:
        f.write("%d\n" % os.getpid())
EOF

# cuMemGetInfo and NVML's memory info in one process (NVML through ctypes:
# dlopen + dlsym, which the limiter intercepts); CUDA_DEVICE_ORDER=PCI_BUS_ID
# makes CUDA device 0 NVML's index 0
cat >"$WORK/smifree.py" <<'EOF'
import ctypes, torch
x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
h = ctypes.c_void_p(); m = Mem()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
free, total = torch.cuda.mem_get_info(0)
assert nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
print("smifree", free, m.free, total, m.total)
EOF

# the container's process list through NVML's exported entry points (the
# ones the limiter filters); nvidia-smi reads it another way (docs)
cat >"$WORK/smiprocs.py" <<'EOF'
import ctypes, struct
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
for name, stride in (("nvmlDeviceGetComputeRunningProcesses_v2", 24), ("nvmlDeviceGetComputeRunningProcesses_v3", 0)):
    try:
        f = getattr(nv, name)
    except AttributeError:
        continue
    n = ctypes.c_uint(64); buf = ctypes.create_string_buffer(b"\xa5" * (64 * 32), 64 * 32)
    r = f(h, ctypes.byref(n), buf)
    if r != 0:
        print("procs-error", name, r); continue
    if stride == 0:  # 24 or 32 bytes an entry, depending on the driver
        stride = 32 if any(b != 0xa5 for b in buf.raw[n.value * 24:n.value * 32]) else 24
    pids = [struct.unpack_from("<I", buf.raw, i * stride)[0] for i in range(n.value)]
    print("procs", name, " ".join(str(p) for p in sorted(pids)))
    break
EOF

cat >"$WORK/meminfo.py" <<'EOF'
import torch, sys
for d in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(d)
    print(d, free, total)
EOF

# fill to the limit in 64 MiB steps with the allocator PYTORCH_CUDA_ALLOC_CONF picks
cat >"$WORK/fill.py" <<'EOF'
import os, sys, time, torch
sys.path.insert(0, os.path.dirname(__file__)); from common import announce
announce("fill")
step = 64 << 20
held = []
try:
    while True:
        held.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
except torch.cuda.OutOfMemoryError:
    pass
time.sleep(1.0)  # let the sampler see the peak
print("filled", len(held) * 64)
EOF

# the VMM idiom (NCCL, expandable segments): create, reserve, map, release
# at once, until the limit refuses; then unmap all and do it again
cat >"$WORK/vmm.py" <<'EOF'
import ctypes, os, sys, time
sys.path.insert(0, os.path.dirname(__file__)); from common import announce
announce("vmm")
cu = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0: raise SystemExit("%s failed: %d" % (what, r))
ok(cu.cuInit(0), "cuInit")
dev = ctypes.c_int(); ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p(); ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(cu.cuCtxSetCurrent(ctx), "setcurrent")
class Loc(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure): _fields_ = [("c", ctypes.c_ubyte), ("r", ctypes.c_ubyte), ("u", ctypes.c_ushort), ("res", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("hts", ctypes.c_int), ("loc", Loc), ("win32", ctypes.c_void_p), ("flags", Flags)]
class Access(ctypes.Structure): _fields_ = [("loc", Loc), ("flags", ctypes.c_int)]
prop = Prop(); prop.type = 1; prop.loc.type = 1; prop.loc.id = 0
gran = ctypes.c_size_t(); ok(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
size = max(gran.value, 64 << 20) // gran.value * gran.value
cu.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t, ctypes.POINTER(Prop), ctypes.c_ulonglong]
cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t, ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_ulonglong]
cu.cuMemMap.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_ulonglong]
cu.cuMemRelease.argtypes = [ctypes.c_ulonglong]
cu.cuMemUnmap.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t]
cu.cuMemSetAccess.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t, ctypes.POINTER(Access), ctypes.c_size_t]
acc = Access(); acc.loc.type = 1; acc.loc.id = 0; acc.flags = 3
def fill():
    mapped = []
    while True:
        h = ctypes.c_ulonglong(); va = ctypes.c_ulonglong()
        r = cu.cuMemCreate(ctypes.byref(h), size, ctypes.byref(prop), 0)
        if r != 0: return mapped, r
        ok(cu.cuMemAddressReserve(ctypes.byref(va), size, 0, 0, 0), "reserve")
        ok(cu.cuMemMap(va.value, size, 0, h.value, 0), "map")
        ok(cu.cuMemSetAccess(va.value, size, ctypes.byref(acc), 1), "access")
        ok(cu.cuMemRelease(h.value), "release")  # still mapped: still held
        mapped.append(va.value)
first, r1 = fill()
time.sleep(1.0)
for va in first: ok(cu.cuMemUnmap(va, size), "unmap")
second, r2 = fill()
time.sleep(1.0)
print("vmm", len(first) * size >> 20, len(second) * size >> 20, r1, r2)
EOF

# the malloc heap: charged when set; backed by an in-kernel malloc (cupy/numba)
cat >"$WORK/heap.py" <<'EOF'
import ctypes, os, sys, time, torch
sys.path.insert(0, os.path.dirname(__file__)); from common import announce
announce("heap")
L = int(os.environ["EXPECT_LIMIT"])
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
cu = ctypes.CDLL("libcuda.so.1")
cu.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
r = cu.cuCtxSetLimit(2, L // 2)  # CU_LIMIT_MALLOC_HEAP_SIZE
refused = 0
try:
    x = torch.empty(L // 2 + (256 << 20), dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
except torch.cuda.OutOfMemoryError:
    refused = 1
kernel = "none"
try:
    import cupy
    k = cupy.RawKernel(r'''extern "C" __global__ void grab(char **out, size_t n) {
        char *p = (char *)malloc(n); if (p) for (size_t i = 0; i < n; i += 4096) p[i] = 1; out[threadIdx.x] = p; }''', "grab")
    out = cupy.zeros(64, dtype=cupy.uint64)
    k((1,), (64,), (out, cupy.uint64((L // 2) // 128)))
    cupy.cuda.runtime.deviceSynchronize()
    kernel = "ran"
except ImportError:
    pass
time.sleep(1.0)
print("heap", r, refused, kernel)
EOF

# graphs: torch.cuda.graph (the caching allocator's graph pool), and
# captured cudaMallocAsync (graph memory nodes) with that backend
cat >"$WORK/graph.py" <<'EOF'
import os, sys, time, torch
sys.path.insert(0, os.path.dirname(__file__)); from common import announce
announce("graph")
L = int(os.environ["EXPECT_LIMIT"])
def capture(nbytes):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            x.fill_(1)
    g.replay(); torch.cuda.synchronize()
    return g, x
ok_small = over_refused = 0
try:
    g, x = capture(L // 2); ok_small = 1
    print("phase small: captured and replayed", flush=True)
except Exception as e:
    print("phase small: failed: %r" % (e,), flush=True)
try:
    g2, x2 = capture(L); torch.cuda.synchronize()
    print("phase over: captured and replayed (not refused)", flush=True)
except Exception as e:
    over_refused = 1
    print("phase over: refused: %r" % (str(e)[:300],), flush=True)
time.sleep(1.0)
print("graph", ok_small, over_refused, flush=True)
# teardown (the graphs, the pools, the allocator) follows: a crash there
# shows in the exit status, which the check reports apart
EOF

# NCCL all-reduce, two processes (one GPU each), the container's one limit each
cat >"$WORK/nccl.py" <<'EOF'
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__)); from common import announce
def run(rank):
    announce("nccl")
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = "29533"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    t = torch.ones(int(os.environ["EXPECT_LIMIT"]) // 16, device="cuda")
    for _ in range(20): dist.all_reduce(t)
    torch.cuda.synchronize(); time.sleep(1.0)
    if rank == 0: print("nccl", float(t[0].item()))
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
EOF

cat >"$WORK/hold.py" <<'EOF'
import os, sys, time, torch
sys.path.insert(0, os.path.dirname(__file__)); from common import announce
announce("hold")
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open(sys.argv[2], "w").write("%d\n" % os.getpid())
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

# saturating matmuls; a completion time every 4 (synchronised) iterations;
# with "graph", the 4 matmuls are one CUDA graph. WORK_N x WORK_N (8192: a
# few ms of GPU work per synchronisation, so the GPU is busy nearly all the
# time when alone; run 1's 4096 left it idle ~20 % of the time between
# synchronisations, and a share of GPU time then is more of solo throughput)
cat >"$WORK/work.py" <<'EOF'
import os, sys, time, torch
dur, mode, out = float(sys.argv[1]), sys.argv[2], sys.argv[3]
n = int(os.environ.get("WORK_N", "8192"))
a = torch.randn(n, n, device="cuda", dtype=torch.float16)
b = torch.randn(n, n, device="cuda", dtype=torch.float16)
c = torch.empty(n, n, device="cuda", dtype=torch.float16)
step = lambda: [torch.matmul(a, b, out=c) for _ in range(4)]
if mode == "graph":
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): step()
    step = g.replay
for _ in range(3): step()
torch.cuda.synchronize()
# WORK_DEPTH steps stay queued: the GPU never waits for Python (run 2: one
# synchronisation per step kept it ~84 % busy solo, so 30 % of GPU time was
# 37 % of that solo's throughput). Each step's completion time is when the
# loop sees its event done (at most a step late).
depth = max(1, int(os.environ.get("WORK_DEPTH", "3")))
q = []
t0 = time.time()
with open(out, "w") as f:
    while True:
        step(); e = torch.cuda.Event(); e.record(); q.append(e)
        if len(q) < depth: continue
        q.pop(0).synchronize()
        now = time.time()
        f.write("%.4f\n" % (now - t0))
        if now - t0 >= dur: break
torch.cuda.synchronize()
EOF

# the driver's own memory limits, set on this process's own cgroup (the
# leaf the script moved it into): "native.py check SOFT HARD" prints one
# line per step; "native.py clear DIR" zeroes DIR's limits from outside
cat >"$WORK/native.py" <<'EOF'
import ctypes, os, sys, time
sys.path.insert(0, os.path.dirname(__file__)); from common import announce
MAX = 0xFFFFFFFFFFFFFFFF
class SetL(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong)]
class GetL(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong),
                ("currentUsed", ctypes.c_ulonglong)]
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
try:
    set_limits, get_limits = nv.nvmlDeviceSetMemoryLimits_v1, nv.nvmlDeviceGetMemoryLimits_v1
except AttributeError:
    print("native-missing"); sys.exit(0)
def get(path):
    g = GetL(path.encode(), 0, 0, 0)
    r = get_limits(h, ctypes.byref(g))
    return r, g.softLimit, g.hardLimit, g.currentUsed
if sys.argv[1] == "clear":
    print("native clear", set_limits(h, ctypes.byref(SetL(sys.argv[2].encode(), 0, MAX)))); sys.exit(0)
announce("native")
soft, hard = int(sys.argv[2]), int(sys.argv[3])
# this process's cgroup directory: its /proc/self/cgroup path under the cgroup2 mount
cg = [l.split("::", 1)[1].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
path = None
for l in open("/proc/self/mountinfo"):
    f = l.split()
    if " - cgroup2 " in l and (cg + "/").startswith(f[3].rstrip("/") + "/"):
        path = f[4] + cg[len(f[3].rstrip("/")):]
if path is None:
    print("native-nocgroup", cg); sys.exit(0)
print("native cgroup", path)
cur, pend = ctypes.c_uint(0), ctypes.c_uint(0)
mig_mode = getattr(nv, "nvmlDeviceGetMigMode", None)  # absent: not a MIG-capable driver
if mig_mode and mig_mode(h, ctypes.byref(cur), ctypes.byref(pend)) == 0 and cur.value == 1:
    print("native-mig"); sys.exit(0)
print("native set", set_limits(h, ctypes.byref(SetL(path.encode(), soft, hard))))
print("native get %d %d %d %d" % get(path))
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
m = Mem(); nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
print("native meminfo", free.value, total.value, m.free, m.total)
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
cu.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
step, held, r = 64 << 20, [], 0
while len(held) * step <= hard + step:  # bounded: a driver that does not refuse stops one step past the limit
    p = ctypes.c_ulonglong()
    r = cu.cuMemAlloc_v2(ctypes.byref(p), step)
    if r != 0: break
    held.append(p.value)
time.sleep(1.0)  # let the sampler see the peak
print("native alloc", len(held) * step, r)
print("native filled %d %d %d %d" % get(path))
for p in held: cu.cuMemFree_v2(p)
print("native cleared", set_limits(h, ctypes.byref(SetL(path.encode(), 0, MAX))))
print("native after %d %d %d %d" % get(path))
p = ctypes.c_ulonglong()
r = cu.cuMemAlloc_v2(ctypes.byref(p), hard + (256 << 20))
print("native past", r)
EOF

# launch-bound: many tiny kernels
cat >"$WORK/launch.py" <<'EOF'
import time, torch
x = torch.zeros(1, device="cuda")
for _ in range(2000): x.add_(1)
torch.cuda.synchronize()
n = 200000
t0 = time.perf_counter()
for _ in range(n): x.add_(1)
torch.cuda.synchronize()
print(n / (time.perf_counter() - t0))
EOF

# series FILE SOLO_RATE DUR -> "mean_pct min_pct longest_stall_s" over the
# second half of the run: per 1 s window, the share of solo throughput
series() {
    awk -v solo="$2" -v dur="$3" '
        { t[NR] = $1 }
        END { start = dur / 2; gap = 0; prev = start; n = 0; mn = 1e9; tot = 0
              for (i = 1; i <= NR; i++) if (t[i] >= start) {
                  if (t[i] - prev > gap) gap = t[i] - prev; prev = t[i]; w = int(t[i] - start); cnt[w]++ }
              if (dur - prev > gap) gap = dur - prev
              for (w = 0; w < int(dur - start); w++) { p = 100 * 4 * cnt[w] / solo; tot += p; n++; if (p < mn) mn = p }
              if (n == 0) { print "error error error"; exit }
              printf "%.1f %.1f %.2f\n", tot / n, mn, gap }' "$1"
}
rate() { # FILE DUR -> iterations/s over the second half
    awk -v dur="$2" '$1 >= dur / 2 { n++ } END { printf "%.2f\n", 4 * n / (dur / 2) }' "$1"
}

export GPU_CHECK_PIDS
want() { [ -z "${ONLY:-}" ] && return 0; case ",$ONLY," in *",$1,"*) return 0 ;; esac; return 1; }

if want memory; then
echo "== memory: what the container is told"
out=$(limited "$WORK/s1" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/meminfo.py" 2>&1 | head -1)
total=$(echo "$out" | awk '{print $3}')
[ "$total" = "$LIMIT" ]; record "mem-info total" "$LIMIT" "${total:-error: $out}" $?

echo "== memory: PyTorch fills to the limit, 64 MiB at a time"
for conf in default expandable_segments:True backend:cudaMallocAsync; do
    GPU_CHECK_PIDS="$WORK/fill-$conf.pids"; sample_start "fill-$conf"
    if [ "$conf" = default ]; then ac=""; else ac="$conf"; fi
    out=$(limited "$WORK/s-$conf" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m PYTORCH_CUDA_ALLOC_CONF="$ac" \
          "$PY" "$WORK/fill.py" 2>"$DIAG/fill-$conf.err" | tail -1)
    max=$(sample_stop "fill-$conf")
    got=$(echo "$out" | awk '$1 == "filled" {print $2}')
    # the context and the allocator's rounding take a few hundred MiB
    within "${got:-x}" $((LIMIT_MIB - 1024)) "$LIMIT_MIB"; ok=$?
    record "fill-$conf allocated (MiB)" "$((LIMIT_MIB - 1024))..$LIMIT_MIB" "${got:-error: $out $(errtail "fill-$conf")}" $ok
    physical "fill-$conf" "$max"
done

echo "== memory: VMM create/map/release"
GPU_CHECK_PIDS="$WORK/vmm.pids"; sample_start vmm
out=$(limited "$WORK/s-vmm" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/vmm.py" 2>"$DIAG/vmm.err" | tail -1)
max=$(sample_stop vmm)
a=$(echo "$out" | awk '$1 == "vmm" {print $2}'); b=$(echo "$out" | awk '$1 == "vmm" {print $3}')
within "${a:-x}" $((LIMIT_MIB - 1024)) "$LIMIT_MIB"; ok=$?
record "vmm mapped until refused (MiB)" "$((LIMIT_MIB - 1024))..$LIMIT_MIB" "${a:-error: $out $(errtail vmm)}" $ok
[ -n "$a" ] && [ "$a" = "$b" ]; record "vmm same again after unmapping" "${a:-?}" "${b:-error}" $?
physical vmm "$max"

echo "== memory: the in-kernel malloc heap"
GPU_CHECK_PIDS="$WORK/heap.pids"; sample_start heap
out=$(limited "$WORK/s-heap" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m EXPECT_LIMIT=$LIMIT "$PY" "$WORK/heap.py" 2>"$DIAG/heap.err" | tail -1)
max=$(sample_stop heap)
set -- $out
[ "${1:-}" = heap ] && [ "${2:-}" = 0 ] && [ "${3:-}" = 1 ]
record "heap limit L/2 charged: L/2 + 256 MiB more refused" "set 0, refused 1" "${2:-?} ${3:-?} ($out)" $?
if [ "${4:-none}" = ran ]; then physical heap "$max"
else notrun "heap backed by an in-kernel malloc" "physical <= limit" "no cupy to build the kernel"; fi

echo "== memory: graphs"
for backend in default backend:cudaMallocAsync; do
    GPU_CHECK_PIDS="$WORK/graph-$backend.pids"; sample_start "graph-$backend"
    if [ "$backend" = default ]; then ac=""; else ac="$backend"; fi
    gn="graph-${backend#backend:}"
    limited "$WORK/s-g-$backend" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m EXPECT_LIMIT=$LIMIT \
        TESSERA_LIMITER_TRACE="$DIAG/trace-$gn" PYTORCH_CUDA_ALLOC_CONF="$ac" "$PY" "$WORK/graph.py" \
        >"$DIAG/$gn.out" 2>"$DIAG/$gn.err"
    rc=$?
    max=$(sample_stop "graph-$backend")
    out=$(grep '^graph ' "$DIAG/$gn.out" | tail -1)
    set -- $out
    [ "${1:-}" = graph ] && [ "${2:-}" = 1 ] && [ "${3:-}" = 1 ]; ok=$?
    if [ -n "$out" ]; then m="${2:-?} ${3:-?}"
    else m="no result line: $(grep '^phase' "$DIAG/$gn.out" | tail -1) $(errtail "$gn")"; fi
    record "graph-$backend: L/2 captured and replayed, L refused" "1 1" "$m" $ok
    if [ "$rc" = 0 ]; then record "graph-$backend: the process exits cleanly" "0" 0 0
    else record "graph-$backend: the process exits cleanly" "0" "$(exitdesc "$rc"): $(errtail "$gn")" 1; fi
    physical "graph-$backend" "$max"
done

fi

if want nccl; then
echo "== memory: NCCL"
if [ "$NGPU" -lt 2 ]; then
    notrun "nccl two-process all-reduce" "physical <= limit per process" "one GPU"
elif ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.distributed.is_nccl_available() else 1)' 2>/dev/null; then
    notrun "nccl two-process all-reduce" "physical <= limit per process" "no NCCL"
else
    GPU_CHECK_PIDS="$WORK/nccl.pids"; sample_start nccl
    out=$(limited "$WORK/s-nccl" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m EXPECT_LIMIT=$LIMIT "$PY" "$WORK/nccl.py" 2>"$DIAG/nccl.err" | tail -1)
    max=$(sample_stop nccl)
    [ "$out" = "nccl 1048576.0" ]; record "nccl all-reduce result" "nccl 1048576.0" "$out" $?
    # two processes on two GPUs: each GPU's limit; the sum is checked against both
    within "$max" 0 $((2 * LIMIT_MIB * 101 / 100)); record "nccl physical, both GPUs (MiB)" "<= $((2 * LIMIT_MIB * 101 / 100))" "$max" $?
fi

fi

if want gpus; then
echo "== memory: two GPUs, two limits"
if [ "$NGPU" -lt 2 ]; then
    notrun "two-gpus different limits" "$LIMIT_MIB and $((LIMIT_MIB / 2)) MiB" "one GPU"
else
    out=$(limited "$WORK/s-2g" CUDA_DEVICE_MEMORY_LIMIT_0=${LIMIT_MIB}m CUDA_DEVICE_MEMORY_LIMIT_1=$((LIMIT_MIB / 2))m \
          "$PY" "$WORK/meminfo.py" 2>&1)
    t0=$(echo "$out" | awk '$1 == 0 {print $3}'); t1=$(echo "$out" | awk '$1 == 1 {print $3}')
    [ "$t0" = "$LIMIT" ] && [ "$t1" = $((LIMIT / 2)) ]
    record "two-gpus different limits (bytes)" "$LIMIT $((LIMIT / 2))" "${t0:-?} ${t1:-?}" $?
fi

fi

if want smi; then
echo "== nvidia-smi with the limiter"
smi=$(limited "$WORK/s3" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m \
      "$NVSMI" --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>&1 | head -1 | tr -d ' ')
[ "$smi" = "$LIMIT_MIB" ]; record "nvidia-smi memory.total (MiB)" "$LIMIT_MIB" "$smi" $?
# a neighbour outside the container (no limiter, its own state) and a
# process of the container hold memory; nvidia-smi run in the container
# lists only the container's process, and NVML's free memory is
# cuMemGetInfo's (asked in one process) and never above the real free
S5="$WORK/s5"; rm -f "$WORK/ready-nb" "$WORK/ready-me"
GPU_CHECK_PIDS="$WORK/smi.pids"
"$PY" "$WORK/hold.py" $((256 << 20)) "$WORK/ready-nb" 600 >/dev/null 2>&1 &
BG="$BG $!"
# the holder traced: how (and whether) it resolved its host pid, which the
# exported process list filters by
limited "$S5" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m TESSERA_LIMITER_TRACE="$DIAG/trace-smi-holder" "$PY" "$WORK/hold.py" \
    $((LIMIT / 4)) "$WORK/ready-me" 600 >/dev/null 2>"$DIAG/smi-holder.err" &
BG="$BG $!"
for _ in $(seq 1 600); do [ -s "$WORK/ready-nb" ] && [ -s "$WORK/ready-me" ] && break; sleep 0.1; done
NB=$(cat "$WORK/ready-nb" 2>/dev/null); ME=$(cat "$WORK/ready-me" 2>/dev/null)
apps=$(limited "$S5" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m TESSERA_LIMITER_TRACE="$DIAG/trace-smi-apps" \
       "$NVSMI" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>"$DIAG/smi-apps.err" |
       tee "$DIAG/smi-apps.out" | awk -F, '{print $1 + 0}' | sort -n | paste -sd' ' -)
# for the record: nvidia-smi's table in the container (traced: which NVML
# entry points and private tables it used), and the host's
limited "$S5" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m TESSERA_LIMITER_TRACE="$DIAG/trace-smi-table" \
    TESSERA_LIMITER_DEBUG=1 "$NVSMI" >"$DIAG/smi-table-container.txt" 2>&1
"$NVSMI" >"$DIAG/smi-table-host.txt" 2>&1
pub=$(limited "$S5" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m TESSERA_LIMITER_TRACE="$DIAG/trace-smi-procs" \
      "$PY" "$WORK/smiprocs.py" 2>"$DIAG/smiprocs.err" | tee "$DIAG/smiprocs.out" | grep '^procs' | tail -1)
host=$("$NVSMI" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>&1 | awk -F, '{print $1 + 0}' |
       sort -n | paste -sd' ' -)
if [ -z "$NB" ] || [ -z "$ME" ] || ! echo " $host " | grep -q " $NB "; then
    record "nvidia-smi in the container lists only its processes" "$ME, not $NB" \
        "holders did not start or the host does not list them (host: $host)" 1
else
    echo " $apps " | grep -q " $ME " && ! echo " $apps " | grep -q " $NB "
    record "nvidia-smi in the container lists only its processes" "$ME, not $NB" "${apps:-none}" $?
    set -- $pub
    pl=" ${pub#procs * } "
    [ "${1:-}" = procs ] && echo "$pl" | grep -q " $ME " && ! echo "$pl" | grep -q " $NB "; ok=$?
    if [ -n "$pub" ]; then m=$(echo $pl); else m="error: $(errtail smiprocs)"; fi
    record "NVML process list (exported ${2:-?}) in the container: only its processes" "$ME, not $NB" "${m:-none}" $ok
fi
out=$(limited "$S5" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m CUDA_DEVICE_ORDER=PCI_BUS_ID "$PY" "$WORK/smifree.py" 2>&1 |
      tail -1)
realfree=$("$NVSMI" --query-gpu=memory.free --format=csv,noheader,nounits -i 0 | head -1 | tr -d ' ')
set -- $out
if [ "${1:-}" = smifree ]; then
    d=$(( ($2 - $3) / 1048576 )); d=${d#-}
    [ "$d" -le 2 ]; record "NVML free = cuMemGetInfo free, one process (MiB apart)" "<= 2" "$d ($2 vs $3)" $?
    within "$(( $3 / 1048576 ))" 0 "$(( realfree + 2 ))"
    record "NVML free in the container <= real free (MiB)" "<= $realfree + 2" "$(( $3 / 1048576 ))" $?
else
    record "NVML free = cuMemGetInfo free, one process (MiB apart)" "<= 2" "error: $out" 1
fi
for p in $NB $ME; do kill -9 "$p" 2>/dev/null; done

fi

if want kill; then
echo "== two processes share one limit; kill -9 of the holder gives it back"
# each process's context is charged too (about 576 MiB with PyTorch on an
# H200): measured here, so the sizes hold on any GPU. The holder takes
# 0.4 L; a 2nd process asking 0.6 L must be refused (0.4 L + 0.6 L + two
# contexts > L); one asking what is left after both contexts, less 256 MiB
# for the allocator's rounding, must get it.
CTX_MIB=$(limited "$WORK/s-ctx" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/meminfo.py" 2>"$DIAG/ctx.err" |
          awk '$1 == 0 { printf "%d", ($3 - $2) / 1048576 }')
info "context charge per process (MiB, limit - cuMemGetInfo free in a fresh process)" "${CTX_MIB:-unknown}"
CTX=$(( ${CTX_MIB:-576} * 1048576 ))
HOLD=$((LIMIT * 4 / 10)); OVER=$((LIMIT * 6 / 10)); FIT=$((LIMIT - HOLD - 2 * CTX - (256 << 20)))
AFTER=$((LIMIT * 8 / 10)); [ $((LIMIT - CTX - (256 << 20))) -lt "$AFTER" ] && AFTER=$((LIMIT - CTX - (256 << 20)))
S4="$WORK/s4"; rm -f "$WORK/ready4"
GPU_CHECK_PIDS="$WORK/kill.pids"; sample_start kill
limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/hold.py" "$HOLD" "$WORK/ready4" 600 \
    >/dev/null 2>"$DIAG/kill-holder.err" &
BG="$BG $!"
for _ in $(seq 1 600); do [ -s "$WORK/ready4" ] && break; sleep 0.1; done
HOLDER=$(cat "$WORK/ready4" 2>/dev/null) # the python process itself, not a shell around it
# the host's sampler must have seen the holder's memory before it is killed
for _ in $(seq 1 100); do grep -q " ${HOLDER:-x}," "$WORK/kill.samples" 2>/dev/null && break; sleep 0.1; done
a=$(limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/try.py" "$OVER" 2>"$DIAG/kill-over.err" | tail -1)
[ "$a" = oom ]; ok=$?; record "2nd process 0.6 L while the 1st holds 0.4 L" "oom" "${a:-error: $(errtail kill-over)}" $ok
if [ "$FIT" -lt $((64 << 20)) ]; then
    notrun "2nd process L - 0.4 L - 2 contexts - 256 MiB while the 1st holds 0.4 L" "ok" \
        "contexts of ${CTX_MIB:-?} MiB leave no room under a ${LIMIT_MIB} MiB limit"
else
    b=$(limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/try.py" "$FIT" 2>"$DIAG/kill-fit.err" | tail -1)
    [ "$b" = ok ]; ok=$?
    record "2nd process $((FIT >> 20)) MiB (L - 0.4 L - 2 contexts - 256 MiB) while the 1st holds 0.4 L" "ok" \
        "${b:-error: $(errtail kill-fit)}" $ok
fi
if [ -n "$HOLDER" ] && kill -9 "$HOLDER" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$HOLDER" 2>/dev/null || break; sleep 0.1; done
    c=$(limited "$S4" CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m "$PY" "$WORK/try.py" "$AFTER" 2>"$DIAG/kill-after.err" |
        tail -1)
    [ "$c" = ok ]; ok=$?
    record "kill-9 of the holder, then $((AFTER >> 20)) MiB (<= 0.8 L)" "ok" "${c:-error: $(errtail kill-after)}" $ok
else
    record "kill-9 of the holder, then $((AFTER >> 20)) MiB (<= 0.8 L)" "ok" "holder pid unknown ($HOLDER)" 1
fi
max=$(sample_stop kill)
physical kill "$max"

fi

if want share; then
echo "== compute share (${SHARE}%), ${DURATION}s per run, ${WORK_N:-8192}^2 fp16 products"
# While each run goes: the host's nvidia-smi pmon (per-process SM %, the
# figure the pacer steers by) and the GPU's utilisation and SM clock; the
# limited runs write the pacer's trace (one line per 100 ms control step and
# one per measured launch) to $DIAG/trace-share-NAME.<pid>.
mon_start() {
    ( exec "$NVSMI" pmon -s u -d 1 >"$DIAG/share-$1.pmon" 2>&1 ) &
    MON1=$!
    ( exec "$NVSMI" --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw --format=csv,noheader -lms 500 \
          >"$DIAG/share-$1.gpu" 2>&1 ) &
    MON2=$!
    BG="$BG $MON1 $MON2"
}
mon_stop() { kill "$MON1" "$MON2" 2>/dev/null; wait "$MON1" "$MON2" 2>/dev/null; }
gpu_util() { # mean utilization.gpu over a run's samples from its first busy one to its last: the idle
    # start-up and teardown (0 %) left out, never an idle sample in between (a limiter alternating
    # 30 % and 0 % gives 15 %, not 30)
    awk -F, '$2 ~ /[0-9]/ { v[n++] = $2 + 0 }
        END { a = 0; while (a < n && v[a] == 0) a++; b = n - 1; while (b >= a && v[b] == 0) b--
              if (b < a) { print "?"; exit } for (i = a; i <= b; i++) s += v[i]; printf "%.0f", s / (b - a + 1) }' \
        "$DIAG/share-$1.gpu" 2>/dev/null
}
work() { # NAME DURATION MODE [limited SM%]: one run of work.py, monitored
    local name=$1 dur=$2 mode=$3 sm=${4:-}
    mon_start "$name"
    if [ -n "$sm" ]; then
        # env execs python: $! is the pid pmon reports (no pid namespace between)
        env LD_PRELOAD="$LIB" CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/s-share-$name" CUDA_DEVICE_SM_LIMIT="$sm" \
            TESSERA_LIMITER_TRACE="$DIAG/trace-share-$name" \
            "$PY" "$WORK/work.py" "$dur" "$mode" "$WORK/$name.t" >"$DIAG/share-$name.out" 2>"$DIAG/share-$name.err" &
        WORKPID=$!
        wait "$WORKPID"
    else
        "$PY" "$WORK/work.py" "$dur" "$mode" "$WORK/$name.t" >"$DIAG/share-$name.out" 2>"$DIAG/share-$name.err"
    fi
    mon_stop
    cp "$WORK/$name.t" "$DIAG/share-$name.t" 2>/dev/null
}
work solo "$DURATION" plain
solo=$(rate "$WORK/solo.t" "$DURATION")
info "solo: iterations/s; GPU utilisation % (nvidia-smi)" "$solo; $(gpu_util solo)"
work solog "$DURATION" graph
solog=$(rate "$WORK/solog.t" "$DURATION")
info "solo, CUDA graphs: iterations/s; GPU utilisation %" "$solog; $(gpu_util solog)"
pmon_sm() { # RUN PID -> mean pmon SM % of PID over the run's samples after the first numeric one
    awk -v pid="$2" '$2 == pid && $4 ~ /^[0-9]+$/ { if (seen++) { s += $4; n++ } }
        END { if (n) printf "%.1f (%d samples)", s / n, n; else print "no samples" }' "$DIAG/share-$1.pmon" 2>/dev/null
}
gpu_clock() { # mean clocks.sm (MHz) over a run's busy samples
    awk -F, '$2 ~ /[0-9]/ && $2 + 0 > 0 { s += $3; n++ } END { if (n) printf "%.0f", s / n; else print "?" }' \
        "$DIAG/share-$1.gpu" 2>/dev/null
}
# share_check NAME FILE SOLO RUN CRITERION: CRITERION "time" judges the
# share by the GPU's own utilisation (host nvidia-smi, from the first busy
# sample to the last: idle start-up and teardown left out) and
# reports throughput as INFO: alone on the GPU, a 30 % duty cycle leaves
# the GPU below its power limit, so its clocks boost above the solo run's
# (run 3 on an H200: 1,980 against 1,432 MHz) and each kernel runs faster;
# 30 % of GPU time is then more than 30 % of the solo throughput.
# "throughput" judges by % of solo throughput (next to a saturating
# neighbour the GPU is at its power limit in both runs).
share_check() {
    info "$1: limited process's mean SM % (host nvidia-smi pmon)" "$(pmon_sm "$4" "$WORKPID")"
    local name=$1 run=$4 crit=$5
    set -- "$1" "$2" "$3" $(series "$2" "$3" "$DURATION")
    if [ "$crit" = time ]; then
        u=$(gpu_util "$run")
        within "${u:-x}" $((SHARE - 5)) $((SHARE + 5))
        record "$name: GPU utilisation % (host nvidia-smi, first to last busy sample)" "$SHARE+-5" "$u" $?
        info "$name: mean % of solo throughput, 1 s windows (min $5); SM clock MHz, limited vs solo" \
            "$4; $(gpu_clock "$run") vs $(gpu_clock solo)"
    else
        within "$4" $((SHARE - 5)) $((SHARE + 5))
        record "$name: mean % of solo, 1 s windows (min $5)" "$SHARE+-5" "$4" $?
    fi
    within "$6" 0 0.999
    record "$name: longest stall (s)" "< 1" "$6" $?
}
work alone "$DURATION" plain "$SHARE"
share_check "share-alone" "$WORK/alone.t" "$solo" alone time
work graph "$DURATION" graph "$SHARE"
share_check "share-cuda-graphs" "$WORK/graph.t" "$solog" graph time
# one neighbour (no limiter) for two runs: the pair without a limiter (what
# time-slicing alone gives), then the limited process
"$PY" "$WORK/work.py" $((2 * DURATION + 40)) plain "$WORK/neigh.t" >"$DIAG/share-neighbour.out" 2>&1 &
NEIGH=$!; BG="$BG $NEIGH"
echo "$NEIGH" >"$DIAG/share-neighbour.pid"
sleep "${NEIGHBOUR_WARMUP:-5}"
work pair "$DURATION" plain
info "no limiter next to the neighbour: % of solo (time-slicing alone)" "$(series "$WORK/pair.t" "$solo" "$DURATION" | awk '{print $1}') % of solo"
work shared "$DURATION" plain "$SHARE"
kill -9 "$NEIGH" 2>/dev/null; wait "$NEIGH" 2>/dev/null
share_check "share-vs-saturating-neighbour" "$WORK/shared.t" "$solo" shared throughput
# run 1's workload (4096^2: the GPU idles between the loop's synchronisations)
if [ "${WORK_N:-8192}" != 4096 ] && [ -z "${NO_SHARE_4096:-}" ]; then
    d4=$(( (DURATION + 1) / 2 ))
    WORK_N=4096 WORK_DEPTH=1 work solo4096 "$d4" plain
    WORK_N=4096 WORK_DEPTH=1 work alone4096 "$d4" plain "$SHARE"
    info "4096^2 (run 1's workload), ${SHARE}% alone: % of solo; solo GPU utilisation %" \
        "$(series "$WORK/alone4096.t" "$(rate "$WORK/solo4096.t" "$d4")" "$d4" | awk '{print $1}'); $(gpu_util solo4096)"
fi

fi

if want launch; then
echo "== launch overhead with an SM limit active (tiny kernels, median of 3)"
base=(); with=()
for i in 1 2 3; do
    base+=("$("$PY" "$WORK/launch.py" 2>/dev/null | tail -1)")
    # 99 %: the gate is in the path but a launch-bound loop never waits on it
    with+=("$(limited "$WORK/s6" CUDA_DEVICE_SM_LIMIT=99 CUDA_DEVICE_MEMORY_LIMIT=${LIMIT_MIB}m \
              "$PY" "$WORK/launch.py" 2>/dev/null | tail -1)")
done
slow=$("$PY" - "${base[@]}" "${with[@]}" <<'EOF'
import statistics, sys
v = [float(x) for x in sys.argv[1:]]
b, w = statistics.median(v[:3]), statistics.median(v[3:])
print(round(100.0 * (b / w - 1.0), 2))
EOF
)
within "${slow:-error}" -100 3
record "launch-bound slowdown % (${base[*]} vs ${with[*]} launches/s)" "<= 3" "${slow:-error}" $?
fi

if want native; then
echo "== native: the driver's own memory limits (nvmlDeviceSetMemoryLimits_v1, driver r615 and later)"
major=${DRIVER%%.*}
# the script's cgroup v2 directory: a leaf of its own is made under it
cgdir() {
    local cg
    cg=$(awk -F: '$1 == "0" && $2 == "" { print $3 }' /proc/self/cgroup)
    cg=${cg%/}
    [ -n "$cg" ] || return 1
    awk -v cg="$cg" '
        { for (i = 7; i <= NF; i++) if ($i == "-") break }
        $(i + 1) == "cgroup2" { root = $4; sub(/\/$/, "", root)
            if (index(cg "/", root "/") == 1) { print $5 substr(cg, length(root) + 1); exit } }' /proc/self/mountinfo
}
NPARENT=${NATIVE_CGROUP_PARENT:-$(cgdir)}
LEAF=""
if ! [ "$major" -ge 615 ] 2>/dev/null; then
    notrun "native memory limits" "driver >= 615" "driver $DRIVER has no nvmlDeviceSetMemoryLimits_v1"
elif [ -z "$NPARENT" ]; then
    notrun "native memory limits" "a cgroup v2 directory" "this process is in no cgroup v2 hierarchy (cgroup v2 is required)"
elif LEAF="$NPARENT/tessera-gpu-check-$$"; ! mkdir "$LEAF" 2>"$DIAG/native-mkdir.err"; then
    notrun "native memory limits" "a leaf cgroup" "cannot make $LEAF: $(head -1 "$DIAG/native-mkdir.err")"
    LEAF=""
else
    S=$((LIMIT / 2))
    GPU_CHECK_PIDS="$WORK/native.pids"; sample_start native
    # the check process itself goes into the leaf before it starts
    ( echo "$BASHPID" >"$LEAF/cgroup.procs" && exec "$PY" "$WORK/native.py" check "$S" "$LIMIT" ) \
        >"$DIAG/native.out" 2>"$DIAG/native.err"
    rc=$?
    max=$(sample_stop native)
    # the soft limit is zeroed before the cgroup goes away (the driver keeps
    # an ancestor's reservation of a leaf removed with its soft limit set)
    clr=$("$PY" "$WORK/native.py" clear "$LEAF" 2>>"$DIAG/native.err" | awk '$1 == "native" && $2 == "clear" {print $3}')
    rmdir "$LEAF" 2>>"$DIAG/native.err"; gone=$?
    o() { awk -v k="$1" '$1 == "native" && $2 == k { $1 = $2 = ""; sub(/^ +/, ""); print; exit }' "$DIAG/native.out"; }
    if grep -q '^native-missing' "$DIAG/native.out"; then
        notrun "native memory limits" "nvmlDeviceSetMemoryLimits_v1" "driver $DRIVER's NVML does not export it"
    elif grep -q '^native-mig' "$DIAG/native.out"; then
        notrun "native memory limits" "a non-MIG GPU" "GPU 0 is in MIG mode (MIG handles take no memory limits)"
    elif grep -q '^native-nocgroup' "$DIAG/native.out"; then
        notrun "native memory limits" "a cgroup v2 directory" "the leaf is under no cgroup2 mount: $(grep '^native-nocgroup' "$DIAG/native.out")"
    elif [ -z "$(o set)" ]; then
        record "native: nvmlDeviceSetMemoryLimits_v1 on the process's own cgroup" "0" "no result: exit $(exitdesc "$rc"): $(errtail native)" 1
    else
        [ -n "$(o cgroup)" ] && [ "$(o cgroup)" -ef "$LEAF" ]
        record "native: the check process's own cgroup (/proc/self/cgroup) is the leaf" "$LEAF" "$(o cgroup)" $?
        set -- $(o set); [ "${1:-}" = 0 ]
        record "native: nvmlDeviceSetMemoryLimits_v1 soft L/2, hard L on the process's own cgroup" "0" "${1:-?}" $?
        set -- $(o get); [ "${1:-}" = 0 ] && [ "${2:-}" = "$S" ] && [ "${3:-}" = "$LIMIT" ]
        record "native: nvmlDeviceGetMemoryLimits_v1 reads them back (rc soft hard)" "0 $S $LIMIT" "${1:-?} ${2:-?} ${3:-?}" $?
        set -- $(o meminfo)
        within "${2:-x}" $((LIMIT - (256 << 20))) "$LIMIT" && within "${1:-x}" 0 "${2:-0}"
        record "native: cuMemGetInfo total = the hard limit, free <= total (bytes)" \
            "$((LIMIT - (256 << 20)))..$LIMIT" "total ${2:-?}, free ${1:-?}" $?
        info "native: NVML memory info in the cgroup (free total, bytes)" "${3:-?} ${4:-?}"
        set -- $(o alloc)
        got=$(( ${1:-0} >> 20 ))
        within "$got" $((LIMIT_MIB - 1024)) "$LIMIT_MIB" && [ "${2:-}" = 2 ]
        record "native: cuMemAlloc 64 MiB steps refused at the hard limit (MiB, CUresult)" \
            "$((LIMIT_MIB - 1024))..$LIMIT_MIB, 2 (out of memory)" "$got, ${2:-?}" $?
        physical native "$max"
        set -- $(o filled)
        within "${4:-x}" $(( ${got:-0} << 20 )) "$LIMIT"
        record "native: GetMemoryLimits currentUsed when full (bytes)" "$(( ${got:-0} << 20 ))..$LIMIT" "${4:-?} (rc ${1:-?})" $?
        set -- $(o cleared); c=${1:-?}; set -- $(o after)
        [ "$c" = 0 ] && { [ "${1:-}" = 6 ] || { [ "${1:-}" = 0 ] && [ "${2:-}" = 0 ] && [ "${3:-}" = 18446744073709551615 ]; }; }
        record "native: cleared (set soft 0, no hard limit; then get: not found or 0/max)" "0, 6 or 0 0 max" \
            "$c, ${1:-?} ${2:-?} ${3:-?}" $?
        set -- $(o past); [ "${1:-}" = 0 ]
        record "native: L + 256 MiB fits once cleared (CUresult)" "0" "${1:-?}" $?
        [ "${clr:-}" = 0 ] && [ "$gone" = 0 ]
        record "native: soft limit zeroed, then the leaf cgroup removed" "0, removed" \
            "${clr:-?}, $([ "$gone" = 0 ] && echo removed || echo "not removed: $(tail -1 "$DIAG/native.err")")" $?
    fi
    # whatever ran, the leaf must not be left behind
    [ "$gone" = 0 ] || [ -n "$(o set)" ] || record "native: leaf cgroup removed" "removed" "$LEAF: $(tail -1 "$DIAG/native.err")" 1
fi

fi

echo
echo "== results: $GPU_NAME, driver $DRIVER, limit $LIMIT_MIB MiB, $(date -u +%Y-%m-%d)"
{
    printf 'check\texpected\tmeasured\tresult\n'
    cat "$RESULTS"
} >"$WORK/table"
if command -v column >/dev/null; then column -t -s "$(printf '\t')" "$WORK/table"; else cat "$WORK/table"; fi
npass=$(grep -c 'PASS$' "$RESULTS"); nfail=$(grep -c 'FAIL$' "$RESULTS"); nnot=$(grep -c 'NOT RUN$' "$RESULTS")
echo "$npass passed, $nfail failed, $nnot not run"
[ "$nfail" -gt 0 ] && exit 1
[ "$nnot" -gt 0 ] && exit 3
exit 0
