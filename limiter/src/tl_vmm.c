/*
 * tl_vmm.c - the virtual memory management API (cuMemCreate, cuMemMap,
 * cuMemUnmap, cuMemRelease, cuMemRetainAllocationHandle,
 * cuMemImportFromShareableHandle), used by NCCL, PyTorch's expandable
 * segments and Triton.
 *
 * The physical memory of cuMemCreate lives until its handle is released
 * (once per create and per cuMemRetainAllocationHandle, which hands back the
 * same handle) and its last mapping is unmapped; creating, mapping and
 * releasing at once is the common idiom. So its charge follows the same
 * life: counted from the create until both the references and the mappings
 * are gone. A handle imported from a shareable handle refers to memory
 * created (and charged) elsewhere, by the exporting process; it is not
 * charged again. Only device-located memory is charged; for any other
 * location the location id is not a device and is never read.
 */
#include "tl_compat.h"

#include <stdlib.h>
#include <string.h>

#include "tl_internal.h"

static pthread_mutex_t vmm_mu = PTHREAD_MUTEX_INITIALIZER;

/* mappings of charged handles, sorted by address */
static struct mapping {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle h;
} *maps;
static size_t nmaps, capmaps;

#define REFS(aux) ((uint32_t)(aux))
#define MAPS(aux) ((uint32_t)((aux) >> 32))
#define AUX(refs, maps) ((uint64_t)(refs) | (uint64_t)(maps) << 32)

/* with vmm_mu held: change a handle's counts; credit its charge when both
 * reach zero. */
static void counts(CUmemGenericAllocationHandle h, int drefs, int dmaps)
{
    uint64_t size, aux;
    int ld;
    if (!tl_table_get_aux(TL_K_HANDLE, h, &size, &ld, &aux))
        return;
    uint32_t r = REFS(aux), m = MAPS(aux);
    r = drefs < 0 && r == 0 ? 0 : r + (uint32_t)drefs;
    m = dmaps < 0 && m == 0 ? 0 : m + (uint32_t)dmaps;
    if (r == 0 && m == 0) {
        tl_table_take(TL_K_HANDLE, h, NULL, NULL);
        tl_release(ld, size);
    } else {
        tl_table_put_aux(TL_K_HANDLE, h, size, ld, AUX(r, m));
    }
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const TL_MEM_ALLOCATION_PROP *prop,
                            unsigned long long flags)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!cfg.mem_active || !prop || !handle || prop->location.type != TL_MEM_LOCATION_DEVICE)
        return CALL_REAL(cuMemCreate, handle, size, prop, flags);
    int ld = tl_ld_of_ordinal(prop->location.id);
    tl_account_prepare(ld, size);
    int c = tl_reserve(ld, size);
    if (c < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&vmm_mu);
    CUresult r = CALL_REAL(cuMemCreate, handle, size, prop, flags);
    for (double until = 0; r == CUDA_ERROR_OUT_OF_MEMORY && c > 0;) {
        pthread_mutex_unlock(&vmm_mu); /* tl_reclaim_retry waits: no lock held */
        int again = tl_reclaim_retry(ld, size, &until);
        pthread_mutex_lock(&vmm_mu);
        if (!again)
            break;
        r = CALL_REAL(cuMemCreate, handle, size, prop, flags);
    }
    if (c > 0) {
        if (r != CUDA_SUCCESS) {
            tl_release(ld, size);
        } else if (tl_table_put_aux(TL_K_HANDLE, *handle, size, ld, AUX(1, 0)) != 0) {
            CALL_REAL(cuMemRelease, *handle);
            tl_release(ld, size);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&vmm_mu);
    if (c > 0 && r == CUDA_SUCCESS)
        tl_hp_after_alloc(ld); /* as tl_track: a memory-only process's host pid (outside vmm_mu) */
    return r;
}

/* The entry is updated under vmm_mu around the real call: the driver may
 * hand the same handle value to another thread's cuMemCreate as soon as
 * this release returns. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    ensure_cuda();
    if (!cfg.mem_active)
        return CALL_REAL(cuMemRelease, h);
    pthread_mutex_lock(&vmm_mu);
    CUresult r = CALL_REAL(cuMemRelease, h);
    if (r == CUDA_SUCCESS)
        counts(h, -1, 0);
    pthread_mutex_unlock(&vmm_mu);
    return r;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    ensure_cuda();
    if (!cfg.mem_active)
        return CALL_REAL(cuMemRetainAllocationHandle, h, addr);
    pthread_mutex_lock(&vmm_mu);
    CUresult r = CALL_REAL(cuMemRetainAllocationHandle, h, addr);
    if (r == CUDA_SUCCESS && h)
        counts(*h, +1, 0);
    pthread_mutex_unlock(&vmm_mu);
    return r;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type)
{
    /* memory created elsewhere: charged where it was created */
    ensure_cuda();
    return CALL_REAL(cuMemImportFromShareableHandle, h, os, type);
}

EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h,
                         unsigned long long flags)
{
    ensure_cuda();
    if (!cfg.mem_active)
        return CALL_REAL(cuMemMap, va, size, off, h, flags);
    pthread_mutex_lock(&vmm_mu);
    CUresult r = CALL_REAL(cuMemMap, va, size, off, h, flags);
    uint64_t s, aux;
    int ld;
    if (r == CUDA_SUCCESS && tl_table_get_aux(TL_K_HANDLE, h, &s, &ld, &aux)) {
        if (nmaps == capmaps) {
            size_t nc = capmaps ? capmaps * 2 : 64;
            struct mapping *n = realloc(maps, nc * sizeof(*maps));
            if (!n) { /* cannot follow it: keep it charged for good rather than credit early */
                counts(h, +1, 0);
                pthread_mutex_unlock(&vmm_mu);
                return r;
            }
            maps = n;
            capmaps = nc;
        }
        size_t i = nmaps;
        while (i > 0 && maps[i - 1].va > va)
            i--;
        memmove(&maps[i + 1], &maps[i], (nmaps - i) * sizeof(*maps));
        maps[i].va = va;
        maps[i].size = size;
        maps[i].h = h;
        nmaps++;
        counts(h, 0, +1);
    }
    pthread_mutex_unlock(&vmm_mu);
    return r;
}

/* Unmaps every mapping inside [va, va + size). */
EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size)
{
    ensure_cuda();
    if (!cfg.mem_active)
        return CALL_REAL(cuMemUnmap, va, size);
    pthread_mutex_lock(&vmm_mu);
    CUresult r = CALL_REAL(cuMemUnmap, va, size);
    if (r == CUDA_SUCCESS) {
        size_t k = 0;
        for (size_t i = 0; i < nmaps; i++) {
            if (maps[i].va >= va && maps[i].va - va < size)
                counts(maps[i].h, 0, -1);
            else
                maps[k++] = maps[i];
        }
        nmaps = k;
    }
    pthread_mutex_unlock(&vmm_mu);
    return r;
}

void tl_vmm_after_fork(void)
{
    pthread_mutex_init(&vmm_mu, NULL);
    maps = NULL; /* the parent's copy is left behind, deliberately */
    nmaps = capmaps = 0;
}
