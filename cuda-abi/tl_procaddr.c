/* tl_procaddr.c - see tl_procaddr.h. */
#include "tl_procaddr.h"

#include <stdio.h>
#include <string.h>

#define PTSZ_FLAG 0x2ull /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */

typedef struct {
    const char *base;  /* name asked for */
    const char *name;  /* exported variant */
    int since;         /* CUDA version that introduced it */
    int ptsz;          /* has a _ptsz form */
} variant;

/* Grouped by base, oldest variant first. */
static const variant table[] = {
    {"cuInit", "cuInit", 2000, 0},
    {"cuGetProcAddress", "cuGetProcAddress", 11030, 0},
    {"cuGetProcAddress", "cuGetProcAddress_v2", 12000, 0},
    {"cuMemAlloc", "cuMemAlloc", 2000, 0},
    {"cuMemAlloc", "cuMemAlloc_v2", 3020, 0},
    {"cuMemAllocPitch", "cuMemAllocPitch", 2000, 0},
    {"cuMemAllocPitch", "cuMemAllocPitch_v2", 3020, 0},
    {"cuMemAllocManaged", "cuMemAllocManaged", 6000, 0},
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, 1},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, 1},
    {"cuMemFree", "cuMemFree", 2000, 0},
    {"cuMemFree", "cuMemFree_v2", 3020, 0},
    {"cuMemFreeAsync", "cuMemFreeAsync", 11020, 1},
    {"cuMemCreate", "cuMemCreate", 10020, 0},
    {"cuMemRelease", "cuMemRelease", 10020, 0},
    {"cuMemMap", "cuMemMap", 10020, 0},
    {"cuMemUnmap", "cuMemUnmap", 10020, 0},
    {"cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 11000, 0},
    {"cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", 10020, 0},
    {"cuMemPoolCreate", "cuMemPoolCreate", 11020, 0},
    {"cuMemPoolDestroy", "cuMemPoolDestroy", 11020, 0},
    {"cuMemPoolTrimTo", "cuMemPoolTrimTo", 11020, 0},
    {"cuDeviceSetMemPool", "cuDeviceSetMemPool", 11020, 0},
    {"cuArrayCreate", "cuArrayCreate", 2000, 0},
    {"cuArrayCreate", "cuArrayCreate_v2", 3020, 0},
    {"cuArray3DCreate", "cuArray3DCreate", 2000, 0},
    {"cuArray3DCreate", "cuArray3DCreate_v2", 3020, 0},
    {"cuArrayDestroy", "cuArrayDestroy", 2000, 0},
    {"cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 5000, 0},
    {"cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 5000, 0},
    {"cuCtxCreate", "cuCtxCreate", 2000, 0},
    {"cuCtxCreate", "cuCtxCreate_v2", 3020, 0},
    {"cuCtxCreate", "cuCtxCreate_v3", 11040, 0},
    {"cuCtxCreate", "cuCtxCreate_v4", 12050, 0},
    {"cuCtxDestroy", "cuCtxDestroy", 2000, 0},
    {"cuCtxDestroy", "cuCtxDestroy_v2", 4000, 0},
    {"cuCtxSetLimit", "cuCtxSetLimit", 3010, 0},
    {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, 0},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", 7000, 0},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000, 0},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", 7000, 0},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 11000, 0},
    {"cuMemGetInfo", "cuMemGetInfo", 2000, 0},
    {"cuMemGetInfo", "cuMemGetInfo_v2", 3020, 0},
    {"cuDeviceTotalMem", "cuDeviceTotalMem", 2000, 0},
    {"cuDeviceTotalMem", "cuDeviceTotalMem_v2", 3020, 0},
    {"cuCtxSynchronize", "cuCtxSynchronize", 2000, 0},
    {"cuEventSynchronize", "cuEventSynchronize", 2000, 0},
    {"cuModuleLoad", "cuModuleLoad", 2000, 0},
    {"cuModuleLoadData", "cuModuleLoadData", 2000, 0},
    {"cuModuleLoadDataEx", "cuModuleLoadDataEx", 2010, 0},
    {"cuModuleLoadFatBinary", "cuModuleLoadFatBinary", 2000, 0},
    {"cuLibraryLoadData", "cuLibraryLoadData", 12000, 0},
    {"cuLibraryLoadFromFile", "cuLibraryLoadFromFile", 12000, 0},
    {"cuLaunchKernel", "cuLaunchKernel", 4000, 1},
    {"cuLaunchKernelEx", "cuLaunchKernelEx", 11060, 1},
    {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 9000, 1},
    {"cuGraphLaunch", "cuGraphLaunch", 10000, 1},
    {"cuGraphUpload", "cuGraphUpload", 11010, 1},
    {"cuGraphInstantiate", "cuGraphInstantiate", 10000, 0},
    {"cuGraphInstantiate", "cuGraphInstantiate_v2", 11000, 0},
    {"cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags", 11040, 0},
    {"cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams", 12000, 1},
    {"cuGraphExecDestroy", "cuGraphExecDestroy", 10000, 0},
    {"cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim", 11040, 0},
    /* called by the limiter, not intercepted */
    {"cuCtxPushCurrent", "cuCtxPushCurrent", 2000, 0},
    {"cuCtxPushCurrent", "cuCtxPushCurrent_v2", 4000, 0},
    {"cuCtxPopCurrent", "cuCtxPopCurrent", 2000, 0},
    {"cuCtxPopCurrent", "cuCtxPopCurrent_v2", 4000, 0},
    {"cuDeviceGetUuid", "cuDeviceGetUuid", 9020, 0},
    {"cuDeviceGetUuid", "cuDeviceGetUuid_v2", 11040, 0},
    {"cuEventRecord", "cuEventRecord", 2000, 1},
    {"cuEventDestroy", "cuEventDestroy", 2000, 0},
    {"cuEventDestroy", "cuEventDestroy_v2", 4000, 0},
    {"cuStreamSynchronize", "cuStreamSynchronize", 2000, 1},
    {"cuStreamGetCtx", "cuStreamGetCtx", 9020, 1},
    {"cuStreamIsCapturing", "cuStreamIsCapturing", 10000, 1},
    {"cuStreamBeginCapture", "cuStreamBeginCapture", 10000, 1},
    {"cuStreamBeginCapture", "cuStreamBeginCapture_v2", 10010, 1},
    {"cuGraphAddNode", "cuGraphAddNode", 12020, 0},
    {"cuGraphAddNode", "cuGraphAddNode_v2", 12030, 0},
};
#define N (sizeof(table) / sizeof(table[0]))

