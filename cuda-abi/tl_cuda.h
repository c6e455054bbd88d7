/*
 * tl_cuda.h - the handful of CUDA driver API and NVML types the limiter
 * and the fake driver (fakegpu) need, declared here by hand (no CUDA
 * headers are used or required). Only layouts that the limiter reads are
 * spelled out; everything else is treated as opaque. The values are those
 * of cuda.h / nvml.h.
 */
#ifndef TL_CUDA_H
#define TL_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUfunction;
typedef void *CUmodule;
typedef void *CUlibrary;
typedef void *CUgraphExec;
typedef void *CUarray;
typedef void *CUmipmappedArray;
typedef void *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUgraph;
typedef void *CUgraphNode;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_SUPPORTED 801

/* cuGetProcAddress flags */
#define TL_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2

/* CUlimit */
#define TL_LIMIT_STACK_SIZE 0
#define TL_LIMIT_PRINTF_FIFO_SIZE 1
#define TL_LIMIT_MALLOC_HEAP_SIZE 2

/* CUdevice_attribute */
#define TL_DEV_ATTR_MULTIPROCESSOR_COUNT 16
#define TL_DEV_ATTR_MAX_THREADS_PER_MULTIPROCESSOR 39

/* CUmemPool_attribute */
#define TL_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define TL_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define TL_MEMPOOL_ATTR_USED_MEM_CURRENT 7

/* CUmemLocationType */
#define TL_MEM_LOCATION_DEVICE 1

/* CUDA_ARRAY_DESCRIPTOR (v2) */
typedef struct {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} TL_ARRAY_DESCRIPTOR;

/* CUDA_ARRAY3D_DESCRIPTOR (v2) */
typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} TL_ARRAY3D_DESCRIPTOR;

/* CUmemAllocationProp: location is read, and only when it is a device. */
typedef struct {
    int type;
    int requestedHandleTypes;
    struct {
        int type;
        int id;
    } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} TL_MEM_ALLOCATION_PROP;

/* CUlaunchConfig: the limiter reads the grid dimensions and the stream. */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} TL_LAUNCH_CONFIG;

/* CUmemPoolProps + CUDA_MEM_ALLOC_NODE_PARAMS (v1 and v2 share this
 * layout): the limiter reads location and bytesize. */
typedef struct {
    int allocType;
    int handleTypes;
    struct {
        int type;
        int id;
    } location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} TL_MEM_POOL_PROPS;

typedef struct {
    TL_MEM_POOL_PROPS poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} TL_MEM_ALLOC_NODE_PARAMS;

/* CUDA_GRAPH_INSTANTIATE_PARAMS: only flags is read. */
typedef struct {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} TL_GRAPH_INSTANTIATE_PARAMS;

#define TL_GRAPH_NODE_TYPE_GRAPH 4      /* child graph */
#define TL_GRAPH_NODE_TYPE_MEM_ALLOC 10
#define TL_GRAPH_INSTANTIATE_FLAG_UPLOAD 2
#define TL_GRAPH_MEM_ATTR_USED_MEM_CURRENT 0
#define TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2
#define TL_STREAM_CAPTURE_STATUS_NONE 0

/* ---- NVML ---- */
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_OPERATING_SYSTEM 17
#define NVML_ERROR_UNKNOWN 999
#define TL_NVML_UUID_LEN 96 /* buffer for nvmlDeviceGetUUID (NVML asks for >= 80) */

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} TL_NVML_MEMORY;

/* nvmlSetMemoryLimits_v1_t and nvmlGetMemoryLimits_v1_t (r615, CUDA
 * 13.4): a cgroup's share of a GPU's memory, in bytes. nameSpace is the
 * cgroup's directory under the cgroup2 mount. No limit: soft 0, hard
 * TL_NVML_MEMORY_LIMIT_MAX. */
#define TL_NVML_MEMORY_LIMIT_MAX 0xFFFFFFFFFFFFFFFFull
typedef struct {
    const char *nameSpace;
    unsigned long long softLimit;
    unsigned long long hardLimit;
} TL_NVML_SET_MEMORY_LIMITS_V1;

typedef struct {
    const char *nameSpace;
    unsigned long long softLimit;
    unsigned long long hardLimit;
    unsigned long long currentUsed;
} TL_NVML_GET_MEMORY_LIMITS_V1;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} TL_NVML_MEMORY_V2;

/* nvmlProcessUtilizationSample_t */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} TL_NVML_PROC_UTIL_SAMPLE;

/* nvmlProcessUtilizationInfo_v1_t, the array of nvmlProcessesUtilizationInfo_t */
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid;
    unsigned int smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} TL_NVML_PROC_UTIL_INFO;

/* nvmlProcessesUtilizationInfo_t (v1) */
typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    TL_NVML_PROC_UTIL_INFO *procUtilArray;
} TL_NVML_PROCS_UTIL_INFO;

/* nvmlProcessDetail_v1_t and nvmlProcessDetailList_v1_t */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} TL_NVML_PROC_DETAIL;

typedef struct {
    unsigned int version;
    unsigned int mode;
    unsigned int numProcArrayEntries;
    TL_NVML_PROC_DETAIL *procArray;
} TL_NVML_PROC_DETAIL_LIST;

/* Process lists (nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses):
 * v1 entries are {pid, usedGpuMemory} (16 bytes), _v2 entries add
 * gpuInstanceId and computeInstanceId (24 bytes); _v3 entries are 24 bytes
 * in most drivers and 32 (usedGpuCcProtectedMemory added) in some, so the
 * limiter measures the stride the library wrote. pid at 0, usedGpuMemory
 * at 8 in all of them. */
#define TL_PROCINFO_V1 16
#define TL_PROCINFO_V2 24
#define TL_PROCINFO_V3_CC 32

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} TL_NVML_UTILIZATION;

#endif
