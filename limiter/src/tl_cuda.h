/*
 * tl_cuda.h - the handful of CUDA driver API and NVML types the limiter
 * needs, declared here by hand (no CUDA headers are used or required).
 * Only layouts that the limiter reads are spelled out; everything else is
 * treated as opaque.
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
typedef void *CUfunction;
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
#define CUDA_ERROR_NOT_FOUND 500

/* cuGetProcAddress flags */
#define TL_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2

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

/* CUmemAllocationProp: only location.id is read. */
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

/* CUlaunchConfig: the limiter reads the grid dimensions only. */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} TL_LAUNCH_CONFIG;

/* CUmemPoolProps + CUDA_MEM_ALLOC_NODE_PARAMS (v1 and v2 share this
 * layout): the limiter reads poolProps.location.id and bytesize. */
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
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} TL_NVML_MEMORY;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} TL_NVML_MEMORY_V2;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} TL_NVML_PROC_UTIL_SAMPLE;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} TL_NVML_UTILIZATION;

#endif
