/*
 * tl_internal.h - what the interposition files of the library share. Not a
 * public header: the library exports only the driver/NVML entry points it
 * intercepts (and dlsym); everything here has hidden visibility.
 *
 * Files, one concern each:
 *   tl_resolve.c  configuration and initialisation, the real functions,
 *                 fork, dlsym, cuGetProcAddress, cuInit
 *   tl_account.c  devices (CUDA ordinal / NVML handle -> limiter device by
 *                 UUID), charging the shared budget, reconciliation with
 *                 NVML's per-process used memory
 *   tl_nvml.c     NVML for the limiter's own use: process lists, free
 *                 memory, host pid discovery
 *   tl_alloc.c    allocations and frees, stream-ordered pools, synchronisation
 *   tl_vmm.c      cuMemCreate/Map/Unmap/Release/Retain/Import
 *   tl_graph.c    graph memory
 *   tl_ctx.c      contexts, cuCtxSetLimit, module loads
 *   tl_report.c   cuMemGetInfo, cuDeviceTotalMem, NVML memory and process lists
 *   tl_pace.c     compute pacing and the launch entry points
 * Pure, unit-tested parts: tl_config (environment, limits file), tl_table,
 * tl_state (the shared file), tl_pacer, tl_hostpid, tl_size, and, shared
 * with the fake driver in ../cuda-abi, tl_procaddr (the cuGetProcAddress
 * variant table) and tl_cuda.h (the CUDA and NVML types).
 *
 * Lock order (a thread holding one may take only those below it):
 *   1. hp_mu      host pid discovery (tl_nvml.c), held across a context creation
 *   2. prim_mu    primary context retain counts (tl_ctx.c)
 *   3. ctx_mu     measuring the first context on a device (tl_ctx.c)
 *   4. graph_mu (tl_graph.c), pool_mu (tl_alloc.c), vmm_mu (tl_vmm.c),
 *      limit_mu (tl_ctx.c): never nested with each other
 *   5. reg_mu, acct_mu (tl_account.c)
 *   6. the table's lock (tl_table.c)
 *   7. the shared state's process-shared robust mutex (tl_state.c), waited
 *      for at most TL_LOCK_WAIT_S
 * budget_mu (tl_account.c, reading a budget file) and pace[d].mu
 * (tl_pace.c) are taken alone, never with any of these held, and never
 * held across a driver call. Work that may call NVML or reconcile
 * (tl_account_prepare) runs at the entry of an intercepted call, before any
 * of these locks is taken.
 */
#ifndef TL_INTERNAL_H
#define TL_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "tl_config.h"
#include "tl_cuda.h"
#include "tl_hostpid.h"
#include "tl_state.h"
#include "tl_table.h"

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
/* Called from dlsym(), which sanitizer runtimes use while they start up:
 * nothing there may be instrumented. */
#define NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))

/* ---- the real functions ---- */

typedef unsigned int TL_DEVPTR_V1;

