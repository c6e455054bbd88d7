/*
 * client_holes.c - checks for the isolation holes of issue 11, run by
 * run_tests.sh with the limiter preloaded over the fake driver (see the
 * comment of each test for the environment it expects).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

#define OOM CUDA_ERROR_OUT_OF_MEMORY

static TL_MEM_ALLOCATION_PROP dev_prop(int type, int id)
{
    TL_MEM_ALLOCATION_PROP p;
    memset(&p, 0, sizeof(p));
    p.type = 1; /* pinned */
    p.location.type = type;
    p.location.id = id;
    return p;
}

static CUresult alloc1(unsigned long long n)
{
    CUdeviceptr d;
    CUresult r = api.cuMemAlloc_v2(&d, n);
    if (r == CUDA_SUCCESS)
        api.cuMemFree_v2(d);
    return r;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- hole 1: VMM memory lives until the last mapping and handle go ---- */
static void t_vmm(unsigned long long L)
{
    init_cuda();
    CUmemGenericAllocationHandle h = 0, h2 = 0, h3 = 0;
    CUdeviceptr va = 0, va2 = 0;
    TL_MEM_ALLOCATION_PROP p = dev_prop(TL_MEM_LOCATION_DEVICE, 0);
    CUresult r = api.cuMemCreate(&h, L + 1, &p, 0);
    check(r == OOM, "vmm-create-over-limit-refused", "r=%d", r);

    /* the common idiom: create, map, release the handle at once */
    r = api.cuMemCreate(&h, L, &p, 0);
    api.cuMemAddressReserve(&va, L, 0, 0, 0);
    CUresult rm = api.cuMemMap(va, L, 0, h, 0);
    CUresult rr = api.cuMemRelease(h);
    check(r == CUDA_SUCCESS && rm == CUDA_SUCCESS && rr == CUDA_SUCCESS, "vmm-create-map-release", "r=%d %d %d", r,
          rm, rr);
    check(mem_free() == 0 && alloc1(1) == OOM, "vmm-released-but-mapped-still-charged",
          "free=%zu (the driver still holds %llu bytes)", mem_free(), fake_used(0));
    r = api.cuMemUnmap(va, L);
    check(r == CUDA_SUCCESS && mem_free() == L && fake_used(0) == 0, "vmm-last-unmap-after-release-credits",
          "r=%d free=%zu driver=%llu", r, mem_free(), fake_used(0));

    /* two mappings of one handle: charged until both are gone */
    api.cuMemCreate(&h, L / 2, &p, 0);
    api.cuMemAddressReserve(&va, L / 2, 0, 0, 0);
    api.cuMemAddressReserve(&va2, L / 2, 0, 0, 0);
    api.cuMemMap(va, L / 2, 0, h, 0);
    api.cuMemMap(va2, L / 2, 0, h, 0);
    api.cuMemRelease(h);
    api.cuMemUnmap(va, L / 2);
    check(mem_free() == L / 2, "vmm-one-of-two-mappings-left-still-charged", "free=%zu", mem_free());
    api.cuMemUnmap(va2, L / 2);
    check(mem_free() == L, "vmm-both-mappings-gone-credits", "free=%zu", mem_free());

    /* a retained handle keeps the memory alive after the first release */
    api.cuMemCreate(&h, L / 2, &p, 0);
    api.cuMemAddressReserve(&va, L / 2, 0, 0, 0);
    api.cuMemMap(va, L / 2, 0, h, 0);
    r = api.cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)va);
    api.cuMemRelease(h);
    api.cuMemUnmap(va, L / 2);
    check(r == CUDA_SUCCESS && mem_free() == L / 2 && fake_used(0) == L / 2, "vmm-retained-handle-still-charged",
          "r=%d free=%zu driver=%llu", r, mem_free(), fake_used(0));
    api.cuMemRelease(h2);
    check(mem_free() == L && fake_used(0) == 0, "vmm-retained-handle-released-credits", "free=%zu", mem_free());

    /* one unmap over two adjacent mappings of two handles */
    api.cuMemCreate(&h, L / 4, &p, 0);
    api.cuMemCreate(&h3, L / 4, &p, 0);
    api.cuMemAddressReserve(&va, L / 2, 0, 0, 0);
    api.cuMemMap(va, L / 4, 0, h, 0);
    api.cuMemMap(va + L / 4, L / 4, 0, h3, 0);
    api.cuMemRelease(h);
    api.cuMemRelease(h3);
    check(mem_free() == L / 2, "vmm-two-handles-mapped-charged", "free=%zu", mem_free());
    api.cuMemUnmap(va, L / 2);
    check(mem_free() == L && fake_used(0) == 0, "vmm-one-unmap-of-two-mappings-credits-both", "free=%zu driver=%llu",
          mem_free(), fake_used(0));

    /* an imported handle refers to memory charged where it was created:
     * importing and mapping it charges nothing more */
    int token = 0;
    api.cuMemCreate(&h, L / 2, &p, 0);
    api.cuMemExportToShareableHandle(&token, h, 1, 0);
    r = api.cuMemImportFromShareableHandle(&h3, (void *)(intptr_t)token, 1);
    api.cuMemAddressReserve(&va, L / 2, 0, 0, 0);
    rm = api.cuMemMap(va, L / 2, 0, h3, 0);
    check(r == CUDA_SUCCESS && rm == CUDA_SUCCESS && mem_free() == L / 2, "vmm-import-not-charged-twice",
          "r=%d %d free=%zu", r, rm, mem_free());
    api.cuMemUnmap(va, L / 2);
    api.cuMemRelease(h3);
    api.cuMemRelease(h);
    check(mem_free() == L && fake_used(0) == 0, "vmm-import-released", "free=%zu driver=%llu", mem_free(),
          fake_used(0));

    /* host memory is not device memory; its location id is not a device
     * and must not be read as one */
    TL_MEM_ALLOCATION_PROP hp = dev_prop(2, 0x7fffffff);
    r = api.cuMemCreate(&h, L + 1, &hp, 0);
    check(r == CUDA_SUCCESS && mem_free() == L, "vmm-host-location-not-charged", "r=%d free=%zu", r, mem_free());
    if (r == CUDA_SUCCESS)
        api.cuMemRelease(h);
    /* bogus calls change nothing */
    api.cuMemUnmap(0x1000, 4096);
    api.cuMemRelease(0xdead);
    check(mem_free() == L && alloc1(L) == CUDA_SUCCESS, "vmm-bogus-calls-change-nothing", "free=%zu", mem_free());
}

