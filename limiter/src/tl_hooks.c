/*
 * tl_hooks.c - the interposed CUDA driver API and NVML entry points.
 *
 * Every exported cu... and nvml... function below has the name and signature of the
 * driver function it replaces. It is reached three ways:
 *   1. by symbol, when the application links libcuda/libnvidia-ml and this
 *      library is preloaded ahead of them;
 *   2. through dlsym(handle_of_libcuda, name): our dlsym() returns the
 *      wrapper for names we intercept;
 *   3. through cuGetProcAddress[_v2]: the hook asks the real driver and, if
 *      the answer is the address of a function we intercept, hands back the
 *      wrapper instead.
 * The real functions are found with the real dlsym on a handle from
 * dlopen("libcuda.so.1", RTLD_NOW|RTLD_LOCAL), never through our own dlsym.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tl_config.h"
#include "tl_cuda.h"
#include "tl_hostpid.h"
#include "tl_pacer.h"
#include "tl_state.h"
#include "tl_table.h"

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

extern char **environ;

/* ------------------------------------------------------------------ */
/* real function pointers                                              */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;

#define CU_REAL_LIST(X)                                                             \
    X(cuInit, (unsigned int))                                                       \
    X(cuGetProcAddress, (const char *, void **, int, unsigned long long))           \
    X(cuGetProcAddress_v2, (const char *, void **, int, unsigned long long, int *)) \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                       \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))  \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))                     \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                           \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))                      \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))     \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const TL_MEM_ALLOCATION_PROP *, unsigned long long)) \
    X(cuArrayCreate_v2, (CUarray *, const TL_ARRAY_DESCRIPTOR *))                   \
    X(cuArray3DCreate_v2, (CUarray *, const TL_ARRAY3D_DESCRIPTOR *))               \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *, const TL_ARRAY3D_DESCRIPTOR *, unsigned int)) \
    X(cuMemFree_v2, (CUdeviceptr))                                                  \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                      \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))                                 \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                 \
    X(cuArrayDestroy, (CUarray))                                                    \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray))                                  \
    X(cuCtxCreate_v2, (CUcontext *, unsigned int, CUdevice))                        \
    X(cuCtxCreate_v3, (CUcontext *, void *, int, unsigned int, CUdevice))           \
    X(cuCtxCreate_v4, (CUcontext *, void *, unsigned int, CUdevice))                \
    X(cuCtxDestroy_v2, (CUcontext))                                                 \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                            \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                     \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice))                                       \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                        \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                    \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuLaunchKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuLaunchKernelEx, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **))   \
    X(cuLaunchKernelEx_ptsz, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **)) \
    X(cuLaunchCooperativeKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(cuLaunchCooperativeKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(cuGraphLaunch, (CUgraphExec, CUstream))                                       \
    X(cuGraphLaunch_ptsz, (CUgraphExec, CUstream))                                  \
    X(cuGraphUpload, (CUgraphExec, CUstream))                                       \
    X(cuGraphUpload_ptsz, (CUgraphExec, CUstream))                                  \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long))    \
    X(cuGraphInstantiateWithParams, (CUgraphExec *, CUgraph, TL_GRAPH_INSTANTIATE_PARAMS *)) \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec *, CUgraph, TL_GRAPH_INSTANTIATE_PARAMS *)) \
    X(cuGraphInstantiate_v2, (CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t)) \
    X(cuGraphExecDestroy, (CUgraphExec))                                            \
    X(cuDeviceGraphMemTrim, (CUdevice))

/* Driver functions the limiter calls but does not intercept. */
#define CU_AUX_LIST(X)                                                              \
    X(cuCtxGetDevice, (CUdevice *))                                                 \
    X(cuStreamIsCapturing, (CUstream, int *))                                       \
    X(cuStreamIsCapturing_ptsz, (CUstream, int *))                                  \
    X(cuGraphGetNodes, (CUgraph, CUgraphNode *, size_t *))                          \
    X(cuGraphNodeGetType, (CUgraphNode, int *))                                     \
    X(cuGraphMemAllocNodeGetParams, (CUgraphNode, TL_MEM_ALLOC_NODE_PARAMS *))      \
    X(cuGraphChildGraphNodeGetGraph, (CUgraphNode, CUgraph *))                      \
    X(cuDeviceGetGraphMemAttribute, (CUdevice, int, void *))

#define NVML_REAL_LIST(X)                                                           \
    X(nvmlInit_v2, (void))                                                          \
    X(nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t *))                \
    X(nvmlDeviceGetIndex, (nvmlDevice_t, unsigned int *))                           \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t, TL_NVML_MEMORY *))                    \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, TL_NVML_MEMORY_V2 *))              \
    X(nvmlDeviceGetProcessUtilization, (nvmlDevice_t, TL_NVML_PROC_UTIL_SAMPLE *, unsigned int *, unsigned long long)) \
    X(nvmlDeviceGetUtilizationRates, (nvmlDevice_t, TL_NVML_UTILIZATION *))             \
    X(nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned int *, void *))   \
    X(nvmlDeviceGetComputeRunningProcesses_v2, (nvmlDevice_t, unsigned int *, void *))   \
    X(nvmlDeviceGetComputeRunningProcesses, (nvmlDevice_t, unsigned int *, void *))

#define DECL_CU(name, args) static CUresult(*real_##name) args;
#define DECL_NVML(name, args) static nvmlReturn_t(*real_##name) args;
CU_REAL_LIST(DECL_CU)
CU_AUX_LIST(DECL_CU)
NVML_REAL_LIST(DECL_NVML)
#define PROTO_CU(name, args) EXPORT CUresult name args;
CU_REAL_LIST(PROTO_CU)

/* ------------------------------------------------------------------ */
/* initialisation                                                      */

static tl_config cfg;
static tl_shared sh;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static int registered;
static int cuda_ready, nvml_ready;
static pthread_once_t core_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

/* Called from dlsym(), which sanitizer runtimes use while they start up:
 * nothing here may be instrumented. */
#define NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))

static NO_SANITIZE void resolve_real_dlsym(void)
{
    static const char *const vers[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof(vers) / sizeof(vers[0]) && !real_dlsym; i++)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", vers[i]);
}

static int pace_started;
static pthread_mutex_t pace_start_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t prim_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned prim_refs[TL_MAX_DEVICES];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t prim_charge[TL_MAX_DEVICES]; /* charged for the primary context */
static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t graph_charged[TL_MAX_DEVICES]; /* charged for the driver's graph memory pool */
static int debug; /* TESSERA_LIMITER_DEBUG=1 */

/* Host pid discovery (tl_hostpid.h), one state per device; hp_mu guards
 * hp[] and is taken before any other lock of this file. */
static pthread_mutex_t hp_mu = PTHREAD_MUTEX_INITIALIZER;
static tl_hostpid hp[TL_MAX_DEVICES];
static int hp_probed[TL_MAX_DEVICES]; /* hp[d] has a `before` list */
static int32_t host_pid;              /* resolved, 0 = not yet */
static uint32_t nspid_outer;          /* from /proc/self/status, 0 = one level */
static int nspid_read;
static void hp_reset(void);

static void after_fork_child(void)
{
    /* The child owns no GPU memory and no contexts, has no slot yet and no
     * pacing thread (threads do not survive fork). Locks that another
     * parent thread held at fork time are re-initialised, not taken. */
    pthread_mutex_init(&reg_mu, NULL);
    pthread_mutex_init(&prim_mu, NULL);
    pthread_mutex_init(&pace_start_mu, NULL);
    pthread_mutex_init(&ctx_mu, NULL);
    pthread_mutex_init(&graph_mu, NULL);
    memset(prim_charge, 0, sizeof(prim_charge));
    memset(graph_charged, 0, sizeof(graph_charged));
    registered = 0;
    sh.slot = -1;
    pace_started = 0;
    memset(prim_refs, 0, sizeof(prim_refs));
    pthread_mutex_init(&hp_mu, NULL);
    hp_reset(); /* the child has another host pid and no context */
    tl_table_reset_after_fork();
}

