/*
 * tl_report.c - what a limited container is told about its GPUs.
 *
 * Memory: total = min(limit, real total); free = min(total - the
 * container's usage, the real free memory), never negative. With a
 * ceiling (guaranteed plus burst) total is the ceiling and free what the
 * container may still charge now (guarantee plus what the budget lends,
 * minus its usage). The same rule
 * through cuMemGetInfo and NVML, so both report the same free memory when
 * they see the same device (NVML's used = total - free, reserved = 0).
 *
 * Processes: NVML's process lists and per-process utilisation (what
 * nvidia-smi shows) are filtered to the container's own processes, by the
 * host pids they published in the shared state: other tenants' pids,
 * memory and utilisation are not shown.
 */
#include "tl_compat.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tl_internal.h"

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuMemGetInfo_v2, free_b, total_b);
    if (r != CUDA_SUCCESS || !cfg.mem_active || !free_b || !total_b)
        return r;
    int ld = tl_ld_of_ordinal(tl_current_ordinal());
    uint64_t lim = tl_limit_of(ld);
    if (!lim || ld < 0)
        return r;
    tl_pools_resync(ld);
    tl_account_prepare(ld, 0);
    tl_shared_maybe_reclaim(&sh, 1000000000ull);
    uint64_t used = tl_shared_used(&sh, ld), cap = tl_total_of(ld), now = tl_alloc_limit(ld);
    uint64_t total = cap < *total_b ? cap : *total_b;
    if (now > total)
        now = total;
    uint64_t free_ = used < now ? now - used : 0;
    if (free_ > *free_b)
        free_ = *free_b;
    *total_b = total;
    *free_b = free_;
    return r;
}

/* legacy v1: 32-bit sizes */
EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    size_t f = 0, t = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS && free_b && total_b) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total_b = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuDeviceTotalMem_v2, bytes, dev);
    if (r == CUDA_SUCCESS && cfg.mem_active && bytes) {
        int ld = tl_ld_of_ordinal(dev);
        uint64_t lim = tl_total_of(ld);
        if (lim && lim < *bytes)
            *bytes = lim;
    }
    return r;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b = 0;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS && bytes)
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned)b;
    return r;
}

/* NVML: the same rule as cuMemGetInfo. */
static void nvml_adjust(nvmlDevice_t d, unsigned long long *total, unsigned long long *freep,
                        unsigned long long *used)
{
    if (!cfg.mem_active)
        return;
    int ld = tl_ld_of_nvml(d);
    uint64_t lim = tl_limit_of(ld);
    if (!lim)
        return;
    if (ld < 0) { /* a GPU the limits file does not give this container */
        *total = *freep = *used = 0;
        return;
    }
    uint64_t cap = tl_total_of(ld), t = cap < *total ? cap : *total;
    tl_budget_refresh(ld, 0);
    tl_shared_maybe_reclaim(&sh, 1000000000ull);
    uint64_t u = tl_shared_used(&sh, ld), now = tl_alloc_limit(ld);
    if (now > t)
        now = t;
    uint64_t f = u < now ? now - u : 0;
    if (f > *freep)
        f = *freep; /* never more than the GPU really has free */
    *total = t;
    *freep = f;
    *used = t - f;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, TL_NVML_MEMORY *m)
{
    ensure_nvml();
    nvmlReturn_t r = CALL_NVML(nvmlDeviceGetMemoryInfo, d, m);
    if (r == NVML_SUCCESS && m)
        nvml_adjust(d, &m->total, &m->free, &m->used);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, TL_NVML_MEMORY_V2 *m)
{
    ensure_nvml();
    nvmlReturn_t r = CALL_NVML(nvmlDeviceGetMemoryInfo_v2, d, m);
    if (r == NVML_SUCCESS && m && cfg.mem_active) {
        unsigned long long freep = m->free;
        nvml_adjust(d, &m->total, &freep, &m->used);
        m->free = freep;
        m->reserved = 0;
        m->used = m->total - m->free;
    }
    return r;
}

/* ------------------------------------------------------------------ */
/* process lists                                                       */

static int filtering(void)
{
    return cfg.mem_active || cfg.sm_active || cfg.error;
}

static int ours(const int32_t *pids, int n, uint32_t pid)
{
    for (int i = 0; i < n; i++)
        if ((uint32_t)pids[i] == pid)
            return 1;
    return 0;
}

/* Keep the entries (stride bytes, pid at pid_off) that are the
 * container's; returns how many, compacted at the front. */
static unsigned keep_ours(unsigned char *buf, unsigned n, size_t stride, size_t pid_off)
{
    int32_t pids[TL_MAX_PROCS + 1];
    int np = tl_container_host_pids(pids, TL_MAX_PROCS + 1);
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++) {
        uint32_t pid;
        memcpy(&pid, buf + i * stride + pid_off, 4);
        if (ours(pids, np, pid)) {
            if (k != i)
                memmove(buf + k * stride, buf + i * stride, stride);
            k++;
        }
    }
    return k;
}

#define MAXLIST 1024

/* The stride the library wrote: 24, or 32 in the drivers whose _v3 entries
 * carry usedGpuCcProtectedMemory. The buffer was filled with 0xa5 before the
 * call: bytes between n*24 and n*32 are written only with the larger one. */
static size_t written_stride(const unsigned char *buf, unsigned n)
{
    for (size_t i = (size_t)n * TL_PROCINFO_V2; i < (size_t)n * TL_PROCINFO_V3_CC; i++)
        if (buf[i] != 0xa5)
            return TL_PROCINFO_V3_CC;
    return TL_PROCINFO_V2;
}