/* ---- hole 6: memory the limiter never sees in a call ----
 * Expects TESSERA_CONTEXT_RESERVE=0, FAKE_MODULE_MEM=L/4, FAKE_CTX_GROWTH=L/8,
 * FAKE_SM_COUNT=4 (a stack byte costs 4 x 2048 bytes). */
static void t_unseen(unsigned long long L)
{
    init_cuda();
    CUcontext pc;
    api.cuDevicePrimaryCtxRetain(&pc, 0);
    api.cuCtxSetCurrent(pc);
    CUmemoryPool pool = NULL;
    api.cuDeviceGetDefaultMemPool(&pool, 0);
    unsigned long long keep = ~0ull, zero = 0, res = 0;
    CUdeviceptr a;
    CUresult r;

    /* 1. a stream-ordered pool that keeps freed memory (PyTorch's
     * cudaMallocAsync backend sets the release threshold to the maximum) */
    api.cuMemPoolSetAttribute(pool, TL_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    r = api.cuMemAllocAsync(&a, L / 2, NULL);
    api.cuMemFreeAsync(a, NULL);
    api.cuStreamSynchronize(NULL);
    api.cuMemPoolGetAttribute(pool, TL_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
    check(r == CUDA_SUCCESS && res == L / 2, "pool-keeps-freed-memory", "r=%d reserved=%llu", r, res);
    r = alloc1(L / 2 + 1);
    check(r == OOM, "pool-reserve-charged", "alloc of L/2+1 next to L/2 reserved: r=%d (driver holds %llu)", r,
          fake_used(0));
    check(mem_free() == L / 2, "pool-reserve-reported", "free=%zu", mem_free());
    r = api.cuMemAllocAsync(&a, L / 2, NULL);
    check(r == CUDA_SUCCESS, "pool-reserve-reused-not-charged-twice", "r=%d", r);
    api.cuMemFreeAsync(a, NULL);
    api.cuMemPoolTrimTo(pool, 0);
    check(mem_free() == L && alloc1(L) == CUDA_SUCCESS, "pool-trim-credits", "free=%zu", mem_free());
    api.cuMemPoolSetAttribute(pool, TL_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero);
    /* a pool of its own, destroyed with memory reserved */
    TL_MEM_POOL_PROPS pp;
    memset(&pp, 0, sizeof(pp));
    pp.allocType = 1;
    pp.location.type = TL_MEM_LOCATION_DEVICE;
    pp.location.id = 0;
    CUmemoryPool own = NULL;
    api.cuMemPoolCreate(&own, &pp);
    api.cuMemPoolSetAttribute(own, TL_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    r = api.cuMemAllocFromPoolAsync(&a, L / 2, own, NULL);
    api.cuMemFreeAsync(a, NULL);
    api.cuStreamSynchronize(NULL);
    check(r == CUDA_SUCCESS && alloc1(L / 2 + 1) == OOM, "created-pool-reserve-charged", "r=%d", r);
    api.cuMemPoolDestroy(own);
    check(mem_free() == L && fake_used(0) == 0, "destroyed-pool-credited", "free=%zu driver=%llu", mem_free(),
          fake_used(0));

    /* 2. the in-kernel malloc heap (backed at the next launch) */
    r = api.cuCtxSetLimit(TL_LIMIT_MALLOC_HEAP_SIZE, L / 2);
    check(r == CUDA_SUCCESS && alloc1(L / 2 + 1) == OOM, "heap-limit-charged", "r=%d", r);
    size_t v = 0;
    r = api.cuCtxSetLimit(TL_LIMIT_MALLOC_HEAP_SIZE, L + 1);
    api.cuCtxGetLimit(&v, TL_LIMIT_MALLOC_HEAP_SIZE);
    check(r == OOM && v == L / 2, "heap-limit-over-refused-unchanged", "r=%d heap=%zu", r, v);
    api.cuCtxSetLimit(TL_LIMIT_MALLOC_HEAP_SIZE, 0);
    check(mem_free() == L, "heap-limit-lowered-credits", "free=%zu", mem_free());

    /* 3. the per-thread stack, for every resident thread */
    r = api.cuCtxSetLimit(TL_LIMIT_STACK_SIZE, 1024 + L / 2 / (4 * 2048));
    check(r == CUDA_SUCCESS && alloc1(L / 2 + 1) == OOM && alloc1(L / 2) == CUDA_SUCCESS, "stack-limit-charged",
          "r=%d free=%zu", r, mem_free());
    api.cuCtxSetLimit(TL_LIMIT_STACK_SIZE, 1024);
    check(mem_free() == L, "stack-limit-restored-credits", "free=%zu", mem_free());

    /* 4. module globals */
    CUmodule m = NULL;
    r = api.cuModuleLoadData(&m, "fake image");
    check(r == CUDA_SUCCESS && alloc1(L - L / 4 + 1) == OOM, "module-globals-counted",
          "r=%d: L-L/4+1 more with L/4 of globals held by the driver", r);
    check(alloc1(L - L / 4) == CUDA_SUCCESS, "module-globals-counted-exactly", "free=%zu", mem_free());
    api.cuModuleUnload(m);
    check(alloc1(L) == CUDA_SUCCESS, "module-unloaded-credited", "free=%zu", mem_free());

    /* 5. context growth after warm-up (the first kernel's local memory,
     * lazy loading): seen by the periodic reconciliation with NVML */
    api.cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    api.cuCtxSynchronize();
    sleep_s(1.2);
    check(alloc1(L - L / 8 + 1) == OOM, "context-growth-counted-within-a-second", "free=%zu driver=%llu", mem_free(),
          fake_used(0));
    check(alloc1(L - L / 8) == CUDA_SUCCESS, "context-growth-counted-exactly", "free=%zu", mem_free());
}

/* ---- hole 8: devices matched by UUID ----
 * Expects two fake GPUs with NVML order reversed (FAKE_NVML_ORDER=1,0) and
 * limits L on CUDA device 0 and 2L on CUDA device 1 (env or limits file). */
static void t_multigpu(unsigned long long L)
{
    init_cuda();
    api.nvmlInit_v2();
    nvmlDevice_t n0, n1;
    TL_NVML_MEMORY m0, m1;
    api.nvmlDeviceGetHandleByIndex_v2(0, &n0);
    api.nvmlDeviceGetHandleByIndex_v2(1, &n1);
    api.nvmlDeviceGetMemoryInfo(n0, &m0);
    api.nvmlDeviceGetMemoryInfo(n1, &m1);
    check(m0.total == 2 * L && m1.total == L, "nvml-index-matched-to-cuda-device-by-uuid",
          "NVML 0 (CUDA 1) total=%llu want %llu, NVML 1 (CUDA 0) total=%llu want %llu", m0.total, 2 * L, m1.total, L);

    CUcontext p0, c1;
    api.cuDevicePrimaryCtxRetain(&p0, 0);
    api.cuCtxSetCurrent(p0);
    /* a pool of device 1, used while device 0 is current */
    TL_MEM_POOL_PROPS pp;
    memset(&pp, 0, sizeof(pp));
    pp.allocType = 1;
    pp.location.type = TL_MEM_LOCATION_DEVICE;
    pp.location.id = 1;
    CUmemoryPool pool1 = NULL;
    CUdeviceptr a, b;
    api.cuMemPoolCreate(&pool1, &pp);
    CUresult r = api.cuMemAllocFromPoolAsync(&a, L + L / 2, pool1, NULL);
    check(r == CUDA_SUCCESS, "pool-device-from-pool-properties", "1.5 L from device 1's pool: r=%d", r);
    check(mem_free() == L, "pool-device-other-device-not-charged", "device 0 free=%zu", mem_free());
    if (r == CUDA_SUCCESS)
        api.cuMemFreeAsync(a, NULL);
    api.cuStreamSynchronize(NULL);
    api.cuMemPoolDestroy(pool1);
    /* a stream of device 1, used while device 0 is current */
    api.cuCtxCreate_v2(&c1, 0, 1);
    CUstream s1 = NULL;
    api.cuStreamCreate(&s1, 0);
    api.cuCtxSetCurrent(p0);
    r = api.cuMemAllocAsync(&b, L + L / 2, s1);
    check(r == CUDA_SUCCESS, "async-alloc-device-from-stream", "1.5 L on device 1's stream: r=%d", r);
    check(mem_free() == L, "async-alloc-other-device-not-charged", "device 0 free=%zu", mem_free());
    if (r == CUDA_SUCCESS)
        api.cuMemFreeAsync(b, s1);
    api.cuStreamSynchronize(s1);
    api.cuCtxSetCurrent(c1);
    check(mem_free() == 2 * L, "device-1-all-released", "device 1 free=%zu", mem_free());
    api.cuCtxDestroy_v2(c1);
}

/* Context measured on the right GPU (FAKE_CTX_MEM=M, NVML order
 * reversed): the first context of CUDA device 1 is measured through NVML
 * index 0. */
static void t_ctxgpu(unsigned long long L, unsigned long long M)
{
    init_cuda();
    CUcontext c;
    CUresult r = api.cuCtxCreate_v2(&c, 0, 1);
    check(r == CUDA_SUCCESS && mem_free() == L - M, "ctx-measured-on-the-right-gpu", "r=%d free=%zu want %llu", r,
          mem_free(), L - M);
    api.cuCtxDestroy_v2(c);
}

/* ---- hole 9: nvidia-smi in the container ----
 * Expects FAKE_GPU_MEM=2g, limit L=1g, FAKE_NVML_NEIGHBOURS with a
 * process NB of another container holding 1536 MiB. */
static int has_pid(const unsigned char *buf, unsigned n, size_t stride, unsigned pid)
{
    for (unsigned i = 0; i < n; i++) {
        unsigned p;
        memcpy(&p, buf + i * stride, 4);
        if (p == pid)
            return 1;
    }
    return 0;
}

static void t_smi(unsigned long long L, unsigned nb)
{
    init_cuda();
    CUcontext pc;
    api.cuDevicePrimaryCtxRetain(&pc, 0);
    api.cuCtxSetCurrent(pc);
    CUdeviceptr d;
    api.cuMemAlloc_v2(&d, L / 4);
    api.nvmlInit_v2();
    nvmlDevice_t n;
    api.nvmlDeviceGetHandleByIndex_v2(0, &n);
    unsigned self = (unsigned)getpid() + (getenv("FAKE_NVML_PID_OFFSET") ? (unsigned)atoi(getenv("FAKE_NVML_PID_OFFSET")) : 0);
    static unsigned char buf[64 * 32];
    struct {
        const char *name;
        nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, void *);
        size_t stride;
    } lists[] = {
        {"compute-v3", api.nvmlDeviceGetComputeRunningProcesses_v3,
         getenv("FAKE_NVML_V3_STRIDE") ? (size_t)atoi(getenv("FAKE_NVML_V3_STRIDE")) : 24},
        {"compute-v2", api.nvmlDeviceGetComputeRunningProcesses_v2, 24},
        {"compute-v1", api.nvmlDeviceGetComputeRunningProcesses, 16},
        {"graphics-v3", api.nvmlDeviceGetGraphicsRunningProcesses_v3,
         getenv("FAKE_NVML_V3_STRIDE") ? (size_t)atoi(getenv("FAKE_NVML_V3_STRIDE")) : 24},
        {"mps-v2", api.nvmlDeviceGetMPSComputeRunningProcesses_v2, 24},
    };
    char name[96];
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        unsigned cnt = 64;
        memset(buf, 0, sizeof(buf));
        nvmlReturn_t r = lists[i].fn(n, &cnt, buf);
        snprintf(name, sizeof(name), "smi-%s-shows-only-the-container", lists[i].name);
        check(r == NVML_SUCCESS && cnt == 1 && has_pid(buf, cnt, lists[i].stride, self) &&
                  !has_pid(buf, cnt, lists[i].stride, nb),
              name, "r=%d count=%u self=%d neighbour=%d", r, cnt, has_pid(buf, cnt, lists[i].stride, self),
              has_pid(buf, cnt, lists[i].stride, nb));
        unsigned long long used = 0;
        memcpy(&used, buf + 8, 8);
        snprintf(name, sizeof(name), "smi-%s-entry-intact", lists[i].name);
        check(used == fake_used(0), name, "usedGpuMemory=%llu want %llu", used, fake_used(0));
        cnt = 0;
        r = lists[i].fn(n, &cnt, NULL);
        snprintf(name, sizeof(name), "smi-%s-size-query-counts-the-container", lists[i].name);
        check(r == NVML_ERROR_INSUFFICIENT_SIZE && cnt == 1, name, "r=%d count=%u", r, cnt);
    }
    TL_NVML_PROC_UTIL_SAMPLE s[64];
    unsigned cnt = 64;
    nvmlReturn_t r = api.nvmlDeviceGetProcessUtilization(n, s, &cnt, 0);
    int sawnb = 0;
    for (unsigned i = 0; r == NVML_SUCCESS && i < cnt; i++)
        sawnb |= s[i].pid == nb;
    check(r == NVML_SUCCESS && !sawnb, "smi-process-utilization-only-the-container", "r=%d count=%u", r, cnt);
    TL_NVML_PROC_UTIL_INFO ui[64];
    TL_NVML_PROCS_UTIL_INFO info = {1, 64, 0, ui};
    r = api.nvmlDeviceGetProcessesUtilizationInfo(n, &info);
    sawnb = 0;
    for (unsigned i = 0; r == NVML_SUCCESS && i < info.processSamplesCount; i++)
        sawnb |= ui[i].pid == nb;
    check(r == NVML_SUCCESS && !sawnb && info.processSamplesCount >= 1, "smi-processes-utilization-info-only-the-container",
          "r=%d count=%u", r, info.processSamplesCount);
    TL_NVML_PROC_DETAIL det[64];
    TL_NVML_PROC_DETAIL_LIST dl = {1, 0, 64, det};
    r = api.nvmlDeviceGetRunningProcessDetailList(n, &dl);
    check(r == NVML_SUCCESS && dl.numProcArrayEntries == 1 && det[0].pid == self,
          "smi-process-detail-list-only-the-container", "r=%d count=%u", r, dl.numProcArrayEntries);

    /* free memory: never above what the GPU really has free, and the same
     * through NVML as through the driver */
    size_t cf = 0, ct = 0;
    api.cuMemGetInfo_v2(&cf, &ct);
    TL_NVML_MEMORY m;
    api.nvmlDeviceGetMemoryInfo(n, &m);
    TL_NVML_MEMORY_V2 m2;
    memset(&m2, 0, sizeof(m2));
    api.nvmlDeviceGetMemoryInfo_v2(n, &m2);
    unsigned long long real_free = 2048ull * 1024 * 1024 - 1536ull * 1024 * 1024 - L / 4;
    check(cf == real_free, "cuMemGetInfo-free-capped-at-real-free", "free=%zu real=%llu", cf, real_free);
    check(m.free == cf && m.total == ct && m.used + m.free == m.total, "nvml-free-equals-cuMemGetInfo-free",
          "nvml free=%llu used=%llu total=%llu, cuMemGetInfo free=%zu total=%zu", m.free, m.used, m.total, cf, ct);
    check(m2.free == cf && m2.total == ct && m2.used + m2.free + m2.reserved == m2.total,
          "nvml-v2-free-equals-cuMemGetInfo-free", "free=%llu used=%llu reserved=%llu total=%llu", m2.free, m2.used,
          m2.reserved, m2.total);
    api.cuMemFree_v2(d);
}

/* ---- hole 7: cuGetProcAddress for every version a runtime passes ---- */

#define PTSZ TL_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
static const struct {
    const char *base;
    int ptsz;
} hooked[] = {
    {"cuInit", 0}, {"cuGetProcAddress", 0}, {"cuMemAlloc", 0}, {"cuMemAllocPitch", 0}, {"cuMemAllocManaged", 0},
    {"cuMemAllocAsync", 1}, {"cuMemAllocFromPoolAsync", 1}, {"cuMemFree", 0}, {"cuMemFreeAsync", 1},
    {"cuMemCreate", 0}, {"cuMemRelease", 0}, {"cuMemMap", 0}, {"cuMemUnmap", 0}, {"cuMemRetainAllocationHandle", 0},
    {"cuMemImportFromShareableHandle", 0}, {"cuMemPoolCreate", 0}, {"cuMemPoolDestroy", 0}, {"cuMemPoolTrimTo", 0},
    {"cuDeviceSetMemPool", 0}, {"cuArrayCreate", 0}, {"cuArray3DCreate", 0}, {"cuArrayDestroy", 0},
    {"cuMipmappedArrayCreate", 0}, {"cuMipmappedArrayDestroy", 0}, {"cuCtxCreate", 0}, {"cuCtxDestroy", 0},
    {"cuCtxSetLimit", 0}, {"cuDevicePrimaryCtxRetain", 0}, {"cuDevicePrimaryCtxRelease", 0},
    {"cuDevicePrimaryCtxReset", 0}, {"cuMemGetInfo", 0}, {"cuDeviceTotalMem", 0}, {"cuModuleLoadData", 0},
    {"cuLaunchKernel", 1}, {"cuLaunchKernelEx", 1}, {"cuLaunchCooperativeKernel", 1}, {"cuGraphLaunch", 1},
    {"cuGraphUpload", 1}, {"cuGraphInstantiate", 0}, {"cuGraphInstantiateWithFlags", 0},
    {"cuGraphInstantiateWithParams", 1}, {"cuGraphExecDestroy", 0}, {"cuDeviceGraphMemTrim", 0},
    {"cuCtxSynchronize", 0}, {"cuEventSynchronize", 0}, {"cuStreamSynchronize", 1}, {"cuModuleLoad", 0},
    {"cuModuleLoadDataEx", 0}, {"cuModuleLoadFatBinary", 0}, {"cuLibraryLoadData", 0},
    {"cuLibraryLoadFromFile", 0},
};
#define NHOOKED (sizeof(hooked) / sizeof(hooked[0]))

static int in_lib(void *fn, const char *needle)
{
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, needle);
}