/* The environment is read when the library is loaded, before the program
 * runs, so a program cannot raise its own limit with setenv(). Nothing is
 * printed or opened here: most processes never touch the GPU. */
__attribute__((constructor)) static void tl_load(void)
{
    tl_config_parse(&cfg, environ);
}

static void core_init(void)
{
    if (!real_dlsym)
        resolve_real_dlsym();
    if (cfg.error)
        fputs(cfg.errmsg, stderr);
    const char *dbg = getenv("TESSERA_LIMITER_DEBUG");
    debug = dbg && *dbg == '1';
    /* With only an SM limit the shared state is optional: it lets the
     * container's processes pace on their summed utilisation. */
    if (!cfg.error && (cfg.mem_active || cfg.sm_active) && tl_shared_open(&sh, cfg.state_path) != 0 &&
        cfg.mem_active)
        cfg.error = 1;
    pthread_atfork(NULL, NULL, after_fork_child);
}

static void cuda_init(void)
{
    pthread_once(&core_once, core_init);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "tessera-limiter: cannot load libcuda.so.1: %s\n", dlerror());
    } else if (real_dlsym) {
#define RESOLVE_CU(name, args) *(void **)&real_##name = real_dlsym(h, #name);
        CU_REAL_LIST(RESOLVE_CU)
        CU_AUX_LIST(RESOLVE_CU)
    }
    __atomic_store_n(&cuda_ready, 1, __ATOMIC_RELEASE);
}

static void nvml_init(void)
{
    pthread_once(&core_once, core_init); /* config + shared state */
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h && real_dlsym) {
#define RESOLVE_NVML(name, args) *(void **)&real_##name = real_dlsym(h, #name);
        NVML_REAL_LIST(RESOLVE_NVML)
    }
    __atomic_store_n(&nvml_ready, 1, __ATOMIC_RELEASE);
}

static inline void ensure_cuda(void)
{
    if (UNLIKELY(!__atomic_load_n(&cuda_ready, __ATOMIC_ACQUIRE)))
        pthread_once(&cuda_once, cuda_init);
}

static inline void ensure_nvml(void)
{
    if (UNLIKELY(!__atomic_load_n(&nvml_ready, __ATOMIC_ACQUIRE)))
        pthread_once(&nvml_once, nvml_init);
}

__attribute__((destructor)) static void tl_fini(void)
{
    if (registered && sh.st)
        tl_shared_unregister(&sh);
}

#define CALL_REAL(name, ...) (real_##name ? real_##name(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* ------------------------------------------------------------------ */
/* accounting helpers                                                  */

static int current_device(void)
{
    CUdevice d = 0;
    if (real_cuCtxGetDevice && real_cuCtxGetDevice(&d) == CUDA_SUCCESS)
        return d;
    return 0;
}

static inline uint64_t limit_of(int dev)
{
    if (dev < 0 || dev >= TL_MAX_DEVICES)
        return 1; /* unknown device while limits are on: fail closed */
    return cfg.mem_limit[dev];
}