/* Intercepted driver entry points: name, arguments. */
#define CU_HOOK_LIST(X)                                                                \
    X(cuInit, (unsigned int))                                                          \
    X(cuGetProcAddress, (const char *, void **, int, unsigned long long))              \
    X(cuGetProcAddress_v2, (const char *, void **, int, unsigned long long, int *))    \
    X(cuMemAlloc, (TL_DEVPTR_V1 *, unsigned int))                                      \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                          \
    X(cuMemAllocPitch, (TL_DEVPTR_V1 *, unsigned int *, unsigned int, unsigned int, unsigned int)) \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))     \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))                        \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                              \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))                         \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))        \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))   \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const TL_MEM_ALLOCATION_PROP *, unsigned long long)) \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                    \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(cuMemUnmap, (CUdeviceptr, size_t))                                               \
    X(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *, void *))           \
    X(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, int))   \
    X(cuMemPoolCreate, (CUmemoryPool *, const TL_MEM_POOL_PROPS *))                    \
    X(cuMemPoolDestroy, (CUmemoryPool))                                                \
    X(cuMemPoolTrimTo, (CUmemoryPool, size_t))                                         \
    X(cuDeviceSetMemPool, (CUdevice, CUmemoryPool))                                    \
    X(cuArrayCreate, (CUarray *, const void *))                                        \
    X(cuArrayCreate_v2, (CUarray *, const TL_ARRAY_DESCRIPTOR *))                      \
    X(cuArray3DCreate, (CUarray *, const void *))                                      \
    X(cuArray3DCreate_v2, (CUarray *, const TL_ARRAY3D_DESCRIPTOR *))                  \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *, const TL_ARRAY3D_DESCRIPTOR *, unsigned int)) \
    X(cuMemFree_v2, (CUdeviceptr))                                                     \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                         \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))                                    \
    X(cuArrayDestroy, (CUarray))                                                       \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray))                                     \
    X(cuCtxCreate, (CUcontext *, unsigned int, CUdevice))                              \
    X(cuCtxCreate_v2, (CUcontext *, unsigned int, CUdevice))                           \
    X(cuCtxCreate_v3, (CUcontext *, void *, int, unsigned int, CUdevice))              \
    X(cuCtxCreate_v4, (CUcontext *, void *, unsigned int, CUdevice))                   \
    X(cuCtxDestroy, (CUcontext))                                                       \
    X(cuCtxDestroy_v2, (CUcontext))                                                    \
    X(cuCtxSetLimit, (int, size_t))                                                    \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                               \
    X(cuDevicePrimaryCtxRelease, (CUdevice))                                           \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                        \
    X(cuDevicePrimaryCtxReset, (CUdevice))                                             \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice))                                          \
    X(cuMemGetInfo, (unsigned int *, unsigned int *))                                  \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                           \
    X(cuDeviceTotalMem, (unsigned int *, CUdevice))                                    \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                       \
    X(cuModuleLoad, (CUmodule *, const char *))                                        \
    X(cuModuleLoadData, (CUmodule *, const void *))                                    \
    X(cuModuleLoadDataEx, (CUmodule *, const void *, unsigned int, void *, void **))   \
    X(cuModuleLoadFatBinary, (CUmodule *, const void *))                               \
    X(cuLibraryLoadData, (CUlibrary *, const void *, void *, void **, unsigned int, void *, void **, unsigned int)) \
    X(cuLibraryLoadFromFile, (CUlibrary *, const char *, void *, void **, unsigned int, void *, void **, unsigned int)) \
    X(cuCtxSynchronize, (void))                                                        \
    X(cuStreamSynchronize, (CUstream))                                                 \
    X(cuStreamSynchronize_ptsz, (CUstream))                                            \
    X(cuEventSynchronize, (CUevent))                                                   \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuLaunchKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuLaunchKernelEx, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **))      \
    X(cuLaunchKernelEx_ptsz, (const TL_LAUNCH_CONFIG *, CUfunction, void **, void **)) \
    X(cuLaunchCooperativeKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(cuLaunchCooperativeKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(cuGraphLaunch, (CUgraphExec, CUstream))                                          \
    X(cuGraphLaunch_ptsz, (CUgraphExec, CUstream))                                     \
    X(cuGraphUpload, (CUgraphExec, CUstream))                                          \
    X(cuGraphUpload_ptsz, (CUgraphExec, CUstream))                                     \
    X(cuGraphInstantiate, (CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t))     \
    X(cuGraphInstantiate_v2, (CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t))  \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long))       \
    X(cuGraphInstantiateWithParams, (CUgraphExec *, CUgraph, TL_GRAPH_INSTANTIATE_PARAMS *)) \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec *, CUgraph, TL_GRAPH_INSTANTIATE_PARAMS *)) \
    X(cuGraphExecDestroy, (CUgraphExec))                                               \
    X(cuDeviceGraphMemTrim, (CUdevice))

/* Driver functions the limiter calls but does not intercept. */
#define CU_AUX_LIST(X)                                                                 \
    X(cuDeviceGet, (CUdevice *, int))                                                  \
    X(cuDeviceGetCount, (int *))                                                       \
    X(cuDeviceGetUuid, (unsigned char *, CUdevice))                                    \
    X(cuDeviceGetUuid_v2, (unsigned char *, CUdevice))                                 \
    X(cuDeviceGetAttribute, (int *, int, CUdevice))                                    \
    X(cuCtxGetDevice, (CUdevice *))                                                    \
    X(cuCtxGetCurrent, (CUcontext *))                                                  \
    X(cuCtxGetLimit, (size_t *, int))                                                  \
    X(cuStreamGetCtx, (CUstream, CUcontext *))                                         \
    X(cuStreamGetCtx_ptsz, (CUstream, CUcontext *))                                    \
    X(cuStreamIsCapturing, (CUstream, int *))                                          \
    X(cuStreamIsCapturing_ptsz, (CUstream, int *))                                     \
    X(cuDeviceGetMemPool, (CUmemoryPool *, CUdevice))                                  \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice))                           \
    X(cuMemPoolGetAttribute, (CUmemoryPool, int, void *))                              \
    X(cuEventCreate, (CUevent *, unsigned int))                                        \
    X(cuEventRecord, (CUevent, CUstream))                                              \
    X(cuEventRecord_ptsz, (CUevent, CUstream))                                         \
    X(cuEventQuery, (CUevent))                                                         \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                 \
    X(cuEventDestroy_v2, (CUevent))                                                    \
    X(cuGraphGetNodes, (CUgraph, CUgraphNode *, size_t *))                             \
    X(cuGraphNodeGetType, (CUgraphNode, int *))                                        \
    X(cuGraphMemAllocNodeGetParams, (CUgraphNode, TL_MEM_ALLOC_NODE_PARAMS *))         \
    X(cuGraphChildGraphNodeGetGraph, (CUgraphNode, CUgraph *))                         \
    X(cuDeviceGetGraphMemAttribute, (CUdevice, int, void *))