static const char *sym_of(void *fn)
{
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "?";
}

/* "cuCtxCreate_v3_ptsz" -> "cuCtxCreate" */
static void base_of(const char *sym, char *out, size_t n)
{
    snprintf(out, n, "%s", sym);
    char *p = strstr(out, "_ptsz");
    if (p && p[5] == 0)
        *p = 0;
    p = strrchr(out, '_');
    if (p && p[1] == 'v' && p[2] >= '2' && p[2] <= '9' && p[3] == 0)
        *p = 0;
}

static int lib_hooked(const char *base)
{
    for (size_t i = 0; i < NHOOKED; i++)
        if (!strcmp(hooked[i].base, base))
            return 1;
    return 0;
}

/* Every hooked name, every version a runtime passes (11.0 .. 13.x), both
 * flags, both cuGetProcAddress versions: the limiter's hook of the right
 * variant, whatever address the driver gives (run with FAKE_GPA_THUNKS=1). */
static void t_gpa(void)
{
    init_cuda();
    static const int vers[] = {11000, 11010, 11020, 11030, 11040, 11050, 11060, 11070, 11080, 12000, 12010, 12020,
                               12030, 12040, 12050, 12060, 12080, 12090, 13000, 13010, 13020};
    int bad = 0, n = 0;
    for (size_t i = 0; i < NHOOKED; i++)
        for (size_t v = 0; v < sizeof(vers) / sizeof(vers[0]); v++)
            for (int f = 0; f < 2; f++)
                for (int which = 0; which < 2; which++) {
                    void *p = NULL;
                    unsigned long long flags = f ? PTSZ : 0;
                    CUresult r = which ? api.cuGetProcAddress_v2(hooked[i].base, &p, vers[v], flags, NULL)
                                       : api.cuGetProcAddress(hooked[i].base, &p, vers[v], flags);
                    if (r != CUDA_SUCCESS)
                        continue; /* not available at that version */
                    n++;
                    char b[96];
                    base_of(sym_of(p), b, sizeof(b));
                    int ptsz = strstr(sym_of(p), "_ptsz") != NULL;
                    if (!in_lib(p, "libtessera-limiter") || strcmp(b, hooked[i].base) || ptsz != (f && hooked[i].ptsz)) {
                        if (bad++ < 10)
                            printf("# %s(%s, %d, %s) -> %s (%s)\n", which ? "cuGetProcAddress_v2" : "cuGetProcAddress",
                                   hooked[i].base, vers[v], f ? "ptsz" : "0", sym_of(p),
                                   in_lib(p, "libtessera-limiter") ? "limiter" : "NOT the limiter");
                    }
                }
    check(bad == 0 && n > 1500, "gpa-every-hooked-name-version-flag-resolves-to-its-hook", "%d of %d wrong", bad, n);
    /* the variants themselves (as the real driver hands them out) */
    static const struct {
        const char *base;
        int ver;
        unsigned long long flags;
        const char *want;
    } spot[] = {
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"}, {"cuGetProcAddress", 11080, 0, "cuGetProcAddress"},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"}, {"cuGetProcAddress", 13000, 0, "cuGetProcAddress_v2"},
        {"cuCtxCreate", 11000, 0, "cuCtxCreate_v2"}, {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 12040, 0, "cuCtxCreate_v3"}, {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
        {"cuCtxCreate", 13000, 0, "cuCtxCreate_v4"}, {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
        {"cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"}, {"cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"},
        {"cuGraphInstantiate", 12000, 0, "cuGraphInstantiate_v2"},
        {"cuGraphInstantiateWithParams", 12000, PTSZ, "cuGraphInstantiateWithParams_ptsz"},
        {"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
        {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
        {"cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"}, {"cuMemAlloc", 11000, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 13000, PTSZ, "cuMemAlloc_v2"}, {"cuLaunchKernel", 11000, PTSZ, "cuLaunchKernel_ptsz"},
        {"cuLaunchKernel", 12000, 0, "cuLaunchKernel"}, {"cuMemAllocAsync", 11020, PTSZ, "cuMemAllocAsync_ptsz"},
        {"cuGraphLaunch", 13000, PTSZ, "cuGraphLaunch_ptsz"}, {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
        {"cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"}, {"cuDeviceTotalMem", 2000, 0, "cuDeviceTotalMem"},
    };
    char name[128];
    for (size_t i = 0; i < sizeof(spot) / sizeof(spot[0]); i++) {
        void *p = NULL;
        api.cuGetProcAddress_v2(spot[i].base, &p, spot[i].ver, spot[i].flags, NULL);
        snprintf(name, sizeof(name), "gpa-%s@%d%s-is-%s", spot[i].base, spot[i].ver, spot[i].flags ? "-ptsz" : "",
                 spot[i].want);
        check(in_lib(p, "libtessera-limiter") && !strcmp(sym_of(p), spot[i].want), name, "got %s (%s)", sym_of(p),
              in_lib(p, "libtessera-limiter") ? "limiter" : "not the limiter");
    }
    /* cuGetProcAddress itself, asked through itself, stays hooked */
    void *g = NULL, *q = NULL;
    api.cuGetProcAddress_v2("cuGetProcAddress", &g, 12000, 0, NULL);
    if (g)
        ((CUresult(*)(const char *, void **, int, unsigned long long, int *))g)("cuMemAlloc", &q, 12000, 0, NULL);
    check(in_lib(q, "libtessera-limiter"), "gpa-through-fetched-cuGetProcAddress-still-hooked", "got %s", sym_of(q));
    /* a version newer than the limiter knows: the driver's own exported
     * function is still swapped; an unknown address is refused */
    void *z = NULL;
    CUresult r = api.cuGetProcAddress_v2("cuMemAlloc", &z, 14000, 0, NULL);
    check(getenv("FAKE_GPA_THUNKS") ? (r == CUDA_ERROR_NOT_FOUND && z == NULL) : in_lib(z, "libtessera-limiter"),
          "gpa-unknown-future-version-fails-closed", "r=%d %s", r, sym_of(z));
    /* unhooked entry points still come from the driver */
    z = NULL;
    api.cuGetProcAddress_v2("cuDeviceGet", &z, 12000, 0, NULL);
    check(z && !in_lib(z, "libtessera-limiter"), "gpa-unhooked-passthrough", "got %s", sym_of(z));
    /* legacy v1 allocation entry points are not a way around the limit */
    CUdeviceptr_v1 d1 = 0;
    void *v1 = NULL;
    api.cuGetProcAddress_v2("cuMemAlloc", &v1, 2000, 0, NULL);
    r = v1 ? ((CUresult(*)(CUdeviceptr_v1 *, unsigned))v1)(&d1, 1u << 20) : -1;
    check(in_lib(v1, "libtessera-limiter") && r != CUDA_SUCCESS, "gpa-legacy-v1-alloc-refused", "r=%d %s", r,
          sym_of(v1));
}

/* Replays the requests a real runtime made (FAKE_GPA_LOG lines "name
 * version flags") through the limiter: hooked names resolve to hooks of
 * the variant the driver chose, the others to the driver. */
static void t_gpareplay(const char *path)
{
    init_cuda();
    FILE *f = fopen(path, "r");
    if (!f) {
        check(0, "gpa-replay-log", "cannot open %s", path);
        return;
    }
    char sym[256];
    int ver;
    unsigned long long flags;
    int n = 0, nh = 0, bad = 0;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%255s %d %llu", sym, &ver, &flags) != 3)
            continue; /* a #comment */
        void *p = NULL;
        if (api.cuGetProcAddress_v2(sym, &p, ver, flags, NULL) != CUDA_SUCCESS || !p)
            continue;
        n++;
        char b[96];
        base_of(sym_of(p), b, sizeof(b));
        int hook = lib_hooked(sym);
        nh += hook;
        int ok = hook ? in_lib(p, "libtessera-limiter") && !strcmp(b, sym) : !in_lib(p, "libtessera-limiter");
        if (!ok && bad++ < 10)
            printf("# replay %s %d %llu -> %s\n", sym, ver, flags, sym_of(p));
    }
    fclose(f);
    printf("# replayed %d resolved requests, %d of them hooked\n", n, nh);
    check(bad == 0 && nh > 0, "gpa-replay-real-runtime-requests", "%d of %d wrong", bad, n);
}

/* Against a real libcuda (no GPU needed: cuGetProcAddress works before
 * cuInit). gpadump, without the limiter: what the driver hands out for every
 * hooked name, version (11.0 .. `max`) and flag, as "base version flags
 * variant". gpacheck FILE, with the limiter: the same requests give the
 * limiter's hook of that very variant. */
static void t_gpadump(int max)
{
    for (size_t i = 0; i < NHOOKED; i++)
        for (int v = 11000; v <= max; v += 10)
            for (int f = 0; f < 2; f++) {
                void *p = NULL;
                if (api.cuGetProcAddress_v2(hooked[i].base, &p, v, f ? PTSZ : 0, NULL) == CUDA_SUCCESS && p)
                    printf("%s %d %d %s\n", hooked[i].base, v, f ? PTSZ : 0, sym_of(p));
            }
}

static void t_gpacheck(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        check(0, "gpa-real-driver", "cannot open %s", path);
        return;
    }
    char base[128], want[128];
    int ver, flags, n = 0, bad = 0;
    while (fscanf(f, "%127s %d %d %127s", base, &ver, &flags, want) == 4) {
        void *p = NULL;
        api.cuGetProcAddress_v2(base, &p, ver, (unsigned long long)flags, NULL);
        n++;
        if (!in_lib(p, "libtessera-limiter") || strcmp(sym_of(p), want)) {
            if (bad++ < 10)
                printf("# real driver: %s(%d, %d) is %s, limiter gave %s\n", base, ver, flags, want, sym_of(p));
        }
    }
    fclose(f);
    printf("# real driver: %d requests checked\n", n);
    check(bad == 0 && n > 1000, "gpa-real-driver-every-answer-hooked-same-variant", "%d of %d wrong", bad, n);
}

/* ---- hole 10 and the rest: one allocation, with its time ---- */
/* An allocation that must answer within max_s seconds (and, with min_s,
 * not before: the limiter waited for a reclaim that did not come). */
static void t_timed_try(unsigned long long bytes, const char *expect, double max_s, const char *name, double min_s)
{
    double t0 = now_s();
    init_cuda();
    CUdeviceptr d;
    CUresult r = api.cuMemAlloc_v2(&d, bytes);
    double dt = now_s() - t0;
    int want = !strcmp(expect, "ok") ? CUDA_SUCCESS : OOM;
    check(r == want && dt <= max_s && dt >= min_s, name, "r=%d want %d after %.2fs (from %.1fs to %.1fs)", r, want, dt,
          min_s, max_s);
}

/* An allocation on CUDA device `dev` (its own context). */
static void t_trydev(int dev, unsigned long long bytes, const char *expect, const char *name)
{
    init_cuda();
    CUcontext c;
    CUresult rc = api.cuCtxCreate_v2(&c, 0, dev);
    CUdeviceptr d;
    CUresult r = rc == CUDA_SUCCESS ? api.cuMemAlloc_v2(&d, bytes) : rc;
    int want = !strcmp(expect, "ok") ? CUDA_SUCCESS : OOM;
    check(r == want, name, "device %d: context r=%d, alloc r=%d, want %d", dev, rc, r, want);
}

/* Run `malformed` again with NAME=VALUE added to the environment a second
 * time (the first is inherited): execve allows duplicate names. */
extern char **environ;
static void t_envtwice(const char *self, const char *kv)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof(*env));
    if (!env)
        exit(1);
    memcpy(env, environ, n * sizeof(*env));
    env[n] = (char *)kv;
    char *args[] = {(char *)self, "malformed", NULL};
    execve("/proc/self/exe", args, env);
    check(0, "envtwice-exec", "execve failed");
}

