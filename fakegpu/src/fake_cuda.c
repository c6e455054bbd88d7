/*
 * fake_cuda.c - a stand-in libcuda.so.1 for CI: no GPU, no kernel driver.
 * Devices, their UUIDs and sizes come from fake_common.h (FAKE_GPUS, or
 * FAKE_GPU_COUNT x FAKE_GPU_MEM). It hands out fake addresses and keeps the
 * physical device memory this process holds per device, so cuMemGetInfo
 * and the fake NVML answer like a real driver; launched work runs on the
 * simulated GPU of fake_gpu.c.
 *
 * Memory that takes device memory, as in a real driver:
 *   allocations, arrays, managed memory       at the call
 *   contexts (created, primary while retained) FAKE_CTX_MEM bytes each
 *   context growth                            FAKE_CTX_GROWTH at its first launch
 *   cuCtxSetLimit: malloc heap                at the next launch in the context
 *                  stack size                 (new - old) x SMs x 2048 threads, at once
 *                  printf FIFO                at once
 *   modules (cuModuleLoadData)                FAKE_MODULE_MEM bytes of globals
 *   stream-ordered pools                      what the pool reserves: it grows in
 *                                             FAKE_POOL_GRANULE steps, keeps freed memory
 *                                             up to its release threshold and gives the
 *                                             rest back at synchronisation or cuMemPoolTrimTo
 *   VMM (cuMemCreate, device location)        until the last mapping is unmapped and
 *                                             every handle (create, retain, import) released
 *   graphs                                    see fake_graph.c
 * Host-located cuMemCreate takes no device memory and its location id is
 * never read.
 */
#include "fake.h"

pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
int fake_inited;

#define MAXALLOC 65536
static unsigned long long used[FAKE_MAXDEV];
static unsigned long long next_addr = 0x700000000000ull;
enum { K_PTR = 1, K_ARRAY = 3, K_MIPMAP = 4, K_POOL = 5, K_V1 = 6 };
static struct {
    unsigned long long key, size;
    int dev, kind;
    void *pool;
} allocs[MAXALLOC];
static unsigned long long ctx_mem_bytes, growth_bytes, module_bytes, pool_granule;

/* exported for tests: the most device-0 memory ever held at once */
FAKE_EXPORT unsigned long long fake_peak_used;

FAKE_EXPORT unsigned long long fake_used_bytes(int dev)
{
    return dev >= 0 && dev < FAKE_MAXDEV ? __atomic_load_n(&used[dev], __ATOMIC_RELAXED) : 0;
}

static void publish(int dev)
{
    struct fake_slot *me = fake_slot_self(dev);
    if (me)
        __atomic_store_n(&me->used, used[dev], __ATOMIC_RELAXED);
}

/* With fake_mu held. A GPU's memory is what every process on it shares:
 * with a state file, the check and the take happen under its lock. */
int fake_mem_take(int dev, unsigned long long n)
{
    const fake_gpu *g = fake_gpu_of(dev);
    if (!g)
        return -1;
    fake_state_lock(dev);
    unsigned long long others = fake_others_used(dev), held = used[dev] + others;
    int ok = held <= g->mem && n <= g->mem - held;
    /* the hard limit of this process's cgroup, where the driver
     * partitions the GPU's memory (fake_limits.h) */
    if (fake_limits_admit(dev, used[dev], n, ok) != 0)
        ok = 0;
    if (ok) {
        used[dev] += n;
        if (dev == 0 && used[0] > fake_peak_used)
            fake_peak_used = used[0];
        publish(dev);
    }
    fake_state_unlock(dev);
    return ok ? 0 : -1;
}

void fake_mem_give(int dev, unsigned long long n)
{
    if (dev < 0 || dev >= FAKE_MAXDEV)
        return;
    used[dev] = used[dev] >= n ? used[dev] - n : 0;
    publish(dev);
}

/* Take this process's slot on dev's state file (a context there). */
static void proc_register(int dev)
{
    pthread_mutex_lock(&fake_mu);
    unsigned long long u = used[dev];
    pthread_mutex_unlock(&fake_mu);
    fake_state_register(dev, u);
    pthread_mutex_lock(&fake_mu);
    publish(dev); /* what changed meanwhile */
    pthread_mutex_unlock(&fake_mu);
}

static unsigned long long env_size(const char *n)
{
    const char *v = getenv(n);
    return v ? fake_parse_size(v, NULL) : 0;
}

FAKE_EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&fake_mu);
    if (!fake_inited) {
        fake_devs_init();
        ctx_mem_bytes = env_size("FAKE_CTX_MEM");
        growth_bytes = env_size("FAKE_CTX_GROWTH");
        module_bytes = env_size("FAKE_MODULE_MEM");
        pool_granule = env_size("FAKE_POOL_GRANULE");
        fake_inited = 1;
    }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = FAKE_CUDA_VERSION;
    return CUDA_SUCCESS;
}