/* Intercepted NVML entry points. */
#define NVML_HOOK_LIST(X)                                                              \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t, TL_NVML_MEMORY *))                       \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, TL_NVML_MEMORY_V2 *))                 \
    X(nvmlDeviceGetComputeRunningProcesses, (nvmlDevice_t, unsigned int *, void *))    \
    X(nvmlDeviceGetComputeRunningProcesses_v2, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlDeviceGetGraphicsRunningProcesses, (nvmlDevice_t, unsigned int *, void *))   \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, (nvmlDevice_t, unsigned int *, void *)) \
    X(nvmlDeviceGetProcessUtilization, (nvmlDevice_t, TL_NVML_PROC_UTIL_SAMPLE *, unsigned int *, unsigned long long)) \
    X(nvmlDeviceGetProcessesUtilizationInfo, (nvmlDevice_t, TL_NVML_PROCS_UTIL_INFO *)) \
    X(nvmlDeviceGetRunningProcessDetailList, (nvmlDevice_t, TL_NVML_PROC_DETAIL_LIST *)) \
    X(nvmlInternalGetExportTable, (const void **, const void *))

/* NVML functions the limiter calls but does not intercept. */
#define NVML_AUX_LIST(X)                                                               \
    X(nvmlInit_v2, (void))                                                             \
    X(nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t *))                   \
    X(nvmlDeviceGetHandleByUUID, (const char *, nvmlDevice_t *))                       \
    X(nvmlDeviceGetIndex, (nvmlDevice_t, unsigned int *))                              \
    X(nvmlDeviceGetUUID, (nvmlDevice_t, char *, unsigned int))                         \
    X(nvmlDeviceGetUtilizationRates, (nvmlDevice_t, TL_NVML_UTILIZATION *))

#define TL_DECL_CU(name, args) extern CUresult(*real_##name) args;
#define TL_DECL_NVML(name, args) extern nvmlReturn_t(*real_##name) args;
CU_HOOK_LIST(TL_DECL_CU)
CU_AUX_LIST(TL_DECL_CU)
NVML_HOOK_LIST(TL_DECL_NVML)
NVML_AUX_LIST(TL_DECL_NVML)
#define TL_PROTO_CU(name, args) EXPORT CUresult name args;
#define TL_PROTO_NVML(name, args) EXPORT nvmlReturn_t name args;
CU_HOOK_LIST(TL_PROTO_CU)
NVML_HOOK_LIST(TL_PROTO_NVML)

#define CALL_REAL(name, ...) (real_##name ? real_##name(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)
#define CALL_NVML(name, ...) (real_##name ? real_##name(__VA_ARGS__) : NVML_ERROR_FUNCTION_NOT_FOUND)

/* ---- tl_resolve.c ---- */
extern tl_config cfg;
extern tl_shared sh;
extern int tl_cuda_ready, tl_nvml_ready;
void tl_cuda_init(void);
void tl_nvml_init(void);

static inline void ensure_cuda(void)
{
    if (UNLIKELY(!__atomic_load_n(&tl_cuda_ready, __ATOMIC_ACQUIRE)))
        tl_cuda_init();
}

static inline void ensure_nvml(void)
{
    if (UNLIKELY(!__atomic_load_n(&tl_nvml_ready, __ATOMIC_ACQUIRE)))
        tl_nvml_init();
}

/* ---- tl_account.c ---- */
/* Limiter device (index into cfg's limits and the shared state) of a CUDA
 * ordinal: the ordinal itself with limits from the environment; with the
 * limits file, the device whose UUID the ordinal has. -1: not in the file
 * (allocations there are refused). */
int tl_ld_of_ordinal(int ordinal);
int tl_ld_of_nvml(nvmlDevice_t d);
/* CUDA ordinal of a limiter device, -1 if not present in this process. */
int tl_ordinal_of_ld(int ld);
/* NVML handle of a limiter device. 0 or -1. */
int tl_nvml_of_ld(int ld, nvmlDevice_t *out);
int tl_current_ordinal(void);
/* The device a stream's work runs on (its context's), else the current one. */
int tl_stream_ordinal(CUstream s, int ptsz);
uint64_t tl_limit_of(int ld);     /* 0 = unlimited; 1 for an unknown device (fail closed) */
/* What a container may charge on ld now: the limit, or with a ceiling the
 * guarantee (tl_limit_of) plus what the budget file lends, up to the
 * ceiling. */
