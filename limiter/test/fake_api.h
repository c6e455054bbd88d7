/* fake_api.h - prototypes of the driver/NVML functions used by the tests,
 * with the limiter's own hand-written types (no CUDA headers). */
#ifndef FAKE_API_H
#define FAKE_API_H
#include "../src/tl_cuda.h"

#define FAKE_API_LIST(X)                                                             \
    X(CUresult, cuInit, (unsigned int))                                              \
    X(CUresult, cuDriverGetVersion, (int *))                                         \
    X(CUresult, cuDeviceGet, (CUdevice *, int))                                      \
    X(CUresult, cuCtxGetDevice, (CUdevice *))                                        \
    X(CUresult, cuCtxSetCurrent, (CUcontext))                                        \
    X(CUresult, cuCtxCreate_v2, (CUcontext *, unsigned int, CUdevice))               \
    X(CUresult, cuCtxDestroy_v2, (CUcontext))                                        \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                   \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice))                            \
    X(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice))                              \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *, size_t))                              \
    X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int)) \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))            \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                  \
    X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))             \
    X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const TL_MEM_ALLOCATION_PROP *, unsigned long long)) \
    X(CUresult, cuArrayCreate_v2, (CUarray *, const TL_ARRAY_DESCRIPTOR *))          \
    X(CUresult, cuArray3DCreate_v2, (CUarray *, const TL_ARRAY3D_DESCRIPTOR *))      \
    X(CUresult, cuMipmappedArrayCreate, (CUmipmappedArray *, const TL_ARRAY3D_DESCRIPTOR *, unsigned int)) \
    X(CUresult, cuMemFree_v2, (CUdeviceptr))                                         \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr, CUstream))                             \
    X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))                        \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle))                        \
    X(CUresult, cuArrayDestroy, (CUarray))                                           \
    X(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray))                         \
    X(CUresult, cuMemGetInfo_v2, (size_t *, size_t *))                               \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *, CUdevice))                           \
    X(CUresult, cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(CUresult, cuLaunchKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(CUresult, cuLaunchKernelEx, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **)) \
    X(CUresult, cuLaunchKernelEx_ptsz, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **)) \
    X(CUresult, cuLaunchCooperativeKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(CUresult, cuLaunchCooperativeKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec, CUstream))                              \
    X(CUresult, cuGraphLaunch_ptsz, (CUgraphExec, CUstream))                         \
    X(CUresult, cuCtxCreate_v3, (CUcontext *, void *, int, unsigned int, CUdevice))  \
    X(CUresult, cuCtxCreate_v4, (CUcontext *, void *, unsigned int, CUdevice))       \
    X(CUresult, cuStreamCreate, (CUstream *, unsigned int))                          \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream, int))                            \
    X(CUresult, cuStreamEndCapture, (CUstream, CUgraph *))                           \
    X(CUresult, cuStreamIsCapturing, (CUstream, int *))                              \
    X(CUresult, cuStreamIsCapturing_ptsz, (CUstream, int *))                         \
    X(CUresult, cuGraphCreate, (CUgraph *, unsigned int))                            \
    X(CUresult, cuGraphDestroy, (CUgraph))                                           \
    X(CUresult, cuGraphAddMemAllocNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, TL_MEM_ALLOC_NODE_PARAMS *)) \
    X(CUresult, cuGraphAddNode_v2, (CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t, void *)) \
    X(CUresult, cuGraphAddChildGraphNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph)) \
    X(CUresult, cuGraphGetNodes, (CUgraph, CUgraphNode *, size_t *))                \
    X(CUresult, cuGraphNodeGetType, (CUgraphNode, int *))                           \
    X(CUresult, cuGraphMemAllocNodeGetParams, (CUgraphNode, TL_MEM_ALLOC_NODE_PARAMS *)) \
    X(CUresult, cuGraphChildGraphNodeGetGraph, (CUgraphNode, CUgraph *))            \
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
    X(nvmlReturn_t, nvmlShutdown, (void))                                            \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t *))   \
    X(nvmlReturn_t, nvmlDeviceGetIndex, (nvmlDevice_t, unsigned int *))              \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t, TL_NVML_MEMORY *))       \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, TL_NVML_MEMORY_V2 *)) \
    X(nvmlReturn_t, nvmlDeviceGetProcessUtilization, (nvmlDevice_t, TL_NVML_PROC_UTIL_SAMPLE *, unsigned int *, unsigned long long)) \
    X(nvmlReturn_t, nvmlDeviceGetUtilizationRates, (nvmlDevice_t, TL_NVML_UTILIZATION *))

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

#endif
