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