static int ensure_registered(void)
{
    if (LIKELY(__atomic_load_n(&registered, __ATOMIC_ACQUIRE)))
        return 0;
    pthread_mutex_lock(&reg_mu);
    int r = 0;
    if (!registered) {
        r = tl_shared_register(&sh);
        if (r == 0) {
            tl_shared_publish_limits(&sh, cfg.mem_limit, cfg.sm_limit, TL_MAX_DEVICES);
            __atomic_store_n(&registered, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return r;
}

/* Reserve `bytes` on `dev`. Returns 1 if charged, 0 if the device is not
 * limited (nothing to track), -1 if it would exceed the limit. */
static int reserve(int dev, uint64_t bytes)
{
    uint64_t lim = limit_of(dev);
    if (!lim)
        return 0;
    if (dev < 0 || dev >= TL_MAX_DEVICES || ensure_registered() != 0)
        return -1;
    return tl_shared_reserve(&sh, dev, bytes, lim) == 0 ? 1 : -1;
}

static void release(int dev, uint64_t bytes)
{
    tl_shared_release(&sh, dev, bytes);
}

/* Record a successful allocation. If the table cannot grow (malloc
 * failure), undo the allocation and the charge: nothing goes untracked. */
static int track(int kind, uint64_t key, uint64_t bytes, int dev)
{
    if (tl_table_put(kind, key, bytes, dev) == 0)
        return 0;
    switch (kind) {
    case TL_K_PTR: CALL_REAL(cuMemFree_v2, (CUdeviceptr)key); break;
    case TL_K_HANDLE: CALL_REAL(cuMemRelease, key); break;
    case TL_K_ARRAY: CALL_REAL(cuArrayDestroy, (CUarray)(uintptr_t)key); break;
    case TL_K_MIPMAP: CALL_REAL(cuMipmappedArrayDestroy, (CUmipmappedArray)(uintptr_t)key); break;
    case TL_K_CTX: CALL_REAL(cuCtxDestroy_v2, (CUcontext)(uintptr_t)key); break;
    }
    release(dev, bytes);
    return -1;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* Bytes per channel element of a CUarray_format. Unknown (newer or block
 * compressed) formats are charged 4 bytes per channel. */
static uint64_t format_bytes(int f)
{
    switch (f) {
    case 0x01: case 0x08: return 1;             /* (un)signed int8 */
    case 0x02: case 0x09: case 0x10: return 2;  /* (un)signed int16, half */
    case 0x03: case 0x0a: case 0x20: return 4;  /* (un)signed int32, float */
    default: return 4;
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch)
{
    uint64_t b = sat_mul(w ? w : 1, h ? h : 1);
    b = sat_mul(b, d ? d : 1);
    b = sat_mul(b, ch ? ch : 1);
    return sat_mul(b, format_bytes(fmt));
}

static uint64_t mipmap_bytes(const TL_ARRAY3D_DESCRIPTOR *a, unsigned levels)
{
    uint64_t total = 0;
    size_t w = a->Width, h = a->Height, d = a->Depth;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t b = array_bytes(w, h, d, a->Format, a->NumChannels);
        total = total + b < total ? UINT64_MAX : total + b;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    return total;
}

/* Common shape of the simple allocators. `dev` is where it lands. */
#define ALLOC_BODY(kind, dev_expr, bytes_expr, outkey, call)                       \
    ensure_cuda();                                                                  \
    if (UNLIKELY(cfg.error))                                                        \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    if (!cfg.mem_active)                                                            \
        return call;                                                                \
    int dev_ = (dev_expr);                                                          \
    uint64_t bytes_ = (bytes_expr);                                                 \
    int charged_ = reserve(dev_, bytes_);                                           \
    if (charged_ < 0)                                                               \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    CUresult r_ = call;                                                             \
    if (charged_ > 0) {                                                             \
        if (r_ != CUDA_SUCCESS)                                                     \
            release(dev_, bytes_);                                                  \
        else if (track(kind, (uint64_t)(outkey), bytes_, dev_) != 0)                \
            r_ = CUDA_ERROR_OUT_OF_MEMORY;                                          \
    }                                                                               \
    return r_;

/* ------------------------------------------------------------------ */
/* memory allocation                                                   */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ALLOC_BODY(TL_K_PTR, current_device(), bytesize, *dptr, CALL_REAL(cuMemAlloc_v2, dptr, bytesize))
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ALLOC_BODY(TL_K_PTR, current_device(), bytesize, *dptr,
               CALL_REAL(cuMemAllocManaged, dptr, bytesize, flags))
}

/* During stream capture a stream-ordered allocation allocates nothing: it
 * records a memory-alloc node in the graph being captured, whose memory
 * is charged when the graph is instantiated and launched (graph memory,
 * below). Charging it here as well would count it twice. */
static int capturing(CUstream s, int ptsz)
{
    int st = TL_STREAM_CAPTURE_STATUS_NONE;
    CUresult (*f)(CUstream, int *) = ptsz ? real_cuStreamIsCapturing_ptsz : real_cuStreamIsCapturing;
    return f && f(s, &st) == CUDA_SUCCESS && st != TL_STREAM_CAPTURE_STATUS_NONE;
}

#define ASYNC_ALLOC_BODY(s, ptsz, call)                                            \
    ensure_cuda();                                                                  \
    if (cfg.mem_active && !cfg.error && capturing(s, ptsz))                         \
        return call;                                                                \
    ALLOC_BODY(TL_K_PTR, current_device(), bytesize, *dptr, call)

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    ASYNC_ALLOC_BODY(s, 0, CALL_REAL(cuMemAllocAsync, dptr, bytesize, s))
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    ASYNC_ALLOC_BODY(s, 1, CALL_REAL(cuMemAllocAsync_ptsz, dptr, bytesize, s))
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s)
{
    ASYNC_ALLOC_BODY(s, 0, CALL_REAL(cuMemAllocFromPoolAsync, dptr, bytesize, pool, s))
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s)
{
    ASYNC_ALLOC_BODY(s, 1, CALL_REAL(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, s))
}

EXPORT CUresult cuArrayCreate_v2(CUarray *ph, const TL_ARRAY_DESCRIPTOR *a)
{
    if (!a || !ph)
        return CALL_REAL(cuArrayCreate_v2, ph, a);
    ALLOC_BODY(TL_K_ARRAY, current_device(), array_bytes(a->Width, a->Height, 1, a->Format, a->NumChannels),
               (uintptr_t)*ph, CALL_REAL(cuArrayCreate_v2, ph, a))
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *ph, const TL_ARRAY3D_DESCRIPTOR *a)
{
    if (!a || !ph)
        return CALL_REAL(cuArray3DCreate_v2, ph, a);
    ALLOC_BODY(TL_K_ARRAY, current_device(), array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels),
               (uintptr_t)*ph, CALL_REAL(cuArray3DCreate_v2, ph, a))
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *ph, const TL_ARRAY3D_DESCRIPTOR *a, unsigned int levels)
{
    if (!a || !ph)
        return CALL_REAL(cuMipmappedArrayCreate, ph, a, levels);
    ALLOC_BODY(TL_K_MIPMAP, current_device(), mipmap_bytes(a, levels), (uintptr_t)*ph,
               CALL_REAL(cuMipmappedArrayCreate, ph, a, levels))
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const TL_MEM_ALLOCATION_PROP *prop, unsigned long long flags)
{
    /* Only device-resident physical memory counts (location type 1). */
    if (!prop || !handle || prop->location.type != 1) {
        ensure_cuda();
        return CALL_REAL(cuMemCreate, handle, size, prop, flags);
    }
    ALLOC_BODY(TL_K_HANDLE, prop->location.id, size, *handle,
               CALL_REAL(cuMemCreate, handle, size, prop, flags))
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!cfg.mem_active || !dptr || !pitch)
        return CALL_REAL(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    /* The pitch is only known afterwards: reserve the least it can be,
     * then charge the padding, undoing the allocation if that is over. */
    int dev = current_device();
    uint64_t want = sat_mul(width, height);
    int charged = reserve(dev, want);
    if (charged < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CALL_REAL(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    if (charged == 0)
        return r;
    if (r != CUDA_SUCCESS) {
        release(dev, want);
        return r;
    }
    uint64_t actual = sat_mul(*pitch, height);
    if (actual > want) {
        if (reserve(dev, actual - want) < 0) {
            CALL_REAL(cuMemFree_v2, *dptr);
            release(dev, want);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        want = actual;
    }
    if (track(TL_K_PTR, *dptr, want, dev) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return r;
}

/* ------------------------------------------------------------------ */
/* frees: forget the entry first (the address may be reused by another
 * thread as soon as the real free returns), put it back on failure.     */

#define FREE_BODY(kind, key, call)                                                 \
    ensure_cuda();                                                                 \
    if (!cfg.mem_active)                                                           \
        return call;                                                               \
    uint64_t size_;                                                                \
    int dev_;                                                                      \
    int had_ = tl_table_take(kind, (uint64_t)(key), &size_, &dev_);                \
    CUresult r_ = call;                                                            \
    if (had_) {                                                                    \
        if (r_ == CUDA_SUCCESS)                                                    \
            release(dev_, size_);                                                  \
        else                                                                       \
            tl_table_put(kind, (uint64_t)(key), size_, dev_);                      \
    }                                                                              \
    return r_;

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { FREE_BODY(TL_K_PTR, p, CALL_REAL(cuMemFree_v2, p)) }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { FREE_BODY(TL_K_PTR, p, CALL_REAL(cuMemFreeAsync, p, s)) }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    FREE_BODY(TL_K_PTR, p, CALL_REAL(cuMemFreeAsync_ptsz, p, s))
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { FREE_BODY(TL_K_HANDLE, h, CALL_REAL(cuMemRelease, h)) }
EXPORT CUresult cuArrayDestroy(CUarray a) { FREE_BODY(TL_K_ARRAY, (uintptr_t)a, CALL_REAL(cuArrayDestroy, a)) }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    FREE_BODY(TL_K_MIPMAP, (uintptr_t)a, CALL_REAL(cuMipmappedArrayDestroy, a))
}

/* ------------------------------------------------------------------ */
/* contexts                                                            */
/*
 * Each context (created, or primary while retained) is charged its own
 * device memory. TESSERA_CONTEXT_RESERVE fixes the amount (0 = off). By
 * default the first context this process creates or activates on a device
 * is measured: the drop in the device's free memory across the real call,
 * as NVML reports it (no driver call reports free memory before a context
 * exists), clamped to [CTX_MIN, CTX_MAX], or CTX_FALLBACK when NVML cannot
 * tell. Later contexts on that device are charged the same amount.
 */
#define CTX_MIN (32ull << 20)
#define CTX_MAX (2ull << 30)
#define CTX_FALLBACK (256ull << 20)

static uint64_t ctx_size[TL_MAX_DEVICES]; /* measured footprint, 0 = not yet */

typedef struct {
    int ver;
    CUcontext *pctx;
    void *params;
    int nparams;
    unsigned flags;
    CUdevice dev;
} ctx_args;

static pthread_once_t nvml_up_once = PTHREAD_ONCE_INIT;
static int nvml_ok;
static void nvml_up_init(void)
{
    ensure_nvml();
    nvml_ok = real_nvmlInit_v2 && real_nvmlInit_v2() == NVML_SUCCESS;
}

/* NVML initialised for the limiter's own queries; 0 if unavailable. */
static int nvml_up(void)
{
    pthread_once(&nvml_up_once, nvml_up_init);
    return nvml_ok;
}

/* Free memory of device `dev` per NVML. Called with ctx_mu held. */
static int device_free(int dev, uint64_t *out)
{
    nvmlDevice_t d;
    TL_NVML_MEMORY m;
    if (!nvml_up() || !real_nvmlDeviceGetHandleByIndex_v2 || !real_nvmlDeviceGetMemoryInfo ||
        real_nvmlDeviceGetHandleByIndex_v2((unsigned)dev, &d) != NVML_SUCCESS ||
        real_nvmlDeviceGetMemoryInfo(d, &m) != NVML_SUCCESS)
        return -1;
    *out = m.free;
    return 0;
}

/* ------------------------------------------------------------------ */
/* host pid                                                            */
/*
 * NVML names processes by their pid in the host's pid namespace; inside a
 * container getpid() differs. tl_hostpid.h has the method; here are its
 * inputs: the device's compute-process list around this process's first
 * context creation on a device (only where an SM limit needs it) and at
 * each sampling period until resolved, the host pids the container's other
 * processes published in the shared state, the memory this process has
 * accounted on the device, and NSpid. The result is published in our slot.
 */

/* Sizes of nvmlProcessInfo_v1_t {pid; usedGpuMemory} and of the struct of
 * the _v2/_v3 functions, which adds gpuInstanceId and computeInstanceId
 * (both: pid at 0, usedGpuMemory at 8). */
#define TL_PROCINFO_V1 16
#define TL_PROCINFO_V2 24
#define TL_PID_MAX 4194304u /* PID_MAX_LIMIT: larger pids mean a wrong layout */

/* The compute processes on NVML device `dev`: count, or -1. */
static int gpu_procs(int dev, tl_gpu_proc *out, int max)
{
    static unsigned char buf[TL_HP_MAX * 32]; /* callers hold hp_mu */
    nvmlDevice_t d;
    if (!nvml_up() || !real_nvmlDeviceGetHandleByIndex_v2 ||
        real_nvmlDeviceGetHandleByIndex_v2((unsigned)dev, &d) != NVML_SUCCESS)
        return -1;
    struct {
        nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, void *);
        size_t stride;
    } v[] = {{real_nvmlDeviceGetComputeRunningProcesses_v3, TL_PROCINFO_V2},
             {real_nvmlDeviceGetComputeRunningProcesses_v2, TL_PROCINFO_V2},
             {real_nvmlDeviceGetComputeRunningProcesses, TL_PROCINFO_V1}};
    for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) {
        if (!v[k].fn)
            continue;
        unsigned cnt = (unsigned)max;
        memset(buf, 0, sizeof(buf));
        nvmlReturn_t r = v[k].fn(d, &cnt, buf);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE)
            return -1; /* more processes than we consider */
        if (r != NVML_SUCCESS || cnt > (unsigned)max)
            continue;  /* not supported by this driver: an older version */
        int ok = 1;
        for (unsigned i = 0; i < cnt; i++) {
            uint32_t pid;
            uint64_t used;
            memcpy(&pid, buf + i * v[k].stride, sizeof(pid));
            memcpy(&used, buf + i * v[k].stride + 8, sizeof(used));
            if (pid == 0 || pid > TL_PID_MAX)
                ok = 0;
            out[i].pid = pid;
            out[i].used = used;
        }
        if (ok)
            return (int)cnt;
    }
    return -1;
}

static void hp_reset(void)
{
    for (int i = 0; i < TL_MAX_DEVICES; i++)
        tl_hp_init(&hp[i]);
    memset(hp_probed, 0, sizeof(hp_probed));
    host_pid = 0;
    nspid_read = 0;
}

static void read_nspid(void)
{
    char buf[4096];
    nspid_read = 1;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = 0;
    uint32_t p = tl_hp_parse_nspid(buf);
    nspid_outer = p != (uint32_t)getpid() ? p : 0;
}

/* With hp_mu held: one observation of device dev's process list. */
static void hp_step(int dev)
{
    static tl_gpu_proc list[TL_HP_MAX];
    int n = gpu_procs(dev, list, TL_HP_MAX);
    if (n < 0)
        return;
    uint32_t excl[64];
    int ne = 0;
    uint64_t known = 0;
    if (sh.st && ensure_registered() == 0) {
        int32_t hs[64];
        ne = tl_shared_host_pids(&sh, hs, 64, sh.slot);
        for (int i = 0; i < ne; i++)
            excl[i] = (uint32_t)hs[i];
        if (cfg.mem_active && sh.slot >= 0)
            known = __atomic_load_n(&sh.st->slots[sh.slot].used[dev], __ATOMIC_RELAXED);
    }
    int had = hp[dev].ncand;
    uint32_t r = tl_hp_observe(&hp[dev], list, n, excl, ne, nspid_outer, known);
    if (r) {
        __atomic_store_n(&host_pid, (int32_t)r, __ATOMIC_RELEASE);
        if (sh.st && ensure_registered() == 0)
            tl_shared_set_host_pid(&sh, (int32_t)r);
        if (debug)
            fprintf(stderr, "tessera-limiter: host pid %u (pid %d here), from %s on device %d\n", r, (int)getpid(),
                    hp[dev].how, dev);
        return;
    }
    if (!hp[dev].have_before)
        hp_probed[dev] = 0; /* wait for a new context creation */
    if (debug && hp[dev].ncand != had)
        fprintf(stderr, "tessera-limiter: device %d: host pid not resolved yet (%d candidates); "
                        "using whole-device utilisation meanwhile\n", dev, hp[dev].ncand < 0 ? 0 : hp[dev].ncand);
}

/* Around a call that may create this process's first context on dev:
 * returns 1 (hp_mu held, `before` read) if hp_ctx_end must follow. */
static int hp_ctx_begin(int dev)
{
    if (!cfg.sm_active || dev < 0 || dev >= TL_MAX_DEVICES || !cfg.sm_limit[dev] ||
        __atomic_load_n(&host_pid, __ATOMIC_ACQUIRE) || __atomic_load_n(&hp_probed[dev], __ATOMIC_ACQUIRE))
        return 0;
    static tl_gpu_proc list[TL_HP_MAX];
    pthread_mutex_lock(&hp_mu);
    if (!nspid_read)
        read_nspid();
    int n = hp_probed[dev] || host_pid ? -1 : gpu_procs(dev, list, TL_HP_MAX);
    if (n < 0) {
        pthread_mutex_unlock(&hp_mu);
        return 0;
    }
    tl_hp_before(&hp[dev], list, n);
    return 1;
}

static void hp_ctx_end(int dev, int began, CUresult r)
{
    if (!began)
        return;
    if (r == CUDA_SUCCESS) {
        __atomic_store_n(&hp_probed[dev], 1, __ATOMIC_RELEASE);
        hp_step(dev);
    } else {
        tl_hp_init(&hp[dev]);
    }
    pthread_mutex_unlock(&hp_mu);
}

/* Run `call`, which creates or activates a context on a.dev, with the
 * context's footprint charged (check-and-reserve when the size is known;
 * when it is being measured, charge afterwards and `undo` if over the
 * limit). *charged gets what was charged (0 when nothing is tracked). */
static CUresult with_ctx_charge(ctx_args *a, CUresult (*call)(ctx_args *), void (*undo)(ctx_args *),
                                uint64_t *charged)
{
    int dev = a->dev;
    *charged = 0;
    if (dev < 0 || dev >= TL_MAX_DEVICES || (cfg.ctx_reserve_set && !cfg.ctx_reserve))
        return call(a);
    uint64_t n = cfg.ctx_reserve_set ? cfg.ctx_reserve : __atomic_load_n(&ctx_size[dev], __ATOMIC_ACQUIRE);
    int measure = n == 0;
    if (measure) {
        if (!limit_of(dev))
            return call(a);
        pthread_mutex_lock(&ctx_mu);
        n = ctx_size[dev]; /* another thread may have measured meanwhile */
        measure = n == 0;
        if (!measure)
            pthread_mutex_unlock(&ctx_mu);
    }
    if (!measure) {
        int c = reserve(dev, n);
        if (c < 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult r = call(a);
        if (c > 0 && r != CUDA_SUCCESS)
            release(dev, n);
        else if (c > 0)
            *charged = n;
        return r;
    }
    uint64_t before = 0, after = 0;
    int ok = device_free(dev, &before) == 0;
    CUresult r = call(a);
    if (r == CUDA_SUCCESS) {
        ok = ok && device_free(dev, &after) == 0;
        n = !ok ? CTX_FALLBACK : before > after ? before - after : 0;
        n = n < CTX_MIN ? CTX_MIN : n > CTX_MAX ? CTX_MAX : n;
        __atomic_store_n(&ctx_size[dev], n, __ATOMIC_RELEASE);
        int c = reserve(dev, n);
        if (c < 0) {
            undo(a);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (c > 0) {
            *charged = n;
        }
    }
    pthread_mutex_unlock(&ctx_mu);
    return r;
}

static CUresult ctx_create_real(ctx_args *a)
{
    switch (a->ver) {
    case 3: return CALL_REAL(cuCtxCreate_v3, a->pctx, a->params, a->nparams, a->flags, a->dev);
    case 4: return CALL_REAL(cuCtxCreate_v4, a->pctx, a->params, a->flags, a->dev);
    default: return CALL_REAL(cuCtxCreate_v2, a->pctx, a->flags, a->dev);
    }
}

static void ctx_create_undo(ctx_args *a) { (void)CALL_REAL(cuCtxDestroy_v2, *a->pctx); }

static CUresult ctx_create_charged(ctx_args *a)
{
    if (!cfg.mem_active || !a->pctx)
        return ctx_create_real(a);
    uint64_t n;
    CUresult r = with_ctx_charge(a, ctx_create_real, ctx_create_undo, &n);
    if (r == CUDA_SUCCESS && n && track(TL_K_CTX, (uintptr_t)*a->pctx, n, a->dev) != 0)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    return r;
}

static CUresult ctx_create(ctx_args *a)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_OUT_OF_MEMORY;
    int hp_ = hp_ctx_begin(a->dev);
    CUresult r = ctx_create_charged(a);
    hp_ctx_end(a->dev, hp_, r);
    return r;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ctx_args a = {2, pctx, NULL, 0, flags, dev};
    return ctx_create(&a);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *affinity, int n, unsigned int flags, CUdevice dev)
{
    ctx_args a = {3, pctx, affinity, n, flags, dev};
    return ctx_create(&a);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
    ctx_args a = {4, pctx, params, 0, flags, dev};
    return ctx_create(&a);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { FREE_BODY(TL_K_CTX, (uintptr_t)ctx, CALL_REAL(cuCtxDestroy_v2, ctx)) }

static CUresult prim_retain_real(ctx_args *a) { return CALL_REAL(cuDevicePrimaryCtxRetain, a->pctx, a->dev); }
static void prim_retain_undo(ctx_args *a) { (void)CALL_REAL(cuDevicePrimaryCtxRelease_v2, a->dev); }

static CUresult primary_retain(CUcontext *pctx, CUdevice dev);

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_OUT_OF_MEMORY;
    int hp_ = hp_ctx_begin(dev);
    CUresult r = primary_retain(pctx, dev);
    hp_ctx_end(dev, hp_, r);
    return r;
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev)
{
    if (!cfg.mem_active || dev < 0 || dev >= TL_MAX_DEVICES || (cfg.ctx_reserve_set && !cfg.ctx_reserve))
        return CALL_REAL(cuDevicePrimaryCtxRetain, pctx, dev);
    ctx_args a = {0, pctx, NULL, 0, 0, dev};
    pthread_mutex_lock(&prim_mu);
    CUresult r;
    if (prim_refs[dev] == 0)
        r = with_ctx_charge(&a, prim_retain_real, prim_retain_undo, &prim_charge[dev]);
    else
        r = prim_retain_real(&a);
    if (r == CUDA_SUCCESS)
        prim_refs[dev]++;
    pthread_mutex_unlock(&prim_mu);
    return r;
}

static CUresult primary_drop(CUdevice dev, int all, CUresult r)
{
    if (r != CUDA_SUCCESS || !cfg.mem_active || dev < 0 || dev >= TL_MAX_DEVICES)
        return r;
    pthread_mutex_lock(&prim_mu);
    if (prim_refs[dev] > 0) {
        prim_refs[dev] = all ? 0 : prim_refs[dev] - 1;
        if (prim_refs[dev] == 0 && prim_charge[dev]) {
            release(dev, prim_charge[dev]);
            prim_charge[dev] = 0;
        }
    }
    pthread_mutex_unlock(&prim_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ensure_cuda();
    return primary_drop(dev, 0, CALL_REAL(cuDevicePrimaryCtxRelease_v2, dev));
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ensure_cuda();
    return primary_drop(dev, 1, CALL_REAL(cuDevicePrimaryCtxReset_v2, dev));
}

/* ------------------------------------------------------------------ */
/* graph memory                                                        */
/*
 * Memory-alloc nodes (cuGraphAddMemAllocNode, cuGraphAddNode, stream
 * capture of cuMemAllocAsync) get physical memory from the driver's
 * per-device graph pool when an exec is first launched or uploaded
 * (or instantiated with the upload flag), and the pool keeps it until
 * cuDeviceGraphMemTrim. The process's charge on a device follows the
 * pool's reservation (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), re-read
 * after every call that can change it. Before an exec's first launch the
 * growth it can cause (its alloc nodes' bytes minus the pool's unused
 * part) is reserved, and the launch refused if that does not fit.
 *
 * Execs with alloc nodes are in the table (TL_K_GEXEC) with their bytes;
 * `dev` holds the device in its low 8 bits and, once launched, the device's
 * trim generation + 1 above them: after a trim the driver may remap on the
 * next launch, so that launch re-reads the pool.
 */
static unsigned trim_gen[TL_MAX_DEVICES];

static int gexec_tag(int dev)
{
    return dev | (int)(((__atomic_load_n(&trim_gen[dev], __ATOMIC_RELAXED) + 1) & 0x7fffff) << 8);
}

static int pool_attr(int dev, int attr, uint64_t *out)
{
    unsigned long long v = 0;
    if (!real_cuDeviceGetGraphMemAttribute || real_cuDeviceGetGraphMemAttribute(dev, attr, &v) != CUDA_SUCCESS)
        return -1;
    *out = v;
    return 0;
}

/* Bytes of the alloc nodes of g and its child graphs; *dev is set to the
 * device of the first one found. */
static uint64_t graph_alloc_bytes(CUgraph g, int *dev, int depth)
{
    size_t n = 0;
    if (depth > 8 || !real_cuGraphGetNodes || !real_cuGraphNodeGetType || !real_cuGraphMemAllocNodeGetParams ||
        !real_cuGraphChildGraphNodeGetGraph || real_cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
        return 0;
    CUgraphNode *nodes = calloc(n, sizeof(*nodes));
    uint64_t total = 0;
    if (nodes && real_cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            int t;
            TL_MEM_ALLOC_NODE_PARAMS p;
            CUgraph child;
            uint64_t b = 0;
            if (real_cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS)
                continue;
            if (t == TL_GRAPH_NODE_TYPE_MEM_ALLOC && real_cuGraphMemAllocNodeGetParams(nodes[i], &p) == CUDA_SUCCESS) {
                if (*dev < 0)
                    *dev = p.poolProps.location.id;
                b = p.bytesize;
            } else if (t == TL_GRAPH_NODE_TYPE_GRAPH &&
                       real_cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS) {
                b = graph_alloc_bytes(child, dev, depth + 1);
            }
            total = total + b < total ? UINT64_MAX : total + b;
        }
    }
    free(nodes);
    return total;
}

/* With graph_mu held: reserve the growth of dev's pool that `bytes` of
 * not-yet-backed allocations can cause, into *pre. Returns 0, or -1 if it
 * does not fit. */
static int graph_prereserve(int dev, uint64_t bytes, uint64_t *pre)
{
    uint64_t res = 0, used = 0;
    if (pool_attr(dev, TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res) != 0 ||
        pool_attr(dev, TL_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) != 0)
        res = used = 0; /* unknown: assume nothing idle */
    uint64_t idle = res > used ? res - used : 0;
    *pre = bytes > idle ? bytes - idle : 0;
    return *pre && reserve(dev, *pre) < 0 ? -1 : 0;
}

/* With graph_mu held: set the charge on dev to the pool's reservation,
 * using the `pre` bytes reserved beforehand first. Growth that does not
 * fit is charged anyway (the driver already holds the memory); returns -1
 * then. If the pool cannot be read, `pre` stays charged. */
static int graph_sync(int dev, uint64_t pre)
{
    uint64_t r, c = graph_charged[dev];
    int over = 0;
    if (pool_attr(dev, TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &r) != 0) {
        graph_charged[dev] = c + pre;
        return 0;
    }
    if (r > c) {
        uint64_t d = r - c, use = d < pre ? d : pre;
        pre -= use;
        d -= use;
        if (d && reserve(dev, d) < 0) {
            tl_shared_reserve(&sh, dev, d, UINT64_MAX);
            over = 1;
        }
    } else if (c > r) {
        release(dev, c - r);
    }
    graph_charged[dev] = r;
    if (pre)
        release(dev, pre);
    return over ? -1 : 0;
}

/* Before a launch or upload of an exec with alloc nodes (tag from the
 * table). Returns 0: go, nothing to account (backed, no trim since);
 * 1: go, graph_mu is held, call graph_run_end after; -1: refused. */
static int graph_run_begin(int dev, int tag, uint64_t bytes, uint64_t *pre)
{
    *pre = 0;
    if (tag == gexec_tag(dev))
        return 0;
    pthread_mutex_lock(&graph_mu);
    if ((tag >> 8) == 0 && graph_prereserve(dev, bytes, pre) < 0) {
        pthread_mutex_unlock(&graph_mu);
        return -1;
    }
    return 1;
}

/* A launch cannot be undone: growth over the limit stays charged. */
static void graph_run_end(CUgraphExec e, int dev, uint64_t bytes, uint64_t pre, CUresult r)
{
    graph_sync(dev, pre);
    if (r == CUDA_SUCCESS)
        tl_table_put(TL_K_GEXEC, (uintptr_t)e, bytes, gexec_tag(dev));
    pthread_mutex_unlock(&graph_mu);
}

#define GRAPH_RUN_BODY(e, call)                                                    \
    uint64_t bytes_, pre_;                                                          \
    int tag_;                                                                       \
    if (!cfg.mem_active || !tl_table_get(TL_K_GEXEC, (uintptr_t)(e), &bytes_, &tag_)) \
        return call;                                                                \
    int go_ = graph_run_begin(tag_ & 0xff, tag_, bytes_, &pre_);                    \
    if (go_ < 0)                                                                    \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    CUresult r_ = call;                                                             \
    if (go_ > 0)                                                                    \
        graph_run_end(e, tag_ & 0xff, bytes_, pre_, r_);                            \
    return r_;

/* After the real instantiate, with graph_mu held (released here): record
 * the exec; with the upload flag the pool was filled already, so re-read it
 * and undo the instantiation if that went over the limit. */
static CUresult graph_instantiated(CUgraphExec *pe, int dev, uint64_t bytes, int upload, uint64_t pre, CUresult r)
{
    if (r == CUDA_SUCCESS && tl_table_put(TL_K_GEXEC, (uintptr_t)*pe, bytes, upload ? gexec_tag(dev) : dev) != 0) {
        (void)CALL_REAL(cuGraphExecDestroy, *pe);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (graph_sync(dev, pre) != 0 && r == CUDA_SUCCESS && upload) {
        uint64_t b;
        int t;
        tl_table_take(TL_K_GEXEC, (uintptr_t)*pe, &b, &t);
        (void)CALL_REAL(cuGraphExecDestroy, *pe);
        (void)CALL_REAL(cuDeviceGraphMemTrim, dev);
        graph_sync(dev, 0);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&graph_mu);
    return r;
}

/* Instantiation: execs whose graph has alloc nodes are recorded; with the
 * upload flag the pool grows now, so the growth is reserved first. */
#define INSTANTIATE_BODY(pe, g, flags, call)                                       \
    ensure_cuda();                                                                  \
    if (UNLIKELY(cfg.error))                                                        \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    int dev_ = -1, up_ = ((flags) & TL_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0;         \
    uint64_t pre_ = 0, bytes_ = cfg.mem_active && (pe) ? graph_alloc_bytes(g, &dev_, 0) : 0; \
    if (!bytes_ || dev_ < 0 || dev_ >= TL_MAX_DEVICES || !limit_of(dev_))           \
        return call;                                                                \
    pthread_mutex_lock(&graph_mu);                                                  \
    if (up_ && graph_prereserve(dev_, bytes_, &pre_) < 0) {                         \
        pthread_mutex_unlock(&graph_mu);                                            \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    }                                                                               \
    return graph_instantiated(pe, dev_, bytes_, up_, pre_, call);

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    INSTANTIATE_BODY(pe, g, flags, CALL_REAL(cuGraphInstantiateWithFlags, pe, g, flags))
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g, TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    INSTANTIATE_BODY(pe, g, p ? p->flags : 0, CALL_REAL(cuGraphInstantiateWithParams, pe, g, p))
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g, TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    INSTANTIATE_BODY(pe, g, p ? p->flags : 0, CALL_REAL(cuGraphInstantiateWithParams_ptsz, pe, g, p))
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    INSTANTIATE_BODY(pe, g, 0, CALL_REAL(cuGraphInstantiate_v2, pe, g, err, log, n))
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
    ensure_cuda();
    GRAPH_RUN_BODY(e, CALL_REAL(cuGraphUpload, e, s))
}

EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s)
{
    ensure_cuda();
    GRAPH_RUN_BODY(e, CALL_REAL(cuGraphUpload_ptsz, e, s))
}

/* The pool keeps a destroyed exec's memory (until a trim): nothing to
 * re-read, only forget the exec. */
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    ensure_cuda();
    if (!cfg.mem_active)
        return CALL_REAL(cuGraphExecDestroy, e);
    uint64_t b;
    int t;
    int had = tl_table_take(TL_K_GEXEC, (uintptr_t)e, &b, &t);
    CUresult r = CALL_REAL(cuGraphExecDestroy, e);
    if (had && r != CUDA_SUCCESS)
        tl_table_put(TL_K_GEXEC, (uintptr_t)e, b, t);
    return r;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuDeviceGraphMemTrim, dev);
    if (r == CUDA_SUCCESS && cfg.mem_active && dev >= 0 && dev < TL_MAX_DEVICES && limit_of(dev)) {
        pthread_mutex_lock(&graph_mu);
        __atomic_add_fetch(&trim_gen[dev], 1, __ATOMIC_RELAXED);
        graph_sync(dev, 0);
        pthread_mutex_unlock(&graph_mu);
    }
    return r;
}

/* ------------------------------------------------------------------ */
/* reporting                                                           */

EXPORT CUresult cuInit(unsigned int flags)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_NOT_INITIALIZED;
    return CALL_REAL(cuInit, flags);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuMemGetInfo_v2, free_b, total_b);
    if (r != CUDA_SUCCESS || !cfg.mem_active || !free_b || !total_b)
        return r;
    int dev = current_device();
    uint64_t lim = limit_of(dev);
    if (!lim || dev >= TL_MAX_DEVICES)
        return r;
    tl_shared_maybe_reclaim(&sh, 1000000000ull);
    uint64_t used = tl_shared_used(&sh, dev);
    uint64_t total = lim < *total_b ? lim : *total_b;
    uint64_t free_ = used < total ? total - used : 0;
    if (free_ > *free_b)
        free_ = *free_b;
    *total_b = total;
    *free_b = free_;
    return r;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuDeviceTotalMem_v2, bytes, dev);
    if (r == CUDA_SUCCESS && cfg.mem_active && bytes && dev >= 0 && dev < TL_MAX_DEVICES &&
        cfg.mem_limit[dev] && cfg.mem_limit[dev] < *bytes)
        *bytes = cfg.mem_limit[dev];
    return r;
}

