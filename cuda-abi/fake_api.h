/* fake_api.h - prototypes of the driver/NVML functions the fake driver
 * exports and the tests call, with the limiter's own hand-written types
 * (no CUDA headers). */
#ifndef FAKE_API_H
#define FAKE_API_H
#include "tl_cuda.h"

typedef unsigned int CUdeviceptr_v1;

#define FAKE_API_LIST(X)                                                             \
    X(CUresult, cuInit, (unsigned int))                                              \
    X(CUresult, cuDriverGetVersion, (int *))                                         \
    X(CUresult, cuDeviceGet, (CUdevice *, int))                                      \
    X(CUresult, cuDeviceGetCount, (int *))                                           \
    X(CUresult, cuDeviceGetName, (char *, int, CUdevice))                            \
    X(CUresult, cuDeviceGetUuid, (unsigned char *, CUdevice))                        \
    X(CUresult, cuDeviceGetUuid_v2, (unsigned char *, CUdevice))                     \
    X(CUresult, cuDeviceGetAttribute, (int *, int, CUdevice))                        \
    X(CUresult, cuCtxGetDevice, (CUdevice *))                                        \
    X(CUresult, cuCtxGetCurrent, (CUcontext *))                                      \
    X(CUresult, cuCtxSetCurrent, (CUcontext))                                        \
    X(CUresult, cuCtxPushCurrent_v2, (CUcontext))                                    \
    X(CUresult, cuCtxPopCurrent_v2, (CUcontext *))                                   \
    X(CUresult, cuCtxSynchronize, (void))                                            \
    X(CUresult, cuCtxSetLimit, (int, size_t))                                        \
    X(CUresult, cuCtxGetLimit, (size_t *, int))                                      \
    X(CUresult, cuCtxCreate, (CUcontext *, unsigned int, CUdevice))                  \
    X(CUresult, cuCtxCreate_v2, (CUcontext *, unsigned int, CUdevice))               \
    X(CUresult, cuCtxCreate_v3, (CUcontext *, void *, int, unsigned int, CUdevice))  \
    X(CUresult, cuCtxCreate_v4, (CUcontext *, void *, unsigned int, CUdevice))       \
    X(CUresult, cuCtxDestroy, (CUcontext))                                           \
    X(CUresult, cuCtxDestroy_v2, (CUcontext))                                        \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                   \
    X(CUresult, cuDevicePrimaryCtxRelease, (CUdevice))                               \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice))                            \
    X(CUresult, cuDevicePrimaryCtxReset, (CUdevice))                                 \
    X(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice))                              \
    X(CUresult, cuMemAlloc, (CUdeviceptr_v1 *, unsigned int))                        \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *, size_t))                              \
    X(CUresult, cuMemAllocPitch, (CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int)) \
    X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int)) \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))            \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                  \
    X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))             \
    X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const TL_MEM_ALLOCATION_PROP *, unsigned long long)) \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle))                        \
    X(CUresult, cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
    X(CUresult, cuMemAddressFree, (CUdeviceptr, size_t))                             \
    X(CUresult, cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(CUresult, cuMemUnmap, (CUdeviceptr, size_t))                                   \
    X(CUresult, cuMemSetAccess, (CUdeviceptr, size_t, const void *, size_t))         \
    X(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *, void *)) \
    X(CUresult, cuMemExportToShareableHandle, (void *, CUmemGenericAllocationHandle, int, unsigned long long)) \
    X(CUresult, cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, int)) \
    X(CUresult, cuMemGetAllocationGranularity, (size_t *, const TL_MEM_ALLOCATION_PROP *, int)) \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice))               \
    X(CUresult, cuDeviceGetMemPool, (CUmemoryPool *, CUdevice))                      \
    X(CUresult, cuDeviceSetMemPool, (CUdevice, CUmemoryPool))                        \
    X(CUresult, cuMemPoolCreate, (CUmemoryPool *, const TL_MEM_POOL_PROPS *))        \
    X(CUresult, cuMemPoolDestroy, (CUmemoryPool))                                    \
    X(CUresult, cuMemPoolGetAttribute, (CUmemoryPool, int, void *))                  \
    X(CUresult, cuMemPoolSetAttribute, (CUmemoryPool, int, void *))                  \
    X(CUresult, cuMemPoolTrimTo, (CUmemoryPool, size_t))                             \
    X(CUresult, cuArrayCreate, (CUarray *, const void *))                            \
    X(CUresult, cuArrayCreate_v2, (CUarray *, const TL_ARRAY_DESCRIPTOR *))          \
    X(CUresult, cuArray3DCreate, (CUarray *, const void *))                          \
    X(CUresult, cuArray3DCreate_v2, (CUarray *, const TL_ARRAY3D_DESCRIPTOR *))      \
    X(CUresult, cuMipmappedArrayCreate, (CUmipmappedArray *, const TL_ARRAY3D_DESCRIPTOR *, unsigned int)) \
    X(CUresult, cuMemFree, (CUdeviceptr_v1))                                         \
    X(CUresult, cuMemFree_v2, (CUdeviceptr))                                         \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr, CUstream))                             \
    X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))                        \
    X(CUresult, cuArrayDestroy, (CUarray))                                           \
    X(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray))                         \
    X(CUresult, cuMemGetInfo, (unsigned int *, unsigned int *))                      \
    X(CUresult, cuMemGetInfo_v2, (size_t *, size_t *))                               \
    X(CUresult, cuDeviceTotalMem, (unsigned int *, CUdevice))                        \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *, CUdevice))                           \
    X(CUresult, cuModuleLoadData, (CUmodule *, const void *))                        \
    X(CUresult, cuModuleUnload, (CUmodule))                                          \
    X(CUresult, cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(CUresult, cuLaunchKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(CUresult, cuLaunchKernelEx, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **)) \
    X(CUresult, cuLaunchKernelEx_ptsz, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **)) \
    X(CUresult, cuLaunchCooperativeKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(CUresult, cuLaunchCooperativeKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec, CUstream))                              \
    X(CUresult, cuGraphLaunch_ptsz, (CUgraphExec, CUstream))                         \
    X(CUresult, cuStreamCreate, (CUstream *, unsigned int))                          \
    X(CUresult, cuStreamGetCtx, (CUstream, CUcontext *))                             \
    X(CUresult, cuStreamSynchronize, (CUstream))                                     \
    X(CUresult, cuStreamSynchronize_ptsz, (CUstream))                                \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream, int))                            \
    X(CUresult, cuStreamEndCapture, (CUstream, CUgraph *))                           \
    X(CUresult, cuStreamIsCapturing, (CUstream, int *))                              \
    X(CUresult, cuStreamIsCapturing_ptsz, (CUstream, int *))                         \
    X(CUresult, cuEventCreate, (CUevent *, unsigned int))                            \
    X(CUresult, cuEventRecord, (CUevent, CUstream))                                  \
    X(CUresult, cuEventRecord_ptsz, (CUevent, CUstream))                             \
    X(CUresult, cuEventQuery, (CUevent))                                             \
    X(CUresult, cuEventSynchronize, (CUevent))                                       \
    X(CUresult, cuEventElapsedTime, (float *, CUevent, CUevent))                     \
    X(CUresult, cuEventDestroy_v2, (CUevent))                                        \
    X(CUresult, cuGraphCreate, (CUgraph *, unsigned int))                            \
    X(CUresult, cuGraphDestroy, (CUgraph))                                           \
    X(CUresult, cuGraphAddMemAllocNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, TL_MEM_ALLOC_NODE_PARAMS *)) \
    X(CUresult, cuGraphAddNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, void *)) \
    X(CUresult, cuGraphAddNode_v2, (CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t, void *)) \
    X(CUresult, cuGraphAddChildGraphNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph)) \
    X(CUresult, cuGraphGetNodes, (CUgraph, CUgraphNode *, size_t *))                \
    X(CUresult, cuGraphNodeGetType, (CUgraphNode, int *))                           \
    X(CUresult, cuGraphMemAllocNodeGetParams, (CUgraphNode, TL_MEM_ALLOC_NODE_PARAMS *)) \
    X(CUresult, cuGraphChildGraphNodeGetGraph, (CUgraphNode, CUgraph *))            \
    X(CUresult, cuGraphInstantiate, (CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t)) \
    X(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long)) \
    X(CUresult, cuGraphInstantiateWithParams, (CUgraphExec *, CUgraph, TL_GRAPH_INSTANTIATE_PARAMS *)) \
    X(CUresult, cuGraphInstantiateWithParams_ptsz, (CUgraphExec *, CUgraph, TL_GRAPH_INSTANTIATE_PARAMS *)) \
    X(CUresult, cuGraphInstantiate_v2, (CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t)) \
    X(CUresult, cuGraphUpload, (CUgraphExec, CUstream))                              \
    X(CUresult, cuGraphUpload_ptsz, (CUgraphExec, CUstream))                         \
    X(CUresult, cuGraphExecDestroy, (CUgraphExec))                                   \
    X(CUresult, cuDeviceGetGraphMemAttribute, (CUdevice, int, void *))               \
    X(CUresult, cuDeviceGraphMemTrim, (CUdevice))                                    \
    X(CUresult, cuGetProcAddress, (const char *, void **, int, unsigned long long))  \
    X(CUresult, cuGetProcAddress_v2, (const char *, void **, int, unsigned long long, int *))