/* TESSERA_LIMITER_TRACE across fork, and a planted link. The parent plants
 * a symbolic link at its own trace path (<prefix>.<pid>) to `victim`, then
 * makes a traced call (an NVML process list): the link is not followed.
 * A traced call again (its file may now be open), then fork: the child
 * puts a descriptor of its own on every number it has open from 3 up (as a
 * program redirecting its files would), makes a traced call, and its
 * descriptors must all still be open (before: the child's first trace line
 * closed whatever number the parent's trace descriptor had), and its own
 * trace file <prefix>.<child pid> written. */
static void nvml_traced_call(void)
{
    nvmlDevice_t n;
    unsigned cnt = 0;
    if (api.nvmlInit_v2() == NVML_SUCCESS && api.nvmlDeviceGetHandleByIndex_v2(0, &n) == NVML_SUCCESS)
        api.nvmlDeviceGetComputeRunningProcesses_v2(n, &cnt, NULL);
}

static void t_tracefork(const char *victim)
{
    const char *pre = getenv("TESSERA_LIMITER_TRACE");
    if (!pre || !*pre || !api.nvmlInit_v2) {
        check(0, "tracefork-setup", "needs TESSERA_LIMITER_TRACE and NVML");
        return;
    }
    char path[512];
    snprintf(path, sizeof(path), "%s.%d", pre, (int)getpid());
    unlink(path);
    int linked = symlink(victim, path) == 0;
    nvml_traced_call();
    struct stat st;
    check(linked && stat(victim, &st) != 0, "trace-does-not-follow-a-planted-link", "linked %d, %s %s", linked,
          victim, stat(victim, &st) == 0 ? "exists" : "absent");
    unlink(path);
    nvml_traced_call(); /* now with its file open, if it could be */
    pid_t p = fork();
    if (p == 0) {
        int mine[256], nmine = 0;
        for (int fd = 3; fd < 256; fd++)
            if (fcntl(fd, F_GETFD) >= 0) {
                int d = open("/dev/null", O_RDONLY);
                if (d >= 0 && d != fd) {
                    dup2(d, fd);
                    close(d);
                }
                mine[nmine++] = fd;
            }
        nvml_traced_call();
        /* each still open and still /dev/null (the trace may have
         * reopened its file on a number it closed) */
        struct stat dn, x;
        int lost = stat("/dev/null", &dn) != 0;
        for (int i = 0; i < nmine; i++)
            lost += fstat(mine[i], &x) != 0 || !S_ISCHR(x.st_mode) || x.st_rdev != dn.st_rdev;
        char own[512];
        snprintf(own, sizeof(own), "%s.%d", pre, (int)getpid());
        _exit((lost ? 1 : 0) | (stat(own, &st) == 0 && st.st_size > 0 ? 0 : 2));
    }
    int status = 0;
    waitpid(p, &status, 0);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 99;
    check(p > 0 && rc != 99 && !(rc & 1), "trace-after-fork-keeps-the-childs-descriptors",
          "child exit %d", rc);
    check(p > 0 && rc == 0, "trace-after-fork-child-writes-its-own-file", "child exit %d", rc);
}