/* NVML: total = limit, used = container usage, free = total - used >= 0. */
static void nvml_adjust(nvmlDevice_t d, unsigned long long *total, unsigned long long *freep,
                        unsigned long long *used)
{
    unsigned idx;
    if (!cfg.mem_active || !real_nvmlDeviceGetIndex || real_nvmlDeviceGetIndex(d, &idx) != NVML_SUCCESS ||
        idx >= TL_MAX_DEVICES || !cfg.mem_limit[idx])
        return;
    uint64_t lim = cfg.mem_limit[idx];
    uint64_t t = lim < *total ? lim : *total;
    tl_shared_maybe_reclaim(&sh, 1000000000ull);
    uint64_t u = tl_shared_used(&sh, (int)idx);
    *total = t;
    *used = u;
    *freep = u < t ? t - u : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, TL_NVML_MEMORY *m)
{
    ensure_nvml();
    if (!real_nvmlDeviceGetMemoryInfo)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = real_nvmlDeviceGetMemoryInfo(d, m);
    if (r == NVML_SUCCESS && m)
        nvml_adjust(d, &m->total, &m->free, &m->used);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, TL_NVML_MEMORY_V2 *m)
{
    ensure_nvml();
    if (!real_nvmlDeviceGetMemoryInfo_v2)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = real_nvmlDeviceGetMemoryInfo_v2(d, m);
    if (r == NVML_SUCCESS && m) {
        nvml_adjust(d, &m->total, &m->free, &m->used);
        if (m->reserved > m->total)
            m->reserved = 0;
    }
    return r;
}

