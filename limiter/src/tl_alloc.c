/*
 * tl_alloc.c - allocations and frees, and stream-ordered pools.
 *
 * Every allocation path is check-and-reserve: under the shared lock the
 * request is added to the device's usage only if the total stays at or
 * below the limit; then the real allocator is called; if it fails the
 * reservation is rolled back (after, for a refusal within the guarantee,
 * asking the node agent to reclaim and retrying: tl_reclaim_retry). Over the limit the call returns
 * CUDA_ERROR_OUT_OF_MEMORY without reaching the driver.
 *
 * Stream-ordered pools keep what they reserved after cuMemFreeAsync, up to
 * their release threshold (PyTorch's cudaMallocAsync backend keeps all of
 * it). So their charge is the pool's reservation, as the driver reports it
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not the live allocations: before
 * an allocation the growth it can cause (bytes beyond the pool's idle part)
 * is check-and-reserved, after it the charge is set to the new reservation.
 * The charge is re-read after the calls that shrink a pool
 * (synchronisation, cuMemPoolTrimTo, destroy), when an allocation would not
 * fit, and when memory is reported. A pool's device is the one it was
 * created for (cuMemPoolCreate's properties, or the device whose default or
 * current pool it is), not the current device.
 */
#include "tl_compat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_internal.h"
#include "tl_size.h"

/* Common shape of the simple allocators. `ld` is the limiter device of
 * where it lands. */
#define ALLOC_BODY(kind, ld_expr, bytes_expr, outkey, call)                        \
    ensure_cuda();                                                                  \
    if (UNLIKELY(cfg.error))                                                        \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    if (!cfg.mem_active)                                                            \
        return call;                                                                \
    int ld_ = (ld_expr);                                                            \
    uint64_t bytes_ = (bytes_expr);                                                 \
    tl_account_prepare(ld_, bytes_);                                                \
    int charged_ = tl_reserve(ld_, bytes_);                                         \
    if (charged_ < 0)                                                               \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    CUresult r_ = call;                                                             \
    for (double until_ = 0; r_ == CUDA_ERROR_OUT_OF_MEMORY && charged_ > 0 &&       \
                            tl_reclaim_retry(ld_, bytes_, &until_);)                \
        r_ = call;                                                                  \
    if (charged_ > 0) {                                                             \
        if (r_ != CUDA_SUCCESS)                                                     \
            tl_release(ld_, bytes_);                                                \
        else if (tl_track(kind, (uint64_t)(outkey), bytes_, ld_) != 0)              \
            r_ = CUDA_ERROR_OUT_OF_MEMORY;                                          \
    }                                                                               \
    return r_;

#define CUR_LD tl_ld_of_ordinal(tl_current_ordinal())

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ALLOC_BODY(TL_K_PTR, CUR_LD, bytesize, *dptr, CALL_REAL(cuMemAlloc_v2, dptr, bytesize))
}

/* Managed memory lands on the current device (until migrated). */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ALLOC_BODY(TL_K_PTR, CUR_LD, bytesize, *dptr, CALL_REAL(cuMemAllocManaged, dptr, bytesize, flags))
}