/* ---- devices ---- */

static int valid_dev(CUdevice d) { return d >= 0 && d < fake_ndev(); }

FAKE_EXPORT CUresult cuDeviceGet(CUdevice *d, int ord)
{
    NEED_INIT();
    if (!d || !valid_dev(ord))
        return CUDA_ERROR_INVALID_VALUE;
    *d = ord;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = fake_ndev();
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetName(char *s, int len, CUdevice d)
{
    NEED_INIT();
    if (!s || len <= 0 || !valid_dev(d))
        return CUDA_ERROR_INVALID_VALUE;
    const fake_gpu *g = fake_gpu_of(d);
    if (g->name[0])
        snprintf(s, (size_t)len, "%s", g->name);
    else
        snprintf(s, (size_t)len, "Tessera Fake GPU %d", d);
    return CUDA_SUCCESS;
}

static CUresult get_uuid(unsigned char *u, CUdevice d)
{
    NEED_INIT();
    if (!u || !valid_dev(d) || fake_uuid_bytes(fake_gpu_of(d)->uuid, u) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetUuid(unsigned char *u, CUdevice d) { return get_uuid(u, d); }
FAKE_EXPORT CUresult cuDeviceGetUuid_v2(unsigned char *u, CUdevice d) { return get_uuid(u, d); }

static int sm_count(void)
{
    const char *v = getenv("FAKE_SM_COUNT");
    return v ? atoi(v) : 4;
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
    NEED_INIT();
    if (!v || !valid_dev(d))
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case TL_DEV_ATTR_MULTIPROCESSOR_COUNT: *v = sm_count(); break;
    case TL_DEV_ATTR_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    default: *v = 1;
    }
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
    NEED_INIT();
    if (!b || !valid_dev(d))
        return CUDA_ERROR_INVALID_VALUE;
    *b = fake_gpu_of(d)->mem;
    return CUDA_SUCCESS;
}

/* legacy v1: 32-bit sizes */
FAKE_EXPORT CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d)
{
    NEED_INIT();
    if (!b || !valid_dev(d))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long m = fake_gpu_of(d)->mem;
    *b = m > 0xffffffffull ? 0xffffffffu : (unsigned)m;
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

#define MAXCTX 256
static struct fake_ctx prim[FAKE_MAXDEV], created[MAXCTX];
static int prim_refs[FAKE_MAXDEV];
static __thread struct fake_ctx *stack_[16];
static __thread int depth_;

struct fake_ctx *fake_current(void)
{
    return depth_ > 0 ? stack_[depth_ - 1] : NULL;
}

int fake_current_dev(void)
{
    struct fake_ctx *c = fake_current();
    return c ? c->dev : 0; /* none: as if the primary context of device 0 were current */
}

static struct fake_ctx *ctx_of(CUcontext c)
{
    struct fake_ctx *f = c;
    if (f >= prim && f < prim + FAKE_MAXDEV)
        return f;
    return f >= created && f < created + MAXCTX && f->magic == 1 ? f : NULL;
}

static void set_current(struct fake_ctx *c)
{
    if (depth_ == 0)
        depth_ = 1;
    stack_[depth_ - 1] = c;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    NEED_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = fake_current_dev();
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext *c)
{
    NEED_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    *c = fake_current();
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    NEED_INIT();
    if (!c) {
        if (depth_ > 0)
            depth_--;
        return CUDA_SUCCESS;
    }
    struct fake_ctx *f = ctx_of(c);
    if (!f)
        return CUDA_ERROR_INVALID_CONTEXT;
    set_current(f);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    NEED_INIT();
    struct fake_ctx *f = ctx_of(c);
    if (!f || depth_ >= 16)
        return CUDA_ERROR_INVALID_CONTEXT;
    stack_[depth_++] = f;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
    NEED_INIT();
    if (depth_ == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    depth_--;
    if (c)
        *c = stack_[depth_];
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSynchronize(void)
{
    NEED_INIT();
    fake_gpu_drain(fake_current_dev());
    fake_pools_on_sync();
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pc, CUdevice dev)
{
    NEED_INIT();
    if (!pc || !valid_dev(dev))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    struct fake_ctx *c = NULL;
    for (int i = 0; i < MAXCTX && !c; i++)
        if (created[i].magic != 1)
            c = &created[i];
    if (!c || fake_mem_take(dev, ctx_mem_bytes) != 0) {
        pthread_mutex_unlock(&fake_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(c, 0, sizeof(*c));
    c->dev = dev;
    c->magic = 1;
    c->limit[TL_LIMIT_STACK_SIZE] = 1024;
    pthread_mutex_unlock(&fake_mu);
    proc_register(dev);
    set_current(c);
    *pc = c;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxCreate(CUcontext *pc, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return ctx_create(pc, dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v2(CUcontext *pc, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return ctx_create(pc, dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v3(CUcontext *pc, void *aff, int naff, unsigned int flags, CUdevice dev)
{
    (void)aff; (void)naff; (void)flags;
    return ctx_create(pc, dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v4(CUcontext *pc, void *params, unsigned int flags, CUdevice dev)
{
    (void)params; (void)flags;
    return ctx_create(pc, dev);
}

/* What a context holds beyond FAKE_CTX_MEM (growth, heap, stack growth). */
static unsigned long long ctx_extra(const struct fake_ctx *c)
{
    unsigned long long s = c->launched ? growth_bytes : 0;
    s += c->heap_mapped;
    if (c->limit[TL_LIMIT_STACK_SIZE] > 1024)
        s += (c->limit[TL_LIMIT_STACK_SIZE] - 1024) * (unsigned long long)sm_count() * 2048;
    s += c->limit[TL_LIMIT_PRINTF_FIFO_SIZE];
    return s;
}

static CUresult ctx_destroy(CUcontext ctx)
{
    NEED_INIT();
    struct fake_ctx *f = ctx_of(ctx);
    if (!f || f->primary)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    fake_mem_give(f->dev, ctx_mem_bytes + ctx_extra(f));
    f->magic = 0;
    pthread_mutex_unlock(&fake_mu);
    if (fake_current() == f)
        depth_--;
    return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxDestroy(CUcontext c) { return ctx_destroy(c); }
FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { return ctx_destroy(c); }

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pc, CUdevice dev)
{
    NEED_INIT();
    if (!pc || !valid_dev(dev))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    if (prim_refs[dev] == 0) {
        if (fake_mem_take(dev, ctx_mem_bytes) != 0) {
            pthread_mutex_unlock(&fake_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memset(&prim[dev], 0, sizeof(prim[dev]));
        prim[dev].dev = dev;
        prim[dev].primary = 1;
        prim[dev].magic = 1;
        prim[dev].limit[TL_LIMIT_STACK_SIZE] = 1024;
    }
    prim_refs[dev]++;
    pthread_mutex_unlock(&fake_mu);
    proc_register(dev);
    *pc = &prim[dev];
    return CUDA_SUCCESS;
}

static CUresult prim_drop(CUdevice dev, int all)
{
    NEED_INIT();
    if (!valid_dev(dev) || (!all && prim_refs[dev] == 0))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    if (prim_refs[dev] > 0 && (all || prim_refs[dev] == 1)) {
        fake_mem_give(dev, ctx_mem_bytes + ctx_extra(&prim[dev]));
        prim[dev].magic = 0;
        prim_refs[dev] = 0;
    } else if (prim_refs[dev] > 0) {
        prim_refs[dev]--;
    }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return prim_drop(d, 0); }
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return prim_drop(d, 0); }
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return prim_drop(d, 1); }
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { return prim_drop(d, 1); }

/* exported for the fake NVML: contexts this process holds */
FAKE_EXPORT int fake_ctx_live(void)
{
    int n = 0;
    pthread_mutex_lock(&fake_mu);
    for (int i = 0; i < MAXCTX; i++)
        n += created[i].magic == 1;
    for (int i = 0; i < FAKE_MAXDEV; i++)
        n += prim_refs[i] > 0;
    pthread_mutex_unlock(&fake_mu);
    return n;
}

/* The context launches run in: the current one, or device 0's primary. */
static struct fake_ctx *launch_ctx(void)
{
    struct fake_ctx *c = fake_current();
    return c ? c : prim_refs[0] > 0 ? &prim[0] : NULL;
}

FAKE_EXPORT CUresult cuCtxSetLimit(int limit, size_t value)
{
    NEED_INIT();
    struct fake_ctx *c = launch_ctx();
    if (!c || limit < 0 || limit > 2)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    unsigned long long before = ctx_extra(c);
    size_t old = c->limit[limit];
    c->limit[limit] = value;
    if (limit == TL_LIMIT_MALLOC_HEAP_SIZE)
        c->heap_mapped = 0; /* backed again at the next launch */
    unsigned long long after = ctx_extra(c);
    CUresult r = CUDA_SUCCESS;
    if (after > before && fake_mem_take(c->dev, after - before) != 0) {
        c->limit[limit] = old;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (after < before) {
        fake_mem_give(c->dev, before - after);
    }
    pthread_mutex_unlock(&fake_mu);
    return r;
}

FAKE_EXPORT CUresult cuCtxGetLimit(size_t *v, int limit)
{
    NEED_INIT();
    struct fake_ctx *c = launch_ctx();
    if (!v || limit < 0 || limit > 2)
        return CUDA_ERROR_INVALID_VALUE;
    *v = c ? c->limit[limit] : limit == TL_LIMIT_STACK_SIZE ? 1024 : 0;
    return CUDA_SUCCESS;
}

void fake_ctx_on_launch(struct fake_ctx *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&fake_mu);
    if (!c->launched) {
        c->launched = 1;
        if (growth_bytes && fake_mem_take(c->dev, growth_bytes) != 0)
            c->launched = 0;
    }
    size_t heap = c->limit[TL_LIMIT_MALLOC_HEAP_SIZE];
    if (heap > c->heap_mapped && fake_mem_take(c->dev, heap - c->heap_mapped) == 0)
        c->heap_mapped = heap;
    pthread_mutex_unlock(&fake_mu);
}

/* ---- allocations ---- */

static CUresult alloc_on(int dev, unsigned long long *out, size_t size, int kind, void *pool)
{
    NEED_INIT();
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    if (!pool && fake_mem_take(dev, size) != 0) {
        pthread_mutex_unlock(&fake_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < MAXALLOC; i++) {
        if (allocs[i].key == 0) {
            allocs[i].key = next_addr;
            allocs[i].size = size;
            allocs[i].dev = dev;
            allocs[i].kind = kind;
            allocs[i].pool = pool;
            *out = next_addr;
            next_addr += (size + 511) & ~511ull;
            pthread_mutex_unlock(&fake_mu);
            return CUDA_SUCCESS;
        }
    }
    if (!pool)
        fake_mem_give(dev, size);
    pthread_mutex_unlock(&fake_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_alloc(unsigned long long *out, size_t size, int kind)
{
    return alloc_on(fake_current_dev(), out, size, kind, NULL);
}

static void pool_free(void *pool, unsigned long long n);

static CUresult fake_free(unsigned long long key, int kind)
{
    NEED_INIT();
    pthread_mutex_lock(&fake_mu);
    for (int i = 0; key && i < MAXALLOC; i++) {
        if (allocs[i].key == key && (allocs[i].kind == kind || (kind == K_PTR && allocs[i].kind == K_POOL))) {
            if (allocs[i].kind == K_POOL)
                pool_free(allocs[i].pool, allocs[i].size);
            else
                fake_mem_give(allocs[i].dev, allocs[i].size);
            allocs[i].key = 0;
            pthread_mutex_unlock(&fake_mu);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return fake_alloc(p, n, K_PTR); }
FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return fake_free(p, K_PTR); }
FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int f)
{
    (void)f;
    return fake_alloc(p, n, K_PTR);
}

/* legacy v1 entry points: 32-bit handles (the fake keeps a 64-bit table) */
FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int n)
{
    unsigned long long k;
    CUresult r = fake_alloc(&k, n, K_V1);
    if (r == CUDA_SUCCESS && p)
        *p = (CUdeviceptr_v1)(k >> 9);
    return r;
}
FAKE_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h,
                                     unsigned int e)
{
    (void)e;
    unsigned long long k;
    CUresult r = fake_alloc(&k, (size_t)w * h, K_V1);
    if (r == CUDA_SUCCESS && p && pitch) {
        *p = (CUdeviceptr_v1)(k >> 9);
        *pitch = w;
    }
    return r;
}
FAKE_EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) { return fake_free((unsigned long long)p << 9, K_V1); }

FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e)
{
    (void)e;
    /* FAKE_PITCH_ALIGN pads rows like a real driver would (default: none). */
    const char *a = getenv("FAKE_PITCH_ALIGN");
    size_t al = a ? strtoull(a, NULL, 0) : 1;
    if (al == 0)
        al = 1;
    size_t pw = (w + al - 1) / al * al;
    CUresult r = fake_alloc(p, pw * h, K_PTR);
    if (r == CUDA_SUCCESS && pitch)
        *pitch = pw;
    return r;
}

static size_t fmt_bytes(int f)
{
    switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    default: return 4;
    }
}

static size_t arr_bytes(size_t w, size_t h, size_t d, int f, unsigned ch)
{
    return (w ? w : 1) * (h ? h : 1) * (d ? d : 1) * (ch ? ch : 1) * fmt_bytes(f);
}

FAKE_EXPORT CUresult cuArrayCreate_v2(CUarray *a, const TL_ARRAY_DESCRIPTOR *d)
{
    unsigned long long k;
    if (!a || !d)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_alloc(&k, arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), K_ARRAY);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

FAKE_EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const TL_ARRAY3D_DESCRIPTOR *d)
{
    unsigned long long k;
    if (!a || !d)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_alloc(&k, arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), K_ARRAY);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

/* legacy v1 descriptors: unsigned int sizes */
FAKE_EXPORT CUresult cuArrayCreate(CUarray *a, const void *desc)
{
    const unsigned *d = desc; /* Width, Height, Format, NumChannels */
    unsigned long long k;
    if (!a || !d)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_alloc(&k, arr_bytes(d[0], d[1], 1, (int)d[2], d[3]), K_ARRAY);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

FAKE_EXPORT CUresult cuArray3DCreate(CUarray *a, const void *desc)
{
    const unsigned *d = desc; /* Width, Height, Depth, Format, NumChannels, Flags */
    unsigned long long k;
    if (!a || !d)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_alloc(&k, arr_bytes(d[0], d[1], d[2], (int)d[3], d[4]), K_ARRAY);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

FAKE_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const TL_ARRAY3D_DESCRIPTOR *d,
                                            unsigned int levels)
{
    if (!a || !d)
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0, w = d->Width, h = d->Height, dd = d->Depth;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        total += arr_bytes(w, h, dd, d->Format, d->NumChannels);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        dd = dd > 1 ? dd / 2 : dd;
    }
    unsigned long long k;
    CUresult r = fake_alloc(&k, total, K_MIPMAP);
    if (r == CUDA_SUCCESS)
        *a = (CUmipmappedArray)(uintptr_t)k;
    return r;
}

FAKE_EXPORT CUresult cuArrayDestroy(CUarray a) { return fake_free((uintptr_t)a, K_ARRAY); }
FAKE_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return fake_free((uintptr_t)a, K_MIPMAP); }

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
    NEED_INIT();
    if (!f || !t)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = fake_current_dev();
    const fake_gpu *g = fake_gpu_of(dev);
    pthread_mutex_lock(&fake_mu);
    unsigned long long held = used[dev] + fake_others_used(dev);
    pthread_mutex_unlock(&fake_mu);
    *t = g->mem;
    *f = held < g->mem ? g->mem - held : 0;
    uint64_t hard, cg;
    if (fake_limits_self(dev, &hard, &cg)) {
        /* the driver reports the cgroup's hard limit as the total */
        uint64_t left = cg < hard ? hard - cg : 0;
        *t = hard < *t ? hard : *t;
        *f = left < *f ? left : *f;
    }
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetInfo(unsigned int *f, unsigned int *t)
{
    size_t f2, t2;
    CUresult r = cuMemGetInfo_v2(&f2, &t2);
    if (r == CUDA_SUCCESS && f && t) {
        *f = f2 > 0xffffffffu ? 0xffffffffu : (unsigned)f2;
        *t = t2 > 0xffffffffu ? 0xffffffffu : (unsigned)t2;
    }
    return r;
}

/* ---- stream-ordered pools ---- */

#define MAXPOOL 64
static struct fake_pool {
    int live, dev;
    unsigned long long reserved, used, threshold;
} pools[MAXPOOL]; /* pools[d] is device d's default pool */
static struct fake_pool *current_pool[FAKE_MAXDEV];

static struct fake_pool *pool_of(CUmemoryPool p)
{
    struct fake_pool *f = p;
    return f >= pools && f < pools + MAXPOOL && f->live ? f : NULL;
}

/* with fake_mu held */
static struct fake_pool *default_pool(int dev)
{
    if (!pools[dev].live) {
        memset(&pools[dev], 0, sizeof(pools[dev]));
        pools[dev].live = 1;
        pools[dev].dev = dev;
    }
    return &pools[dev];
}

static struct fake_pool *dev_pool(int dev)
{
    return current_pool[dev] ? current_pool[dev] : default_pool(dev);
}

static void pool_shrink(struct fake_pool *p, unsigned long long keep)
{
    if (keep < p->used)
        keep = p->used;
    if (p->reserved > keep) {
        fake_mem_give(p->dev, p->reserved - keep);
        p->reserved = keep;
    }
}

static void pool_free(void *pool, unsigned long long n)
{
    struct fake_pool *p = pool;
    p->used = p->used >= n ? p->used - n : 0;
}

void fake_pools_on_sync(void)
{
    pthread_mutex_lock(&fake_mu);
    for (int i = 0; i < MAXPOOL; i++)
        if (pools[i].live)
            pool_shrink(&pools[i], pools[i].threshold);
    pthread_mutex_unlock(&fake_mu);
}

static CUresult pool_alloc(struct fake_pool *p, CUdeviceptr *out, size_t n)
{
    NEED_INIT();
    if (!out || !n)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    unsigned long long idle = p->reserved - p->used;
    if (idle < n) {
        unsigned long long grow = n - idle;
        if (pool_granule && grow % pool_granule)
            grow += pool_granule - grow % pool_granule;
        if (fake_mem_take(p->dev, grow) != 0) {
            pthread_mutex_unlock(&fake_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->reserved += grow;
    }
    p->used += n;
    pthread_mutex_unlock(&fake_mu);
    CUresult r = alloc_on(p->dev, out, n, K_POOL, p);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_lock(&fake_mu);
        pool_free(p, n);
        pthread_mutex_unlock(&fake_mu);
    }
    return r;
}

static CUresult async_alloc(CUdeviceptr *p, size_t n, CUstream s)
{
    NEED_INIT();
    fake_cpu();
    if (fake_stream_capturing(s))
        return fake_capture_alloc(s, p, n);
    pthread_mutex_lock(&fake_mu);
    struct fake_pool *pl = dev_pool(fake_stream_dev(s));
    pthread_mutex_unlock(&fake_mu);
    return pool_alloc(pl, p, n);
}

static CUresult async_alloc_from(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
    NEED_INIT();
    fake_cpu();
    if (fake_stream_capturing(s))
        return fake_capture_alloc(s, p, n);
    struct fake_pool *pl = pool_of(pool);
    if (!pl)
        return CUDA_ERROR_INVALID_VALUE;
    return pool_alloc(pl, p, n);
}

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return async_alloc(p, n, s); }
FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return async_alloc(p, n, s); }
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pl, CUstream s)
{
    return async_alloc_from(p, n, pl, s);
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pl, CUstream s)
{
    return async_alloc_from(p, n, pl, s);
}

static CUresult async_free(CUdeviceptr p, CUstream s)
{
    (void)s;
    if (fake_stream_capturing(s))
        return CUDA_SUCCESS; /* a free node in the captured graph */
    return fake_free(p, K_PTR);
}
FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return async_free(p, s); }
FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return async_free(p, s); }

FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d)
{
    NEED_INIT();
    if (!p || !valid_dev(d))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    *p = default_pool(d);
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice d)
{
    NEED_INIT();
    if (!p || !valid_dev(d))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    *p = dev_pool(d);
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool p)
{
    NEED_INIT();
    struct fake_pool *f = pool_of(p);
    if (!valid_dev(d) || !f || f->dev != d)
        return CUDA_ERROR_INVALID_VALUE;
    current_pool[d] = f;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const TL_MEM_POOL_PROPS *props)
{
    NEED_INIT();
    if (!p || !props || props->location.type != TL_MEM_LOCATION_DEVICE || !valid_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    for (int i = FAKE_MAXDEV; i < MAXPOOL; i++)
        if (!pools[i].live) {
            memset(&pools[i], 0, sizeof(pools[i]));
            pools[i].live = 1;
            pools[i].dev = props->location.id;
            *p = &pools[i];
            pthread_mutex_unlock(&fake_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p)
{
    struct fake_pool *f = pool_of(p);
    if (!f || f < pools + FAKE_MAXDEV)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    fake_mem_give(f->dev, f->reserved); /* outstanding allocations die with it */
    f->live = 0;
    for (int d = 0; d < FAKE_MAXDEV; d++)
        if (current_pool[d] == f)
            current_pool[d] = NULL;
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool p, int attr, void *v)
{
    struct fake_pool *f = pool_of(p);
    if (!f || !v)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    unsigned long long x = 0;
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
    case TL_MEMPOOL_ATTR_RELEASE_THRESHOLD: x = f->threshold; break;
    case TL_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: x = f->reserved; break;
    case TL_MEMPOOL_ATTR_USED_MEM_CURRENT: x = f->used; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fake_mu);
    if (r == CUDA_SUCCESS)
        *(unsigned long long *)v = x;
    return r;
}

FAKE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool p, int attr, void *v)
{
    struct fake_pool *f = pool_of(p);
    if (!f || !v || attr != TL_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        return CUDA_ERROR_INVALID_VALUE;
    f->threshold = *(unsigned long long *)v;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep)
{
    struct fake_pool *f = pool_of(p);
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    pool_shrink(f, keep);
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

/* ---- virtual memory management ---- */

#define MAXPHYS 1024
#define MAXHANDLE 4096
#define MAXMAP 4096
static struct phys {
    int live, dev, device_mem;
    unsigned long long size;
    int handles, maps;
} phys[MAXPHYS];
static struct {
    int live, refs; /* refs: the create or import, and each retain */
    struct phys *obj;
} handles[MAXHANDLE]; /* handle value = index + 1 */
static struct {
    int live;
    unsigned long long va, size;
    struct phys *obj;
    CUmemGenericAllocationHandle h; /* mapped through */
} maps[MAXMAP];
static unsigned long long next_va = 0x7e0000000000ull;

static void phys_maybe_free(struct phys *o)
{
    if (o->live && o->handles == 0 && o->maps == 0) {
        if (o->device_mem)
            fake_mem_give(o->dev, o->size);
        o->live = 0;
    }
}

/* with fake_mu held: a new handle to o */
static CUmemGenericAllocationHandle new_handle(struct phys *o)
{
    for (int i = 0; i < MAXHANDLE; i++)
        if (!handles[i].live) {
            handles[i].live = 1;
            handles[i].refs = 1;
            handles[i].obj = o;
            o->handles++;
            return (CUmemGenericAllocationHandle)i + 1;
        }
    return 0;
}

static struct phys *obj_of(CUmemGenericAllocationHandle h)
{
    return h >= 1 && h <= MAXHANDLE && handles[h - 1].live ? handles[h - 1].obj : NULL;
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const TL_MEM_ALLOCATION_PROP *prop,
                                 unsigned long long f)
{
    (void)f;
    NEED_INIT();
    if (!h || !prop || !n)
        return CUDA_ERROR_INVALID_VALUE;
    int device = prop->location.type == TL_MEM_LOCATION_DEVICE;
    if (device && !valid_dev(prop->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    int dev = device ? prop->location.id : -1; /* a host location's id is not read */
    pthread_mutex_lock(&fake_mu);
    struct phys *o = NULL;
    for (int i = 0; i < MAXPHYS && !o; i++)
        if (!phys[i].live)
            o = &phys[i];
    if (!o || (device && fake_mem_take(dev, n) != 0)) {
        pthread_mutex_unlock(&fake_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(o, 0, sizeof(*o));
    o->live = 1;
    o->dev = dev;
    o->device_mem = device;
    o->size = n;
    *h = new_handle(o);
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    pthread_mutex_lock(&fake_mu);
    struct phys *o = obj_of(h);
    if (!o) {
        pthread_mutex_unlock(&fake_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (--handles[h - 1].refs == 0) {
        handles[h - 1].live = 0;
        o->handles--;
        phys_maybe_free(o);
    }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr,
                                         unsigned long long f)
{
    (void)align; (void)addr; (void)f;
    NEED_INIT();
    if (!p || !n)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    *p = next_va;
    next_va += (n + 0xfffff) & ~0xfffffull;
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t n)
{
    (void)p; (void)n;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemMap(CUdeviceptr va, size_t n, size_t off, CUmemGenericAllocationHandle h,
                              unsigned long long f)
{
    (void)f;
    NEED_INIT();
    pthread_mutex_lock(&fake_mu);
    struct phys *o = obj_of(h);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (o && n && off + n <= o->size) {
        for (int i = 0; i < MAXMAP; i++)
            if (!maps[i].live) {
                maps[i].live = 1;
                maps[i].va = va;
                maps[i].size = n;
                maps[i].obj = o;
                maps[i].h = h;
                o->maps++;
                r = CUDA_SUCCESS;
                break;
            }
    }
    pthread_mutex_unlock(&fake_mu);
    return r;
}

/* Unmaps every mapping inside [va, va + n). */
FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t n)
{
    NEED_INIT();
    pthread_mutex_lock(&fake_mu);
    int found = 0;
    for (int i = 0; i < MAXMAP; i++)
        if (maps[i].live && maps[i].va >= va && maps[i].va + maps[i].size <= va + n) {
            maps[i].live = 0;
            maps[i].obj->maps--;
            phys_maybe_free(maps[i].obj);
            found = 1;
        }
    pthread_mutex_unlock(&fake_mu);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr va, size_t n, const void *desc, size_t count)
{
    (void)va; (void)n; (void)desc; (void)count;
    return CUDA_SUCCESS;
}

/* As the real driver does, the retained handle is the one the memory was
 * mapped with (same value); it must be released once more. */
FAKE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    NEED_INIT();
    unsigned long long a = (uintptr_t)addr;
    pthread_mutex_lock(&fake_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; h && i < MAXMAP; i++)
        if (maps[i].live && a >= maps[i].va && a < maps[i].va + maps[i].size) {
            *h = maps[i].h;
            if (handles[*h - 1].live) {
                handles[*h - 1].refs++;
            } else { /* released while mapped: the memory lives on, the value comes back */
                handles[*h - 1].live = 1;
                handles[*h - 1].refs = 1;
                handles[*h - 1].obj = maps[i].obj;
                maps[i].obj->handles++;
            }
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&fake_mu);
    return r;
}

/* Shareable handles: within one process (the fake keeps no cross-process
 * objects), an int token naming the physical object. */
FAKE_EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                                  unsigned long long f)
{
    (void)type; (void)f;
    NEED_INIT();
    pthread_mutex_lock(&fake_mu);
    struct phys *o = obj_of(h);
    if (o && out)
        *(int *)out = (int)(o - phys) + 1000;
    pthread_mutex_unlock(&fake_mu);
    return o && out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type)
{
    (void)type;
    NEED_INIT();
    int tok = (int)(intptr_t)os - 1000;
    pthread_mutex_lock(&fake_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (h && tok >= 0 && tok < MAXPHYS && phys[tok].live) {
        *h = new_handle(&phys[tok]);
        r = *h ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&fake_mu);
    return r;
}

FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const TL_MEM_ALLOCATION_PROP *prop, int opt)
{
    (void)prop; (void)opt;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    *g = 2u << 20;
    return CUDA_SUCCESS;
}

/* ---- modules: their globals take device memory the limiter never sees ---- */

#define MAXMOD 64
static struct {
    int live, dev;
    unsigned long long bytes;
} modules[MAXMOD];

FAKE_EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    (void)image;
    NEED_INIT();
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = fake_current_dev();
    pthread_mutex_lock(&fake_mu);
    for (int i = 0; i < MAXMOD; i++)
        if (!modules[i].live) {
            if (fake_mem_take(dev, module_bytes) != 0)
                break;
            modules[i].live = 1;
            modules[i].dev = dev;
            modules[i].bytes = module_bytes;
            *m = &modules[i];
            pthread_mutex_unlock(&fake_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_EXPORT CUresult cuModuleUnload(CUmodule m)
{
    NEED_INIT();
    int i = (int)(((char *)m - (char *)modules) / (long)sizeof(modules[0]));
    if (i < 0 || i >= MAXMOD || (void *)&modules[i] != m || !modules[i].live)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    fake_mem_give(modules[i].dev, modules[i].bytes);
    modules[i].live = 0;
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

/* ---- launches ---- */

/* exported for tests: blocks launched by this process */
FAKE_EXPORT unsigned long long fake_launch_blocks;

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, CUstream s)
{
    NEED_INIT();
    double blocks = (double)(gx ? gx : 1) * (gy ? gy : 1) * (gz ? gz : 1);
    __atomic_add_fetch(&fake_launch_blocks, (unsigned long long)blocks, __ATOMIC_RELAXED);
    fake_cpu();
    fake_ctx_on_launch(launch_ctx());
    fake_gpu_enqueue(fake_stream_dev(s), fake_kernel_cost(f, blocks));
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **e)
{
    (void)bx; (void)by; (void)bz; (void)shm; (void)p; (void)e;
    return launch(f, gx, gy, gz, s);
}
FAKE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                         unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **e)
{
    (void)bx; (void)by; (void)bz; (void)shm; (void)p; (void)e;
    return launch(f, gx, gy, gz, s);
}
FAKE_EXPORT CUresult cuLaunchKernelEx(const TL_LAUNCH_CONFIG *c, CUfunction f, void **p, void **e)
{
    (void)p; (void)e;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->hStream);
}
FAKE_EXPORT CUresult cuLaunchKernelEx_ptsz(const TL_LAUNCH_CONFIG *c, CUfunction f, void **p, void **e)
{
    (void)p; (void)e;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->hStream);
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **p)
{
    (void)bx; (void)by; (void)bz; (void)shm; (void)p;
    return launch(f, gx, gy, gz, s);
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                    unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                                    CUstream s, void **p)
{
    (void)bx; (void)by; (void)bz; (void)shm; (void)p;
    return launch(f, gx, gy, gz, s);
}

/* ---- streams ---- */

#define MAXSTREAM 64
static struct fake_stream {
    int live;
    struct fake_ctx *ctx;
    CUgraph cap; /* graph being captured, or NULL */
} streams[MAXSTREAM];

static struct fake_stream *stream_of(CUstream s)
{
    struct fake_stream *f = s;
    return f >= streams && f < streams + MAXSTREAM && f->live ? f : NULL; /* NULL, legacy, per-thread */
}

int fake_stream_dev(CUstream s)
{
    struct fake_stream *f = stream_of(s);
    return f && f->ctx ? f->ctx->dev : fake_current_dev();
}

CUgraph *fake_stream_capture(CUstream s)
{
    struct fake_stream *f = stream_of(s);
    return f ? &f->cap : NULL;
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    (void)flags;
    NEED_INIT();
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    for (int i = 0; i < MAXSTREAM; i++)
        if (!streams[i].live) {
            streams[i].live = 1;
            streams[i].ctx = fake_current();
            streams[i].cap = NULL;
            *s = &streams[i];
            pthread_mutex_unlock(&fake_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *c)
{
    NEED_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_stream *f = stream_of(s);
    *c = f && f->ctx ? (CUcontext)f->ctx : (CUcontext)fake_current();
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s)
{
    NEED_INIT();
    fake_gpu_drain(fake_stream_dev(s));
    fake_pools_on_sync();
    return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s); }
FAKE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s); }