/* ------------------------------------------------------------------ */
/* compute pacing                                                      */

#define PACE_PERIOD_NS 100000000ll

typedef struct {
    pthread_mutex_t mu;
    tl_pacer pacer;
    tl_bucket bucket;
    double used;      /* tokens consumed since the last control step */
    int throttled;    /* a launch waited since the last control step */
} dev_pace;

static dev_pace pace[TL_MAX_DEVICES];

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Container SM utilisation on NVML device `d` from per-process samples
 * newer than *last_ts. Once this process's host pid is known, the samples
 * counted are those of the host pids the container's processes published
 * in the shared state (ours included); before that, of the pids registered
 * there and getpid() (right when the container shares the host's pid
 * namespace). Returns -1 if NVML gave no sample for them. */
static double container_util(nvmlDevice_t d, unsigned long long *last_ts)
{
    unsigned n = 0;
    if (!real_nvmlDeviceGetProcessUtilization)
        return -1;
    nvmlReturn_t r = real_nvmlDeviceGetProcessUtilization(d, NULL, &n, *last_ts);
    if (r != NVML_ERROR_INSUFFICIENT_SIZE && r != NVML_SUCCESS)
        return -1;
    if (n == 0)
        return -1;
    n += 8;
    TL_NVML_PROC_UTIL_SAMPLE *s = calloc(n, sizeof(*s));
    if (!s)
        return -1;
    r = real_nvmlDeviceGetProcessUtilization(d, s, &n, *last_ts);
    int32_t pids[64];
    int np = 0;
    int32_t self = __atomic_load_n(&host_pid, __ATOMIC_ACQUIRE);
    if (self) {
        pids[np++] = self;
        if (sh.st && sh.slot >= 0)
            np += tl_shared_host_pids(&sh, pids + np, 63, sh.slot);
    } else {
        if (sh.st)
            np = tl_shared_pids(&sh, pids, 63);
        pids[np++] = getpid();
    }
    /* NVML may return several samples per process: use each pid's latest. */
    unsigned long long best_ts[64] = {0};
    unsigned best_util[64] = {0};
    int have[64] = {0};
    double sum = 0;
    int seen = 0;
    unsigned long long newest = *last_ts;
    if (r == NVML_SUCCESS) {
        for (unsigned i = 0; i < n; i++) {
            if (s[i].timeStamp > newest)
                newest = s[i].timeStamp;
            for (int k = 0; k < np; k++)
                if ((unsigned)pids[k] == s[i].pid) {
                    if (!have[k] || s[i].timeStamp >= best_ts[k]) {
                        best_ts[k] = s[i].timeStamp;
                        best_util[k] = s[i].smUtil;
                    }
                    have[k] = 1;
                    break;
                }
        }
        for (int k = 0; k < np; k++)
            if (have[k]) {
                sum += best_util[k];
                seen++;
            }
    }
    free(s);
    *last_ts = newest;
    if (seen || self)
        return seen ? sum : -1; /* host pid known: no sample of ours is no news */
    /* Host pid not resolved yet (tl_hostpid.h) and no pid matches: fall
     * back to whole-device utilisation: exact when the container is alone
     * on the GPU, conservative (less than its share) next to busy
     * neighbours. */
    TL_NVML_UTILIZATION ur;
    if (r == NVML_SUCCESS && n > 0 && real_nvmlDeviceGetUtilizationRates &&
        real_nvmlDeviceGetUtilizationRates(d, &ur) == NVML_SUCCESS)
        return ur.gpu;
    return -1;
}

