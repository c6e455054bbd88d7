/*
 * fake_nvml.c - a stand-in libnvidia-ml.so.1 for CI. Memory info reports a
 * device of FAKE_GPU_MEM bytes with nothing used. Process utilisation is
 * simulated from the blocks launched through the fake libcuda in this
 * process: each block "costs" FAKE_BLOCK_US microseconds of a GPU that is
 * otherwise idle, so utilisation = min(100, blocks/s * cost). Other
 * processes on the GPU (other test processes, fixed neighbours) come from
 * fake_procs.h; NVML names every process by its host pid.
 * FAKE_NVML_NO_PROCLIST=1: the compute-process lists are not supported;
 * FAKE_NVML_NO_V3=1: only the _v2 and v1 lists exist; =2: only v1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "fake_api.h"
#include "fake_procs.h"
#include <stdio.h>
#include <string.h>

static struct fake_dev { unsigned idx; } devs[16];
static int ndev = 2;
static unsigned long long devmem = 16ull << 30;

nvmlReturn_t nvmlInit_v2(void)
{
    if (getenv("FAKE_NVML_FAIL"))
        return 999; /* NVML_ERROR_UNKNOWN */
    const char *m = getenv("FAKE_GPU_MEM"), *c = getenv("FAKE_GPU_COUNT");
    if (m)
        devmem = strtoull(m, NULL, 0);
    if (c)
        ndev = atoi(c);
    if (ndev < 1 || ndev > 16)
        ndev = 2;
    for (unsigned i = 0; i < 16; i++)
        devs[i].idx = i;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    if ((int)i >= ndev || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    if (!d || !i)
        return NVML_ERROR_INVALID_ARGUMENT;
    *i = ((struct fake_dev *)d)->idx;
    return NVML_SUCCESS;
}

/* Device memory this process holds through the fake libcuda (allocations,
 * contexts, graph pool), as a real NVML would see it; 0 without it. */