static nvmlReturn_t list(const char *name, nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, void *), nvmlDevice_t d,
                         unsigned int *count, void *infos, size_t stride)
{
    tl_trace("nvml-list %s filtering %d", name, filtering());
    if (!fn)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!filtering() || !count)
        return fn(d, count, infos);
    unsigned char *buf = malloc(MAXLIST * TL_PROCINFO_V3_CC);
    if (!buf)
        return NVML_ERROR_UNKNOWN;
    unsigned n = MAXLIST;
    memset(buf, 0xa5, MAXLIST * TL_PROCINFO_V3_CC);
    nvmlReturn_t r = fn(d, &n, buf);
    if (r == NVML_SUCCESS) {
        if (stride == 0)
            stride = written_stride(buf, n);
        unsigned k = keep_ours(buf, n, stride, 0);
        /* the container's entries only: how many others there were is
         * what the filter hides */
        tl_trace("nvml-list %s: %u entries kept (stride %zu)", name, k, stride);
        if (!infos || *count < k) {
            r = k ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
        } else {
            memcpy(infos, buf, (size_t)k * stride);
        }
        *count = k;
    }
    free(buf);
    return r;
}

#define LIST_HOOK(name, stride)                                                   \
    EXPORT nvmlReturn_t name(nvmlDevice_t d, unsigned int *count, void *infos)    \
    {                                                                             \
        ensure_nvml();                                                            \
        return list(#name, real_##name, d, count, infos, stride);                 \
    }
LIST_HOOK(nvmlDeviceGetComputeRunningProcesses, TL_PROCINFO_V1)
LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v2, TL_PROCINFO_V2)
LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v3, 0)
LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses, TL_PROCINFO_V1)
LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v2, TL_PROCINFO_V2)
LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v3, 0)
LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses, TL_PROCINFO_V1)
LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v2, TL_PROCINFO_V2)
LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v3, 0)

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, TL_NVML_PROC_UTIL_SAMPLE *s, unsigned int *count,
                                                    unsigned long long last)
{
    ensure_nvml();
    if (!real_nvmlDeviceGetProcessUtilization)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!filtering() || !count)
        return real_nvmlDeviceGetProcessUtilization(d, s, count, last);
    TL_NVML_PROC_UTIL_SAMPLE *buf = calloc(MAXLIST, sizeof(*buf));
    if (!buf)
        return NVML_ERROR_UNKNOWN;
    unsigned n = MAXLIST;
    nvmlReturn_t r = real_nvmlDeviceGetProcessUtilization(d, buf, &n, last);
    if (r == NVML_SUCCESS) {
        unsigned k = keep_ours((unsigned char *)buf, n, sizeof(buf[0]), offsetof(TL_NVML_PROC_UTIL_SAMPLE, pid));
        if (!s || *count < k) {
            r = k ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_ERROR_NOT_FOUND;
        } else {
            memcpy(s, buf, k * sizeof(buf[0]));
            r = k ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
        }
        *count = k;
    }
    free(buf);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, TL_NVML_PROCS_UTIL_INFO *info)
{
    ensure_nvml();
    if (!real_nvmlDeviceGetProcessesUtilizationInfo)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!filtering() || !info)
        return real_nvmlDeviceGetProcessesUtilizationInfo(d, info);
    if (info->version != 1 && info->version >> 24 != 1)
        return NVML_ERROR_NOT_SUPPORTED; /* a layout this limiter cannot filter */
    TL_NVML_PROC_UTIL_INFO *buf = calloc(MAXLIST, sizeof(*buf));
    if (!buf)
        return NVML_ERROR_UNKNOWN;
    TL_NVML_PROCS_UTIL_INFO mine = *info;
    mine.processSamplesCount = MAXLIST;
    mine.procUtilArray = buf;
    nvmlReturn_t r = real_nvmlDeviceGetProcessesUtilizationInfo(d, &mine);
    if (r == NVML_SUCCESS) {
        unsigned k = keep_ours((unsigned char *)buf, mine.processSamplesCount, sizeof(buf[0]),
                               offsetof(TL_NVML_PROC_UTIL_INFO, pid));
        info->lastSeenTimeStamp = mine.lastSeenTimeStamp;
        if (!info->procUtilArray || info->processSamplesCount < k)
            r = k ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
        else
            memcpy(info->procUtilArray, buf, k * sizeof(buf[0]));
        info->processSamplesCount = k;
    }
    free(buf);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, TL_NVML_PROC_DETAIL_LIST *l)
{
    ensure_nvml();
    if (!real_nvmlDeviceGetRunningProcessDetailList)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!filtering() || !l)
        return real_nvmlDeviceGetRunningProcessDetailList(d, l);
    if (l->version != 1 && l->version >> 24 != 1)
        return NVML_ERROR_NOT_SUPPORTED;
    TL_NVML_PROC_DETAIL *buf = calloc(MAXLIST, sizeof(*buf));
    if (!buf)
        return NVML_ERROR_UNKNOWN;
    TL_NVML_PROC_DETAIL_LIST mine = *l;
    mine.numProcArrayEntries = MAXLIST;
    mine.procArray = buf;
    nvmlReturn_t r = real_nvmlDeviceGetRunningProcessDetailList(d, &mine);
    if (r == NVML_SUCCESS) {
        unsigned k = keep_ours((unsigned char *)buf, mine.numProcArrayEntries, sizeof(buf[0]),
                               offsetof(TL_NVML_PROC_DETAIL, pid));
        tl_trace("nvml-list nvmlDeviceGetRunningProcessDetailList: %u entries kept", k);
        if (!l->procArray || l->numProcArrayEntries < k)
            r = k ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
        else
            memcpy(l->procArray, buf, k * sizeof(buf[0]));
        l->numProcArrayEntries = k;
    }
    free(buf);
    return r;
}
