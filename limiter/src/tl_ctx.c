/*
 * tl_ctx.c - contexts, their limits, and module loads.
 *
 * Each context is charged its own device memory: at cuCtxCreate (every
 * version; released at cuCtxDestroy) and once per device for the primary
 * context (charged on the process's first cuDevicePrimaryCtxRetain,
 * released when its retain count returns to zero or on reset).
 * TESSERA_CONTEXT_RESERVE / context_reserve fixes the amount (0 = off). By
 * default the first context this process creates or activates on a device
 * is measured: the drop in the device's free memory across the real call,
 * as NVML reports it (no driver call reports free memory before a context
 * exists), clamped to [CTX_MIN, CTX_MAX], or CTX_FALLBACK when NVML cannot
 * tell. Later contexts on that device are charged the same amount.
 *
 * cuCtxSetLimit: the malloc heap and the printf FIFO are charged their
 * size above what the context had, the stack its size above the context's
 * for every thread the device can hold at once (SMs x threads per SM), when
 * the limit is raised; refused with CUDA_ERROR_OUT_OF_MEMORY (the limit
 * unchanged) when that does not fit.
 *
 * Module loads: their globals take device memory no call reports; a load
 * marks the device for reconciliation with NVML at the next allocation.
 */
#include "tl_compat.h"

#include <string.h>

#include "tl_internal.h"

#define CTX_MIN (32ull << 20)
#define CTX_MAX (2ull << 30)
#define CTX_FALLBACK (256ull << 20)

static pthread_mutex_t prim_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t limit_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned prim_refs[TL_MAX_DEVICES];     /* per ordinal */
static uint64_t prim_charge[TL_MAX_DEVICES];   /* per ordinal: charged for the primary context */
static CUcontext prim_ctx[TL_MAX_DEVICES];     /* per ordinal */
static uint64_t ctx_size[TL_MAX_DEVICES];      /* per ld: measured footprint, 0 = not yet */

int tl_ctx_ordinal(CUcontext c)
{
    for (int o = 0; c && o < TL_MAX_DEVICES; o++)
        if (__atomic_load_n(&prim_ctx[o], __ATOMIC_RELAXED) == c)
            return o;
    uint64_t s, aux;
    int ld;
    if (tl_table_get_aux(TL_K_CTX, (uintptr_t)c, &s, &ld, &aux) && aux)
        return (int)aux - 1;
    return -1;
}

typedef struct {
    int ver;
    CUcontext *pctx;
    void *params;
    int nparams;
    unsigned flags;
    CUdevice dev; /* ordinal */
    int ld;
} ctx_args;

/* Run `call`, which creates or activates a context on a->dev, with the
 * context's footprint charged (check-and-reserve when the size is known;
 * when it is being measured, charge afterwards and `undo` if over the
 * limit). *charged gets what was charged (0 when nothing is tracked). */