static void *pace_thread(void *arg)
{
    (void)arg;
    nvmlDevice_t devs[TL_MAX_DEVICES] = {0};
    unsigned long long last_ts[TL_MAX_DEVICES] = {0};
    unsigned no_sample[TL_MAX_DEVICES] = {0};
    int have_nvml = real_nvmlInit_v2 && real_nvmlInit_v2() == NVML_SUCCESS;
    if (!have_nvml)
        fprintf(stderr, "tessera-limiter: NVML unavailable; CUDA_DEVICE_SM_LIMIT cannot be measured "
                        "and launches are paced at the initial rate only\n");
    for (int i = 0; have_nvml && i < TL_MAX_DEVICES; i++)
        if (cfg.sm_limit[i] && real_nvmlDeviceGetHandleByIndex_v2)
            real_nvmlDeviceGetHandleByIndex_v2((unsigned)i, &devs[i]);
    double last = mono_s();
    for (;;) {
        struct timespec ts = {0, PACE_PERIOD_NS};
        nanosleep(&ts, NULL);
        double now = mono_s(), dt = now - last;
        last = now;
        if (sh.st)
            tl_shared_maybe_reclaim(&sh, 1000000000ull); /* stale host pids */
        for (int i = 0; i < TL_MAX_DEVICES; i++) {
            if (!cfg.sm_limit[i] || !devs[i])
                continue;
            if (!__atomic_load_n(&host_pid, __ATOMIC_ACQUIRE) && __atomic_load_n(&hp_probed[i], __ATOMIC_ACQUIRE)) {
                pthread_mutex_lock(&hp_mu);
                if (!host_pid && hp_probed[i])
                    hp_step(i);
                pthread_mutex_unlock(&hp_mu);
            }
            double u = container_util(devs[i], &last_ts[i]);
            double others = 0;
            TL_NVML_UTILIZATION ur;
            if (cfg.elastic && real_nvmlDeviceGetUtilizationRates &&
                real_nvmlDeviceGetUtilizationRates(devs[i], &ur) == NVML_SUCCESS)
                others = (double)ur.gpu - (u > 0 ? u : 0);
            dev_pace *p = &pace[i];
            pthread_mutex_lock(&p->mu);
            double used_rate = dt > 0 ? p->used / dt : 0;
            int thr = p->throttled;
            p->used = 0;
            p->throttled = 0;
            /* No launches, or no new NVML sample (its sampling period can be
             * longer than ours): nothing to learn, hold the rate. A missing
             * sample must not read as 0 % or the rate would run away. */
            if ((used_rate > 0 || thr) && u >= 0) {
                double target = tl_pacer_effective_target(cfg.sm_limit[i], others < 0 ? 0 : others, cfg.elastic);
                tl_pacer_step(&p->pacer, target, u, used_rate, thr);
                no_sample[i] = 0;
            } else if (used_rate > 0 && u < 0 && ++no_sample[i] == 50) {
                fprintf(stderr, "tessera-limiter: device %d: NVML gave no utilisation sample for 5 s while "
                                "kernels ran; the SM limit is not being adjusted\n", i);
            }
            if (debug)
                fprintf(stderr, "tessera-limiter: dev %d util %.1f used %.0f/s throttled %d -> rate %.0f/s\n", i,
                        u, used_rate, thr, p->pacer.rate);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

static void pace_start(void)
{
    pthread_mutex_lock(&pace_start_mu);
    if (!pace_started) {
        ensure_nvml();
        for (int i = 0; i < TL_MAX_DEVICES; i++) {
            pthread_mutex_init(&pace[i].mu, NULL);
            tl_pacer_init(&pace[i].pacer, 1e6, 10.0, 1e12);
            pace[i].bucket.burst = 0.1; /* at most 100 ms of saved tokens */
        }
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, pace_thread, NULL) != 0)
            fprintf(stderr, "tessera-limiter: cannot start pacing thread\n");
        pthread_attr_destroy(&a);
        __atomic_store_n(&pace_started, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&pace_start_mu);
}

static void pace_launch(double cost)
{
    int dev = current_device();
    if (dev < 0 || dev >= TL_MAX_DEVICES || !cfg.sm_limit[dev])
        return;
    if (UNLIKELY(!__atomic_load_n(&pace_started, __ATOMIC_ACQUIRE)))
        pace_start();
    dev_pace *p = &pace[dev];
    pthread_mutex_lock(&p->mu);
    for (;;) {
        double w = tl_bucket_take(&p->bucket, p->pacer.rate, mono_s(), cost);
        if (w == 0)
            break;
        p->throttled = 1;
        pthread_mutex_unlock(&p->mu);
        if (w > 0.01)
            w = 0.01;
        struct timespec ts = {0, (long)(w * 1e9) + 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&p->mu);
    }
    p->used += cost;
    pthread_mutex_unlock(&p->mu);
}

static inline double blocks(unsigned x, unsigned y, unsigned z)
{
    return (double)(x ? x : 1) * (double)(y ? y : 1) * (double)(z ? z : 1);
}

#define PACE(cost)                          \
    ensure_cuda();                          \
    if (UNLIKELY(cfg.sm_active))            \
        pace_launch(cost);

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{
    PACE(blocks(gx, gy, gz))
    return CALL_REAL(cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                    void **extra)
{
    PACE(blocks(gx, gy, gz))
    return CALL_REAL(cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

EXPORT CUresult cuLaunchKernelEx(const TL_LAUNCH_CONFIG *c, CUfunction f, void **params, void **extra)
{
    PACE(c ? blocks(c->gridDimX, c->gridDimY, c->gridDimZ) : 1)
    return CALL_REAL(cuLaunchKernelEx, c, f, params, extra);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const TL_LAUNCH_CONFIG *c, CUfunction f, void **params, void **extra)
{
    PACE(c ? blocks(c->gridDimX, c->gridDimY, c->gridDimZ) : 1)
    return CALL_REAL(cuLaunchKernelEx_ptsz, c, f, params, extra);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params)
{
    PACE(blocks(gx, gy, gz))
    return CALL_REAL(cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shm, s, params);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                                               void **params)
{
    PACE(blocks(gx, gy, gz))
    return CALL_REAL(cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params);
}

/* A graph's work is unknown here; it is charged one token. */
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    PACE(1)
    GRAPH_RUN_BODY(g, CALL_REAL(cuGraphLaunch, g, s))
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    PACE(1)
    GRAPH_RUN_BODY(g, CALL_REAL(cuGraphLaunch_ptsz, g, s))
}

/* ------------------------------------------------------------------ */
/* entry-point lookup                                                  */

typedef struct {
    const char *name;
    void *wrapper;
    void **real; /* NULL for NVML entries resolved separately */
} hook;

#define HOOK_CU(name, args) {#name, (void *)name, (void **)&real_##name},
static const hook cu_hooks[] = {
    CU_REAL_LIST(HOOK_CU)
};
static const hook nvml_hooks[] = {
    {"nvmlDeviceGetMemoryInfo", (void *)nvmlDeviceGetMemoryInfo, NULL},
    {"nvmlDeviceGetMemoryInfo_v2", (void *)nvmlDeviceGetMemoryInfo_v2, NULL},
};

static void *wrapper_by_name(const char *name)
{
    if (name[0] != 'c' && name[0] != 'n')
        return NULL;
    for (size_t i = 0; i < sizeof(cu_hooks) / sizeof(cu_hooks[0]); i++)
        if (!strcmp(cu_hooks[i].name, name))
            return cu_hooks[i].wrapper;
    for (size_t i = 0; i < sizeof(nvml_hooks) / sizeof(nvml_hooks[0]); i++)
        if (!strcmp(nvml_hooks[i].name, name))
            return nvml_hooks[i].wrapper;
    return NULL;
}

/* Map a real driver address to our wrapper, if we intercept it. */
static void *wrapper_by_real(void *p)
{
    for (size_t i = 0; i < sizeof(cu_hooks) / sizeof(cu_hooks[0]); i++)
        if (*cu_hooks[i].real == p)
            return cu_hooks[i].wrapper;
    return NULL;
}

/* Fallback by name, for a driver whose cuGetProcAddress hands out addresses
 * other than its exported symbols. Only names whose versioned variant is
 * certain for any cudart >= 11 are listed; cuCtxCreate (v2/v3/v4 depending
 * on the version asked for), cuGraphInstantiate (v2 or WithFlags) and
 * cuGetProcAddress itself are not. */
static const char *const ptsz_names[] = {
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
    "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuGraphUpload", "cuGraphInstantiateWithParams",
};
static const char *const v2_names[] = {
    "cuMemAlloc", "cuMemAllocPitch", "cuMemFree", "cuMemGetInfo", "cuDeviceTotalMem", "cuArrayCreate",
    "cuArray3DCreate", "cuCtxDestroy", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset",
};
static const char *const plain_names[] = {
    "cuInit", "cuMemAllocManaged", "cuMemCreate", "cuMemRelease", "cuArrayDestroy", "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy", "cuDevicePrimaryCtxRetain", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
    "cuGraphUpload", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphExecDestroy",
    "cuDeviceGraphMemTrim",
};

static int listed(const char *const *list, size_t n, const char *sym)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], sym))
            return 1;
    return 0;
}
#define LISTED(list, sym) listed(list, sizeof(list) / sizeof(list[0]), sym)