#define FAKE_NVML_LIST(X)                                                            \
    X(nvmlReturn_t, nvmlInit_v2, (void))                                             \
    X(nvmlReturn_t, nvmlInitWithFlags, (unsigned int))                               \
    X(nvmlReturn_t, nvmlShutdown, (void))                                            \
    X(nvmlReturn_t, nvmlDeviceGetCount_v2, (unsigned int *))                         \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t *))   \
    X(nvmlReturn_t, nvmlDeviceGetHandleByUUID, (const char *, nvmlDevice_t *))       \
    X(nvmlReturn_t, nvmlDeviceGetIndex, (nvmlDevice_t, unsigned int *))              \
    X(nvmlReturn_t, nvmlDeviceGetUUID, (nvmlDevice_t, char *, unsigned int))         \
    X(nvmlReturn_t, nvmlDeviceGetName, (nvmlDevice_t, char *, unsigned int))         \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t, TL_NVML_MEMORY *))       \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, TL_NVML_MEMORY_V2 *)) \
    X(nvmlReturn_t, nvmlDeviceGetProcessUtilization, (nvmlDevice_t, TL_NVML_PROC_UTIL_SAMPLE *, unsigned int *, unsigned long long)) \
    X(nvmlReturn_t, nvmlDeviceGetProcessesUtilizationInfo, (nvmlDevice_t, TL_NVML_PROCS_UTIL_INFO *)) \
    X(nvmlReturn_t, nvmlDeviceGetRunningProcessDetailList, (nvmlDevice_t, TL_NVML_PROC_DETAIL_LIST *)) \
    X(nvmlReturn_t, nvmlDeviceGetUtilizationRates, (nvmlDevice_t, TL_NVML_UTILIZATION *)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v2, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetGraphicsRunningProcesses, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetGraphicsRunningProcesses_v2, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetGraphicsRunningProcesses_v3, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetMPSComputeRunningProcesses, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetMPSComputeRunningProcesses_v2, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlReturn_t, nvmlDeviceGetMPSComputeRunningProcesses_v3, (nvmlDevice_t, unsigned int *, void *))

/* CUgraphNodeParams (cuGraphAddNode_v2): type, then a union at 16. */
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        TL_MEM_ALLOC_NODE_PARAMS alloc;
    } u;
    long long reserved2;
} FAKE_GRAPH_NODE_PARAMS;

#define FAKE_DECL(ret, name, args) ret name args;
FAKE_API_LIST(FAKE_DECL)
FAKE_NVML_LIST(FAKE_DECL)

/* Test-only helpers the fake libcuda exports (see fake/fake.h). */
double fake_now(void);
void fake_sleep(double s);
double fake_busy(int dev, double t0, double t1);
CUfunction fake_kernel(double fixed_us, double per_block_us);
void fake_graph_cost(CUgraphExec e, double us);
unsigned long long fake_used_bytes(int dev);
extern unsigned long long fake_peak_used;

#endif