static CUresult with_ctx_charge(ctx_args *a, CUresult (*call)(ctx_args *), void (*undo)(ctx_args *),
                                uint64_t *charged)
{
    int ld = a->ld;
    *charged = 0;
    if (!tl_limit_of(ld) || (cfg.ctx_reserve_set && !cfg.ctx_reserve))
        return call(a);
    if (ld < 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* a device the limits file does not list */
    uint64_t n = cfg.ctx_reserve_set ? cfg.ctx_reserve : __atomic_load_n(&ctx_size[ld], __ATOMIC_ACQUIRE);
    int measure = n == 0;
    if (measure) {
        pthread_mutex_lock(&ctx_mu);
        n = ctx_size[ld]; /* another thread may have measured meanwhile */
        measure = n == 0;
        if (!measure)
            pthread_mutex_unlock(&ctx_mu);
    }
    if (!measure) {
        int c = tl_reserve(ld, n);
        if (c < 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult r = call(a);
        if (c > 0 && r != CUDA_SUCCESS)
            tl_release(ld, n);
        else if (c > 0)
            *charged = n;
        return r;
    }
    uint64_t before = 0, after = 0;
    int ok = tl_nvml_free(ld, &before) == 0;
    CUresult r = call(a);
    if (r == CUDA_SUCCESS) {
        ok = ok && tl_nvml_free(ld, &after) == 0;
        n = !ok ? CTX_FALLBACK : before > after ? before - after : 0;
        n = n < CTX_MIN ? CTX_MIN : n > CTX_MAX ? CTX_MAX : n;
        __atomic_store_n(&ctx_size[ld], n, __ATOMIC_RELEASE);
        int c = tl_reserve(ld, n);
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
    case 1: return CALL_REAL(cuCtxCreate, a->pctx, a->flags, a->dev);
    case 3: return CALL_REAL(cuCtxCreate_v3, a->pctx, a->params, a->nparams, a->flags, a->dev);
    case 4: return CALL_REAL(cuCtxCreate_v4, a->pctx, a->params, a->flags, a->dev);
    default: return CALL_REAL(cuCtxCreate_v2, a->pctx, a->flags, a->dev);
    }
}

static void ctx_create_undo(ctx_args *a) { (void)CALL_REAL(cuCtxDestroy_v2, *a->pctx); }

static CUresult ctx_create(ctx_args *a)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!cfg.mem_active || !a->pctx) {
        int hp_ = tl_hp_ctx_begin(a->dev);
        CUresult r = ctx_create_real(a);
        tl_hp_ctx_end(a->dev, hp_, r);
        return r;
    }
    a->ld = tl_ld_of_ordinal(a->dev);
    tl_account_prepare(a->ld, 0);
    int hp_ = tl_hp_ctx_begin(a->dev);
    uint64_t n;
    CUresult r = with_ctx_charge(a, ctx_create_real, ctx_create_undo, &n);
    if (r == CUDA_SUCCESS &&
        tl_table_put_aux(TL_K_CTX, (uintptr_t)*a->pctx, n, a->ld, (uint64_t)a->dev + 1) != 0) {
        ctx_create_undo(a);
        tl_release(a->ld, n);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    tl_hp_ctx_end(a->dev, hp_, r);
    return r;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ctx_args a = {1, pctx, NULL, 0, flags, dev, -1};
    return ctx_create(&a);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ctx_args a = {2, pctx, NULL, 0, flags, dev, -1};
    return ctx_create(&a);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *affinity, int n, unsigned int flags, CUdevice dev)
{
    ctx_args a = {3, pctx, affinity, n, flags, dev, -1};
    return ctx_create(&a);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
    ctx_args a = {4, pctx, params, 0, flags, dev, -1};
    return ctx_create(&a);
}

/* with limit_mu held: give back what a context's limits were charged */
static void drop_limits(CUcontext c)
{
    for (int l = 0; l < 3; l++) {
        uint64_t s;
        int ld;
        if (tl_table_take(TL_K_LIMIT, (uint64_t)(uintptr_t)c * 4 + (uint64_t)l, &s, &ld))
            tl_release(ld, s);
    }
}

static CUresult ctx_destroy(CUcontext ctx, int v1)
{
    ensure_cuda();
    CUresult (*call)(CUcontext) = v1 ? real_cuCtxDestroy : real_cuCtxDestroy_v2;
    if (!call)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cfg.mem_active)
        return call(ctx);
    uint64_t size, aux;
    int ld;
    int had = tl_table_take_aux(TL_K_CTX, (uintptr_t)ctx, &size, &ld, &aux);
    CUresult r = call(ctx);
    if (had && r != CUDA_SUCCESS) {
        tl_table_put_aux(TL_K_CTX, (uintptr_t)ctx, size, ld, aux);
    } else if (r == CUDA_SUCCESS) {
        if (had)
            tl_release(ld, size);
        pthread_mutex_lock(&limit_mu);
        drop_limits(ctx);
        pthread_mutex_unlock(&limit_mu);
    }
    return r;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return ctx_destroy(ctx, 1); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(ctx, 0); }

static CUresult prim_retain_real(ctx_args *a) { return CALL_REAL(cuDevicePrimaryCtxRetain, a->pctx, a->dev); }
static void prim_retain_undo(ctx_args *a) { (void)CALL_REAL(cuDevicePrimaryCtxRelease_v2, a->dev); }