int holes_main(const char *t, int argc, char **argv)
{
    unsigned long long a = argc > 2 ? strtoull(argv[2], NULL, 0) : 0;
    if (!strcmp(t, "vmm"))
        t_vmm(a);
    else if (!strcmp(t, "unseen"))
        t_unseen(a);
    else if (!strcmp(t, "multigpu"))
        t_multigpu(a);
    else if (!strcmp(t, "ctxgpu") && argc > 3)
        t_ctxgpu(a, strtoull(argv[3], NULL, 0));
    else if (!strcmp(t, "smi") && argc > 3)
        t_smi(a, (unsigned)atoi(argv[3]));
    else if (!strcmp(t, "gpa"))
        t_gpa();
    else if (!strcmp(t, "gpadump") && argc > 2)
        t_gpadump(atoi(argv[2]));
    else if (!strcmp(t, "gpacheck") && argc > 2)
        t_gpacheck(argv[2]);
    else if (!strcmp(t, "gpareplay") && argc > 2)
        t_gpareplay(argv[2]);
    else if (!strcmp(t, "tracefork") && argc > 2)
        t_tracefork(argv[2]);
    else if (!strcmp(t, "envtwice") && argc > 2)
        t_envtwice(argv[0], argv[2]);
    else if (!strcmp(t, "trydev") && argc > 5)
        t_trydev(atoi(argv[2]), strtoull(argv[3], NULL, 0), argv[4], argv[5]);
    else if (!strcmp(t, "timedtry") && argc > 5)
        t_timed_try(a, argv[3], atof(argv[4]), argv[5], argc > 6 ? atof(argv[6]) : 0);
    else
        return 0;
    return 1;
}