int tl_pa_resolve(const char *base, int version, unsigned long long flags, char *out, size_t n)
{
    const variant *best = NULL;
    for (size_t i = 0; base && i < N; i++)
        if (!strcmp(table[i].base, base) && table[i].since <= version &&
            (!best || table[i].since >= best->since))
            best = &table[i];
    if (!best)
        return -1;
    /* the per-thread default stream appeared in CUDA 7.0: asked for before
     * that, the _ptsz forms do not exist (the driver answers NOT_FOUND) */
    if ((flags & PTSZ_FLAG) && best->ptsz && version < 7000)
        return -1;
    int w = (flags & PTSZ_FLAG) && best->ptsz ? snprintf(out, n, "%s_ptsz", best->name)
                                               : snprintf(out, n, "%s", best->name);
    return w > 0 && (size_t)w < n ? 0 : -1;
}

int tl_pa_known(const char *base)
{
    for (size_t i = 0; base && i < N; i++)
        if (!strcmp(table[i].base, base))
            return 1;
    return 0;
}

const char *tl_pa_base(int i)
{
    /* distinct bases, in table order */
    int k = -1;
    for (size_t j = 0; j < N; j++)
        if (j == 0 || strcmp(table[j].base, table[j - 1].base))
            if (++k == i)
                return table[j].base;
    return NULL;
}