uint64_t tl_alloc_limit(int ld);
/* What a container is told its device's memory is: the ceiling if any,
 * else the limit. */
uint64_t tl_total_of(int ld);
/* At a call's entry (no lock held): re-read ld's budget file when a
 * charge of `bytes` (0: a report) goes past the guarantee. */
void tl_budget_refresh(int ld, uint64_t bytes);
/* The driver refused an allocation of `bytes` on ld that the limiter had
 * charged (no lock held). Within the guarantee, with reclaim configured:
 * asks the node agent to reclaim (the need file), waits a little and
 * returns 1: retry the call. 0: give up (over the guarantee, not
 * configured, or reclaim_wait has passed since the first refusal).
 * *deadline starts at 0 for each call. */
int tl_reclaim_retry(int ld, uint64_t bytes, double *deadline);
int tl_ensure_registered(void);
/* 1 charged, 0 not limited (nothing to track), -1 refused. */
int tl_reserve(int ld, uint64_t bytes);
/* The same without counting a refusal (charges that are not an allocation
 * call's: a graph launch whose pool grew). */
int tl_reserve_uncounted(int ld, uint64_t bytes);
/* Count an allocation call on ld refused because of the memory limit
 * (tl_reserve counts its own refusals). */
void tl_count_refused(int ld);
void tl_release(int ld, uint64_t bytes);
/* Charge what the driver already holds, over the limit if need be. */
void tl_force_charge(int ld, uint64_t bytes);
/* Record a successful allocation; if the table cannot grow, undo the
 * allocation and the charge (returns -1). */
int tl_track(int kind, uint64_t key, uint64_t bytes, int ld);
/* At the entry of an intercepted call that may charge `bytes` on ld (no
 * limiter lock held): the periodic reconciliation, and a fresh look at
 * pools and NVML when the charge would not fit. */
void tl_account_prepare(int ld, uint64_t bytes);
/* Something the limiter cannot see may have taken memory on ld (-1: all
 * devices): reconcile with NVML at the next entry. */
void tl_mark_dirty(int ld);
void tl_account_after_fork(void);

/* ---- diagnostics (tl_resolve.c) ---- */
/* One line to the trace file, "<TESSERA_LIMITER_TRACE>.<pid>", prefixed
 * with the limiter's clock (simulated in the simulation build) and a
 * wall-clock time; nothing when the variable is unset. One write() per
 * line (O_APPEND): lines of threads and processes do not interleave. */
#define TL_TRACING (cfg.trace_path[0] != 0)
void tl_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- tl_nvml.c ---- */
int tl_nvml_up(void);
/* This process's host pid (as NVML reports it), 0 until known. */
int32_t tl_host_pid(void);
/* The compute processes on limiter device ld: count, or -1. */
int tl_gpu_procs(int ld, tl_gpu_proc *out, int max);
/* Device memory NVML says is free on ld. 0 or -1. */
int tl_nvml_free(int ld, uint64_t *out);
/* Around a call that may create this process's first context on an
 * ordinal: returns a token for tl_hp_ctx_end. */
int tl_hp_ctx_begin(int ordinal);
void tl_hp_ctx_end(int ordinal, int token, CUresult r);
/* One step of host pid discovery on ld, from the pacing period. */
void tl_hp_period(int ld);
void tl_hp_after_alloc(int ld); /* after a tracked allocation: retry the host pid */
/* Host pids of the container's processes (own included when known). */
int tl_container_host_pids(int32_t *out, int n);
void tl_nvml_after_fork(void);

/* ---- tl_alloc.c ---- */
int tl_capturing(CUstream s, int ptsz);
/* Re-read the stream-ordered pools of ld (-1: all): their charge follows
 * what they reserve. */
void tl_pools_resync(int ld);
void tl_alloc_after_fork(void);

/* ---- tl_ctx.c ---- */
/* CUDA ordinal of a context this process created or retained, -1 if unknown. */
int tl_ctx_ordinal(CUcontext c);
void tl_ctx_after_fork(void);

/* ---- tl_graph.c, tl_vmm.c, tl_pace.c ---- */
void tl_graph_after_fork(void);
void tl_vmm_after_fork(void);
void tl_pace_after_fork(void);
/* graph launches are both paced (tl_pace.c) and charged (tl_graph.c) */
CUresult tl_graph_run(CUgraphExec e, CUstream s, int ptsz, int upload);

#endif