static CUresult primary_retain(CUcontext *pctx, CUdevice dev)
{
    if (!cfg.mem_active || dev < 0 || dev >= TL_MAX_DEVICES || (cfg.ctx_reserve_set && !cfg.ctx_reserve)) {
        CUresult r = CALL_REAL(cuDevicePrimaryCtxRetain, pctx, dev);
        if (r == CUDA_SUCCESS && pctx && dev >= 0 && dev < TL_MAX_DEVICES)
            __atomic_store_n(&prim_ctx[dev], *pctx, __ATOMIC_RELAXED);
        return r;
    }
    ctx_args a = {0, pctx, NULL, 0, 0, dev, tl_ld_of_ordinal(dev)};
    pthread_mutex_lock(&prim_mu);
    CUresult r;
    if (prim_refs[dev] == 0)
        r = with_ctx_charge(&a, prim_retain_real, prim_retain_undo, &prim_charge[dev]);
    else
        r = prim_retain_real(&a);
    if (r == CUDA_SUCCESS) {
        prim_refs[dev]++;
        if (pctx)
            __atomic_store_n(&prim_ctx[dev], *pctx, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&prim_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_OUT_OF_MEMORY;
    tl_account_prepare(tl_ld_of_ordinal(dev), 0);
    int hp_ = tl_hp_ctx_begin(dev);
    CUresult r = primary_retain(pctx, dev);
    tl_hp_ctx_end(dev, hp_, r);
    return r;
}

static CUresult primary_drop(CUdevice dev, int all, CUresult r)
{
    if (r != CUDA_SUCCESS || !cfg.mem_active || dev < 0 || dev >= TL_MAX_DEVICES)
        return r;
    pthread_mutex_lock(&prim_mu);
    if (prim_refs[dev] > 0) {
        prim_refs[dev] = all ? 0 : prim_refs[dev] - 1;
        if (prim_refs[dev] == 0) {
            if (prim_charge[dev]) {
                tl_release(tl_ld_of_ordinal(dev), prim_charge[dev]);
                prim_charge[dev] = 0;
            }
            pthread_mutex_lock(&limit_mu);
            drop_limits(prim_ctx[dev]);
            pthread_mutex_unlock(&limit_mu);
        }
    }
    pthread_mutex_unlock(&prim_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    ensure_cuda();
    return primary_drop(dev, 0, CALL_REAL(cuDevicePrimaryCtxRelease, dev));
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ensure_cuda();
    return primary_drop(dev, 0, CALL_REAL(cuDevicePrimaryCtxRelease_v2, dev));
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    ensure_cuda();
    return primary_drop(dev, 1, CALL_REAL(cuDevicePrimaryCtxReset, dev));
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ensure_cuda();
    return primary_drop(dev, 1, CALL_REAL(cuDevicePrimaryCtxReset_v2, dev));
}

/* ---- limits ---- */

static uint64_t threads_per_device[TL_MAX_DEVICES]; /* per ordinal, 0 = not read yet */

static uint64_t resident_threads(int ord)
{
    if (ord < 0 || ord >= TL_MAX_DEVICES)
        return 0;
    uint64_t t = __atomic_load_n(&threads_per_device[ord], __ATOMIC_RELAXED);
    if (t)
        return t;
    int sms = 0, per = 0;
    if (!real_cuDeviceGetAttribute ||
        real_cuDeviceGetAttribute(&sms, TL_DEV_ATTR_MULTIPROCESSOR_COUNT, ord) != CUDA_SUCCESS ||
        real_cuDeviceGetAttribute(&per, TL_DEV_ATTR_MAX_THREADS_PER_MULTIPROCESSOR, ord) != CUDA_SUCCESS ||
        sms <= 0 || per <= 0)
        return 0;
    t = (uint64_t)sms * (uint64_t)per;
    __atomic_store_n(&threads_per_device[ord], t, __ATOMIC_RELAXED);
    return t;
}

EXPORT CUresult cuCtxSetLimit(int limit, size_t value)
{
    ensure_cuda();
    int mem = limit == TL_LIMIT_STACK_SIZE || limit == TL_LIMIT_PRINTF_FIFO_SIZE || limit == TL_LIMIT_MALLOC_HEAP_SIZE;
    if (UNLIKELY(cfg.error) && mem)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!cfg.mem_active || !mem)
        return CALL_REAL(cuCtxSetLimit, limit, value);
    CUcontext ctx = NULL;
    if (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return CALL_REAL(cuCtxSetLimit, limit, value); /* no context: the driver refuses it */
    int ord = tl_current_ordinal(), ld = tl_ld_of_ordinal(ord);
    if (!tl_limit_of(ld))
        return CALL_REAL(cuCtxSetLimit, limit, value);
    uint64_t mult = limit == TL_LIMIT_STACK_SIZE ? resident_threads(ord) : 1;
    if (!mult)
        mult = 2048ull * 256; /* unknown device: a large GPU's worth of threads */
    tl_account_prepare(ld, 0);
    pthread_mutex_lock(&limit_mu);
    uint64_t key = (uint64_t)(uintptr_t)ctx * 4 + (uint64_t)limit, charged = 0, base = 0;
    int eld;
    if (!tl_table_get_aux(TL_K_LIMIT, key, &charged, &eld, &base)) {
        size_t cur = 0;
        if (real_cuCtxGetLimit && real_cuCtxGetLimit(&cur, limit) == CUDA_SUCCESS)
            base = cur; /* part of the context's own footprint */
        charged = 0;
    }
    uint64_t want = value > base ? (value - base) : 0;
    want = want > UINT64_MAX / mult ? UINT64_MAX : want * mult;
    int c = 0;
    if (want > charged && (c = tl_reserve(ld, want - charged)) < 0) {
        pthread_mutex_unlock(&limit_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = CALL_REAL(cuCtxSetLimit, limit, value);
    if (r != CUDA_SUCCESS) {
        if (c > 0)
            tl_release(ld, want - charged);
    } else {
        if (want < charged)
            tl_release(ld, charged - want);
        if (tl_table_put_aux(TL_K_LIMIT, key, want, ld, base) != 0 && want)
            tl_release(ld, want); /* untracked: not charged (reconciliation sees it) */
    }
    pthread_mutex_unlock(&limit_mu);
    tl_mark_dirty(ld);
    return r;
}

/* ---- module loads ---- */

#define MODULE_BODY(all, call)                                                     \
    ensure_cuda();                                                                 \
    CUresult r_ = call;                                                            \
    if (r_ == CUDA_SUCCESS && cfg.mem_active)                                      \
        tl_mark_dirty((all) ? -1 : tl_ld_of_ordinal(tl_current_ordinal()));        \
    return r_;

EXPORT CUresult cuModuleLoad(CUmodule *m, const char *f) { MODULE_BODY(0, CALL_REAL(cuModuleLoad, m, f)) }
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *img) { MODULE_BODY(0, CALL_REAL(cuModuleLoadData, m, img)) }
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *img, unsigned int n, void *opts, void **vals)
{
    MODULE_BODY(0, CALL_REAL(cuModuleLoadDataEx, m, img, n, opts, vals))
}
EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fb)
{
    MODULE_BODY(0, CALL_REAL(cuModuleLoadFatBinary, m, fb))
}
/* libraries load into every context, lazily */
EXPORT CUresult cuLibraryLoadData(CUlibrary *l, const void *code, void *jo, void **jv, unsigned int nj, void *lo,
                                  void **lv, unsigned int nl)
{
    MODULE_BODY(1, CALL_REAL(cuLibraryLoadData, l, code, jo, jv, nj, lo, lv, nl))
}
EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *f, void *jo, void **jv, unsigned int nj, void *lo,
                                      void **lv, unsigned int nl)
{
    MODULE_BODY(1, CALL_REAL(cuLibraryLoadFromFile, l, f, jo, jv, nj, lo, lv, nl))
}

void tl_ctx_after_fork(void)
{
    pthread_mutex_init(&prim_mu, NULL);
    pthread_mutex_init(&ctx_mu, NULL);
    pthread_mutex_init(&limit_mu, NULL);
    memset(prim_refs, 0, sizeof(prim_refs));
    memset(prim_charge, 0, sizeof(prim_charge));
    memset(prim_ctx, 0, sizeof(prim_ctx));
}
