/*
 * fake_nvml.c - a stand-in libnvidia-ml.so.1 for CI. Memory info reports a
 * device of FAKE_GPU_MEM bytes with nothing used. Process utilisation is
 * simulated from the blocks launched through the fake libcuda in this
 * process: each block "costs" FAKE_BLOCK_US microseconds of a GPU that is
 * otherwise idle, so utilisation = min(100, blocks/s * cost).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "fake_api.h"

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
        *n = 1;
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
    /* FAKE_NVML_PID_OFFSET imitates a container whose pids differ from
     * the host pids NVML reports */
    const char *off = getenv("FAKE_NVML_PID_OFFSET");
    s[0].pid = (unsigned)getpid() + (off ? (unsigned)atoi(off) : 0u);
    s[0].timeStamp = (unsigned long long)(t * 1e6);
    s[0].smUtil = last_util;
    s[0].memUtil = 0;
    s[0].encUtil = 0;
    s[0].decUtil = 0;
    *n = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, TL_NVML_UTILIZATION *u)
{
    (void)d;
    u->gpu = last_util;
    u->memory = 0;
    return NVML_SUCCESS;
}