static unsigned long long dev_used(nvmlDevice_t d)
{
    unsigned long long (*f)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "fake_used_bytes");
    return f ? f((int)((struct fake_dev *)d)->idx) : 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, TL_NVML_MEMORY *m)
{
    if (!d || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (getenv("FAKE_NVML_MEM_FAIL"))
        return 999;
    m->total = devmem;
    m->used = dev_used(d);
    m->free = devmem - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, TL_NVML_MEMORY_V2 *m)
{
    if (!d || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = devmem;
    m->reserved = 0;
    m->used = dev_used(d);
    m->free = devmem - m->used;
    return NVML_SUCCESS;
}

/* The processes other than this one on device 0: live entries of the
 * shared table, then FAKE_NVML_NEIGHBOURS. */
struct other {
    uint32_t host_pid, util;
    uint64_t used;
};

static int others(struct other *o, int max)
{
    int k = 0;
    struct fake_procs *m = fake_procs_map();
    for (int i = 0; m && i < FAKE_PROCS_MAX && k < max; i++) {
        int32_t pid = __atomic_load_n(&m->p[i].pid, __ATOMIC_ACQUIRE);
        if (pid == getpid() || !fake_alive(pid))
            continue;
        o[k].host_pid = m->p[i].host_pid;
        o[k].util = __atomic_load_n(&m->p[i].util, __ATOMIC_RELAXED);
        o[k++].used = __atomic_load_n(&m->p[i].used, __ATOMIC_RELAXED);
    }
    const char *nb = getenv("FAKE_NVML_NEIGHBOURS");
    while (nb && *nb && k < max) {
        unsigned hp = 0, util = 0, mib = 1024;
        if (sscanf(nb, "%u:%u:%u", &hp, &util, &mib) < 2)
            break;
        o[k].host_pid = hp;
        o[k].util = util;
        o[k++].used = (uint64_t)mib << 20;
        nb = strchr(nb, ',');
        nb = nb ? nb + 1 : NULL;
    }
    return k;
}

static unsigned long long last_blocks;
static double last_t;
static unsigned last_util;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, TL_NVML_PROC_UTIL_SAMPLE *s, unsigned int *n,
                                             unsigned long long last_seen)
{
    (void)last_seen;
    if (!n || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (((struct fake_dev *)d)->idx != 0) { /* launches all go to device 0 */
        *n = 0;
        return NVML_SUCCESS;
    }
    /* FAKE_NVML_SPARSE=1: every other query has no new sample, as when
     * NVML's sampling period is longer than the limiter's */
    static unsigned calls;
    if (!s && getenv("FAKE_NVML_SPARSE") && (calls++ & 1)) {
        *n = 0;
        return NVML_SUCCESS;
    }
    if (!s || *n < 1) {
        struct other o[FAKE_PROCS_MAX * 2];
        *n = 1 + (unsigned)others(o, FAKE_PROCS_MAX * 2);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long *blocks = dlsym(RTLD_DEFAULT, "fake_launch_blocks");
    double cost_us = getenv("FAKE_BLOCK_US") ? atof(getenv("FAKE_BLOCK_US")) : 10.0;
    double t = now_s();
    unsigned long long b = blocks ? __atomic_load_n(blocks, __ATOMIC_RELAXED) : 0;
    if (last_t > 0 && t - last_t > 0.02) {
        double u = (double)(b - last_blocks) * cost_us * 1e-6 / (t - last_t) * 100.0;
        last_util = u > 100 ? 100 : (unsigned)u;
        last_blocks = b;
        last_t = t;
    } else if (last_t == 0) {
        last_blocks = b;
        last_t = t;
    }
    struct fake_proc *me = fake_proc_self();
    if (me) {
        __atomic_store_n(&me->util, last_util, __ATOMIC_RELAXED);
        __atomic_store_n(&me->used, dev_used(d), __ATOMIC_RELAXED);
    }
    struct other o[FAKE_PROCS_MAX * 2];
    int no = others(o, FAKE_PROCS_MAX * 2);
    if (*n < (unsigned)(1 + no)) {
        *n = (unsigned)(1 + no);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memset(s, 0, sizeof(*s) * (size_t)(1 + no));
    s[0].pid = fake_host_pid(getpid());
    s[0].timeStamp = (unsigned long long)(t * 1e6);
    s[0].smUtil = last_util;
    for (int i = 0; i < no; i++) {
        s[1 + i].pid = o[i].host_pid;
        s[1 + i].timeStamp = s[0].timeStamp;
        s[1 + i].smUtil = o[i].util;
    }
    *n = (unsigned)(1 + no);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, TL_NVML_UTILIZATION *u)
{
    unsigned sum = last_util;
    struct other o[FAKE_PROCS_MAX * 2];
    int no = ((struct fake_dev *)d)->idx == 0 ? others(o, FAKE_PROCS_MAX * 2) : 0;
    for (int i = 0; i < no; i++)
        sum += o[i].util;
    u->gpu = sum > 100 ? 100 : sum;
    u->memory = 0;
    return NVML_SUCCESS;
}

/* Compute-process lists: this process while it holds a context, the other
 * processes of the table and the neighbours (device 0). `stride` is the
 * size of the caller's struct version: pid at 0, usedGpuMemory at 8. */
static nvmlReturn_t running(nvmlDevice_t d, unsigned int *n, void *infos, size_t stride)
{
    if (!d || !n)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (getenv("FAKE_NVML_NO_PROCLIST"))
        return 3; /* NVML_ERROR_NOT_SUPPORTED */
    struct { uint32_t pid; uint64_t used; } e[FAKE_PROCS_MAX * 2 + 1];
    int ne = 0;
    int (*live)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_ctx_live");
    struct fake_proc *me = fake_proc_self();
    if (me)
        __atomic_store_n(&me->used, dev_used(d), __ATOMIC_RELAXED);
    if (me || (live && live() > 0)) {
        e[ne].pid = fake_host_pid(getpid());
        e[ne++].used = dev_used(d);
    }
    if (((struct fake_dev *)d)->idx == 0) {
        struct other o[FAKE_PROCS_MAX * 2];
        int no = others(o, FAKE_PROCS_MAX * 2);
        for (int i = 0; i < no; i++) {
            e[ne].pid = o[i].host_pid;
            e[ne++].used = o[i].used;
        }
    }
    if (*n < (unsigned)ne || (ne && !infos)) {
        *n = (unsigned)ne;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < ne; i++) {
        unsigned char *p = (unsigned char *)infos + (size_t)i * stride;
        memset(p, 0, stride);
        memcpy(p, &e[i].pid, 4);
        memcpy(p + 8, &e[i].used, 8);
    }
    *n = (unsigned)ne;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, void *infos)
{
    if (getenv("FAKE_NVML_NO_V3"))
        return 13; /* NVML_ERROR_FUNCTION_NOT_FOUND */
    return running(d, n, infos, 24);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, void *infos)
{
    const char *no = getenv("FAKE_NVML_NO_V3");
    if (no && *no == '2')
        return 13;
    return running(d, n, infos, 24);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n, void *infos)
{
    return running(d, n, infos, 16);
}