static void *wrapper_by_base_name(const char *sym, int ver, unsigned long long flags)
{
    char n[96];
    if (!sym || strlen(sym) > 80 || ver < 11000)
        return NULL;
    if ((flags & TL_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && LISTED(ptsz_names, sym))
        snprintf(n, sizeof(n), "%s_ptsz", sym);
    else if (LISTED(v2_names, sym))
        snprintf(n, sizeof(n), "%s_v2", sym);
    else if (LISTED(plain_names, sym))
        snprintf(n, sizeof(n), "%s", sym);
    else
        return NULL;
    return wrapper_by_name(n);
}

static void swap_in_wrapper(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    void *w = wrapper_by_real(*pfn);
    if (!w) {
        w = wrapper_by_base_name(sym, ver, flags);
        /* leave our own wrappers (asked for twice) alone */
        Dl_info self, got;
        if (w && dladdr(w, &self) && dladdr(*pfn, &got) && self.dli_fbase == got.dli_fbase)
            w = NULL;
    }
    if (w)
        *pfn = w;
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuGetProcAddress, sym, pfn, ver, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        swap_in_wrapper(sym, pfn, ver, flags);
    return r;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuGetProcAddress_v2, sym, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        swap_in_wrapper(sym, pfn, ver, flags);
    return r;
}

/* Applications (and cudart) often dlopen libcuda / libnvidia-ml and look
 * functions up by handle, which would bypass a preloaded library. For the
 * names we intercept, hand out our wrapper when the library behind the
 * handle really defines the name. RTLD_DEFAULT/RTLD_NEXT are passed through
 * untouched; the tail call keeps the caller's return address so glibc
 * resolves RTLD_NEXT relative to the real caller. */
EXPORT NO_SANITIZE void *dlsym(void *handle, const char *name)
{
    if (UNLIKELY(!real_dlsym))
        resolve_real_dlsym();
    if (handle != RTLD_DEFAULT && handle != RTLD_NEXT) {
        void *w = wrapper_by_name(name);
        if (w && real_dlsym(handle, name))
            return w;
    }
    return real_dlsym(handle, name);
}