EXPORT CUresult cuArrayCreate_v2(CUarray *ph, const TL_ARRAY_DESCRIPTOR *a)
{
    if (!a || !ph) {
        ensure_cuda();
        return CALL_REAL(cuArrayCreate_v2, ph, a);
    }
    ALLOC_BODY(TL_K_ARRAY, CUR_LD, tl_array_bytes(a->Width, a->Height, 1, a->Format, a->NumChannels),
               (uintptr_t)*ph, CALL_REAL(cuArrayCreate_v2, ph, a))
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *ph, const TL_ARRAY3D_DESCRIPTOR *a)
{
    if (!a || !ph) {
        ensure_cuda();
        return CALL_REAL(cuArray3DCreate_v2, ph, a);
    }
    ALLOC_BODY(TL_K_ARRAY, CUR_LD, tl_array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels),
               (uintptr_t)*ph, CALL_REAL(cuArray3DCreate_v2, ph, a))
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *ph, const TL_ARRAY3D_DESCRIPTOR *a, unsigned int levels)
{
    if (!a || !ph) {
        ensure_cuda();
        return CALL_REAL(cuMipmappedArrayCreate, ph, a, levels);
    }
    ALLOC_BODY(TL_K_MIPMAP, CUR_LD, tl_mipmap_bytes(a, levels), (uintptr_t)*ph,
               CALL_REAL(cuMipmappedArrayCreate, ph, a, levels))
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
    int ld = CUR_LD;
    uint64_t want = tl_sat_mul(width, height);
    tl_account_prepare(ld, want);
    int charged = tl_reserve(ld, want);
    if (charged < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CALL_REAL(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    for (double until = 0; r == CUDA_ERROR_OUT_OF_MEMORY && charged > 0 && tl_reclaim_retry(ld, want, &until);)
        r = CALL_REAL(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    if (charged == 0)
        return r;
    if (r != CUDA_SUCCESS) {
        tl_release(ld, want);
        return r;
    }
    uint64_t actual = tl_sat_mul(*pitch, height);
    if (actual > want) {
        if (tl_reserve(ld, actual - want) < 0) {
            CALL_REAL(cuMemFree_v2, *dptr);
            tl_release(ld, want);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        want = actual;
    }
    if (tl_track(TL_K_PTR, *dptr, want, ld) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return r;
}

/* Legacy v1 allocators (32-bit sizes and device pointers, superseded in
 * CUDA 3.2): reached only by a caller asking cuGetProcAddress for version
 * 2000 or by symbol. Not accounted, so refused while a memory limit holds. */
static CUresult legacy(const char *name)
{
    ensure_cuda();
    if (!cfg.mem_active && !cfg.error)
        return -1;
    static int told;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "tessera-limiter: %s (the CUDA 2.x entry point) is not supported under a memory limit; "
                        "refused\n", name);
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemAlloc(TL_DEVPTR_V1 *dptr, unsigned int bytesize)
{
    CUresult r = legacy("cuMemAlloc");
    return r >= 0 ? r : CALL_REAL(cuMemAlloc, dptr, bytesize);
}

EXPORT CUresult cuMemAllocPitch(TL_DEVPTR_V1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                                unsigned int elem)
{
    CUresult r = legacy("cuMemAllocPitch");
    return r >= 0 ? r : CALL_REAL(cuMemAllocPitch, dptr, pitch, w, h, elem);
}

EXPORT CUresult cuArrayCreate(CUarray *ph, const void *desc)
{
    CUresult r = legacy("cuArrayCreate");
    return r >= 0 ? r : CALL_REAL(cuArrayCreate, ph, desc);
}

EXPORT CUresult cuArray3DCreate(CUarray *ph, const void *desc)
{
    CUresult r = legacy("cuArray3DCreate");
    return r >= 0 ? r : CALL_REAL(cuArray3DCreate, ph, desc);
}

/* Frees: forget the entry first (the address may be reused by another
 * thread as soon as the real free returns), put it back on failure. */
#define FREE_BODY(kind, key, call)                                                 \
    ensure_cuda();                                                                 \
    if (!cfg.mem_active)                                                           \
        return call;                                                               \
    uint64_t size_;                                                                \
    int ld_;                                                                       \
    int had_ = tl_table_take(kind, (uint64_t)(key), &size_, &ld_);                 \
    CUresult r_ = call;                                                            \
    if (had_) {                                                                    \
        if (r_ == CUDA_SUCCESS)                                                    \
            tl_release(ld_, size_);                                                \
        else                                                                       \
            tl_table_put(kind, (uint64_t)(key), size_, ld_);                       \
    }                                                                              \
    return r_;

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    FREE_BODY(TL_K_PTR, p, CALL_REAL(cuMemFree_v2, p))
}
EXPORT CUresult cuArrayDestroy(CUarray a) { FREE_BODY(TL_K_ARRAY, (uintptr_t)a, CALL_REAL(cuArrayDestroy, a)) }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    FREE_BODY(TL_K_MIPMAP, (uintptr_t)a, CALL_REAL(cuMipmappedArrayDestroy, a))
}

/* ------------------------------------------------------------------ */
/* stream-ordered pools                                                */

/* During stream capture a stream-ordered allocation allocates nothing: it
 * records a memory-alloc node in the graph being captured, whose memory
 * is charged when the graph is instantiated and launched (tl_graph.c).
 * Charging it here as well would count it twice. */
int tl_capturing(CUstream s, int ptsz)
{
    int st = TL_STREAM_CAPTURE_STATUS_NONE;
    CUresult (*f)(CUstream, int *) = ptsz ? real_cuStreamIsCapturing_ptsz : real_cuStreamIsCapturing;
    return f && f(s, &st) == CUDA_SUCCESS && st != TL_STREAM_CAPTURE_STATUS_NONE;
}

#define MAXPOOL 64
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pool {
    CUmemoryPool p;
    int ld;          /* limiter device, -1 unknown */
    uint64_t charged; /* what its reservation is charged */
    int idle;        /* it keeps memory beyond what is used: a synchronisation may shrink it */
} pools[MAXPOOL];
static int npools;
static CUmemoryPool current[TL_MAX_DEVICES]; /* cached cuDeviceGetMemPool per ordinal */
static int any_idle;

static uint64_t pool_attr(CUmemoryPool p, int attr)
{
    unsigned long long v = 0;
    if (!real_cuMemPoolGetAttribute || real_cuMemPoolGetAttribute(p, attr, &v) != CUDA_SUCCESS)
        return UINT64_MAX;
    return v;
}

/* with pool_mu held */
static struct pool *pool_find(CUmemoryPool p)
{
    for (int i = 0; i < npools; i++)
        if (pools[i].p == p)
            return &pools[i];
    return NULL;
}

static struct pool *pool_add(CUmemoryPool p, int ld)
{
    struct pool *e = pool_find(p);
    if (e)
        return e;
    if (npools == MAXPOOL) { /* forget one that holds nothing */
        for (int i = 0; i < npools; i++)
            if (!pools[i].charged) {
                pools[i] = pools[--npools];
                break;
            }
        if (npools == MAXPOOL)
            return NULL;
    }
    e = &pools[npools++];
    memset(e, 0, sizeof(*e));
    e->p = p;
    e->ld = ld;
    return e;
}

/* The limiter device of a pool we were not told about: the device whose
 * default or current pool it is. */
static int pool_device(CUmemoryPool p)
{
    int n = 0;
    if (!real_cuDeviceGetCount || real_cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return -1;
    for (int o = 0; o < n && o < TL_MAX_DEVICES; o++) {
        CUmemoryPool q = NULL;
        if ((real_cuDeviceGetDefaultMemPool && real_cuDeviceGetDefaultMemPool(&q, o) == CUDA_SUCCESS && q == p) ||
            (real_cuDeviceGetMemPool && real_cuDeviceGetMemPool(&q, o) == CUDA_SUCCESS && q == p))
            return tl_ld_of_ordinal(o);
    }
    return -1;
}

/* with pool_mu held: set e's charge to its reservation, using `pre` bytes
 * reserved beforehand first. Growth that does not fit is charged anyway (the
 * driver holds the memory). */
/* Set e's charge to the pool's reservation; `pre` bytes were reserved
 * ahead of an allocation and are used first. `used_hint`: the pool's used
 * bytes if the caller knows them (UINT64_MAX: ask the driver). */
static void pool_sync_hint(struct pool *e, uint64_t pre, uint64_t used_hint)
{
    uint64_t res = pool_attr(e->p, TL_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    if (res == UINT64_MAX) { /* cannot read: keep what was reserved */
        e->charged += pre;
        return;
    }
    if (res > e->charged) {
        uint64_t d = res - e->charged, use = d < pre ? d : pre;
        pre -= use;
        d -= use;
        if (d)
            tl_force_charge(e->ld, d);
    } else if (e->charged > res) {
        tl_release(e->ld, e->charged - res);
    }
    if (pre)
        tl_release(e->ld, pre);
    e->charged = res;
    /* memory kept beyond what is used: a synchronisation may give it back
     * (above the release threshold, which the application may change
     * without telling us, so it is not consulted) */
    uint64_t used = used_hint != UINT64_MAX ? used_hint : pool_attr(e->p, TL_MEMPOOL_ATTR_USED_MEM_CURRENT);
    e->idle = used == UINT64_MAX || res > used;
    if (e->idle)
        any_idle = 1;
}

static void pool_sync(struct pool *e, uint64_t pre)
{
    pool_sync_hint(e, pre, UINT64_MAX);
}

void tl_pools_resync(int ld)
{
    if (!cfg.mem_active)
        return;
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < npools; i++)
        if (ld < 0 || pools[i].ld == ld)
            pool_sync(&pools[i], 0);
    pthread_mutex_unlock(&pool_mu);
}

/* After a synchronisation: pools above their threshold may have shrunk. */
static void after_sync(void)
{
    if (!cfg.mem_active || !__atomic_load_n(&any_idle, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&pool_mu);
    any_idle = 0;
    for (int i = 0; i < npools; i++)
        if (pools[i].idle)
            pool_sync(&pools[i], 0);
    pthread_mutex_unlock(&pool_mu);
}

/* A stream-ordered allocation of n bytes from pool p (NULL: the current
 * pool of the stream's device). */
static CUresult async_alloc(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s, int ptsz,
                            CUresult (*call)(CUdeviceptr *, size_t, CUmemoryPool, CUstream, int))
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!cfg.mem_active || tl_capturing(s, ptsz))
        return call(dptr, n, p, s, ptsz);
    int ld;
    if (!p) {
        int o = tl_stream_ordinal(s, ptsz);
        ld = tl_ld_of_ordinal(o);
        if (o >= 0 && o < TL_MAX_DEVICES) {
            p = __atomic_load_n(&current[o], __ATOMIC_RELAXED);
            if (!p && real_cuDeviceGetMemPool && real_cuDeviceGetMemPool(&p, o) == CUDA_SUCCESS)
                __atomic_store_n(&current[o], p, __ATOMIC_RELAXED);
        }
    } else {
        pthread_mutex_lock(&pool_mu);
        struct pool *e = pool_find(p);
        ld = e ? e->ld : -2;
        pthread_mutex_unlock(&pool_mu);
        if (ld == -2)
            ld = pool_device(p);
    }
    if (!p || !tl_limit_of(ld)) {
        if (!tl_limit_of(ld))
            return call(dptr, n, NULL, s, ptsz);
        tl_count_refused(ld); /* no pool to account it in */
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    tl_account_prepare(ld, n);
    pthread_mutex_lock(&pool_mu);
    struct pool *e = pool_add(p, ld);
    if (!e) {
        pthread_mutex_unlock(&pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t res = pool_attr(p, TL_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
             used = pool_attr(p, TL_MEMPOOL_ATTR_USED_MEM_CURRENT);
    uint64_t idle = res != UINT64_MAX && used != UINT64_MAX && res > used ? res - used : 0;
    uint64_t pre = n > idle ? n - idle : 0;
    if (res != UINT64_MAX && res < e->charged) { /* it shrank since: credit that first */
        tl_release(ld, e->charged - res);
        e->charged = res;
    }
    if (pre && tl_reserve(ld, pre) < 0) {
        pthread_mutex_unlock(&pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = call(dptr, n, e->p, s, ptsz);
    /* used afterwards: at least used + n (the driver may round up, which
     * only makes the pool look idle when it is not: a harmless re-read) */
    pool_sync_hint(e, pre, used == UINT64_MAX ? UINT64_MAX : used + (r == CUDA_SUCCESS ? n : 0));
    if (r == CUDA_SUCCESS)
        tl_table_put_aux(TL_K_APTR, *dptr, n, ld, (uint64_t)(uintptr_t)e->p);
    pthread_mutex_unlock(&pool_mu);
    if (r == CUDA_SUCCESS)
        tl_hp_after_alloc(ld); /* as tl_track: a memory-only process's host pid (outside pool_mu) */
    return r;
}

static CUresult call_async(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s, int ptsz)
{
    (void)p; /* the current pool: cuMemAllocAsync picks it itself */
    return ptsz ? CALL_REAL(cuMemAllocAsync_ptsz, d, n, s) : CALL_REAL(cuMemAllocAsync, d, n, s);
}

static CUresult call_from_pool(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s, int ptsz)
{
    return ptsz ? CALL_REAL(cuMemAllocFromPoolAsync_ptsz, d, n, p, s) : CALL_REAL(cuMemAllocFromPoolAsync, d, n, p, s);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s)
{
    return async_alloc(dptr, n, NULL, s, 0, call_async);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    return async_alloc(dptr, n, NULL, s, 1, call_async);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s)
{
    if (!p) {
        ensure_cuda();
        return CALL_REAL(cuMemAllocFromPoolAsync, dptr, n, p, s);
    }
    return async_alloc(dptr, n, p, s, 0, call_from_pool);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s)
{
    if (!p) {
        ensure_cuda();
        return CALL_REAL(cuMemAllocFromPoolAsync_ptsz, dptr, n, p, s);
    }
    return async_alloc(dptr, n, p, s, 1, call_from_pool);
}

/* The pool keeps what was freed (up to its threshold, until a
 * synchronisation): its charge is re-read, not credited. A free of a
 * pointer not from a pool (cuMemFreeAsync also frees cuMemAlloc memory)
 * is credited. Frees during capture free nothing yet. */
static CUresult async_free(CUdeviceptr d, CUstream s, int ptsz)
{
    ensure_cuda();
    CUresult (*call)(CUdeviceptr, CUstream) = ptsz ? real_cuMemFreeAsync_ptsz : real_cuMemFreeAsync;
    if (!call)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cfg.mem_active || tl_capturing(s, ptsz))
        return call(d, s);
    uint64_t size, aux;
    int ld;
    if (tl_table_take_aux(TL_K_APTR, d, &size, &ld, &aux)) {
        /* A stream-ordered free does not shrink the reservation (that
         * happens at synchronisation, which re-reads the pool); the memory
         * is now idle in the pool, so the next synchronisation looks. */
        pthread_mutex_lock(&pool_mu);
        CUresult r = call(d, s);
        struct pool *e = pool_find((CUmemoryPool)(uintptr_t)aux);
        if (r != CUDA_SUCCESS) {
            tl_table_put_aux(TL_K_APTR, d, size, ld, aux);
        } else if (e) {
            e->idle = 1;
            any_idle = 1;
        }
        pthread_mutex_unlock(&pool_mu);
        return r;
    }
    if (tl_table_take(TL_K_PTR, d, &size, &ld)) {
        CUresult r = call(d, s);
        if (r == CUDA_SUCCESS)
            tl_release(ld, size);
        else
            tl_table_put(TL_K_PTR, d, size, ld);
        return r;
    }
    return call(d, s);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return async_free(p, s, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return async_free(p, s, 1); }

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const TL_MEM_POOL_PROPS *props)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuMemPoolCreate, p, props);
    if (r == CUDA_SUCCESS && p && props && cfg.mem_active) {
        /* a pool lives on the device its properties name */
        int ld = props->location.type == TL_MEM_LOCATION_DEVICE ? tl_ld_of_ordinal(props->location.id) : -1;
        pthread_mutex_lock(&pool_mu);
        struct pool *e = pool_add(*p, ld);
        if (e)
            e->ld = ld;
        pthread_mutex_unlock(&pool_mu);
    }
    return r;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p)
{
    ensure_cuda();
    if (!cfg.mem_active)
        return CALL_REAL(cuMemPoolDestroy, p);
    pthread_mutex_lock(&pool_mu);
    CUresult r = CALL_REAL(cuMemPoolDestroy, p);
    struct pool *e = pool_find(p);
    if (r == CUDA_SUCCESS && e) {
        tl_release(e->ld, e->charged);
        *e = pools[--npools];
    }
    pthread_mutex_unlock(&pool_mu);
    for (int o = 0; r == CUDA_SUCCESS && o < TL_MAX_DEVICES; o++)
        if (current[o] == p)
            current[o] = NULL;
    return r;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuMemPoolTrimTo, p, keep);
    if (r == CUDA_SUCCESS && cfg.mem_active) {
        pthread_mutex_lock(&pool_mu);
        struct pool *e = pool_find(p);
        if (e)
            pool_sync(e, 0);
        pthread_mutex_unlock(&pool_mu);
    }
    return r;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool p)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuDeviceSetMemPool, dev, p);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < TL_MAX_DEVICES)
        __atomic_store_n(&current[dev], p, __ATOMIC_RELAXED);
    return r;
}

/* Synchronisation is where pools give back what they keep beyond their
 * release threshold. */
EXPORT CUresult cuCtxSynchronize(void)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuCtxSynchronize);
    after_sync();
    return r;
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuStreamSynchronize, s);
    after_sync();
    return r;
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuStreamSynchronize_ptsz, s);
    after_sync();
    return r;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuEventSynchronize, e);
    after_sync();
    return r;
}

void tl_alloc_after_fork(void)
{
    pthread_mutex_init(&pool_mu, NULL);
    npools = 0; /* the child has no pools of its own yet */
    memset(current, 0, sizeof(current));
    any_idle = 0;
}
