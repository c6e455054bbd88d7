/*
 * tools.h - what the lab's GPU tools share: the driver and NVML loaded at
 * run time, as a CUDA program's runtime and nvidia-smi find them in a
 * container, with a clear message when the container has no GPU driver.
 * The types are ../cuda-abi/tl_cuda.h (shared with the limiter): no
 * NVIDIA header.
 */
#ifndef TOOLS_H
#define TOOLS_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_cuda.h"

static __attribute__((unused)) void *tool_lib(const char *name, const char *what)
{
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s: %s\n  (in tessera-lab, a container gets the GPU driver when it is given a GPU)\n", what,
                dlerror());
        exit(9);
    }
    return h;
}

static __attribute__((unused)) void *tool_sym(void *h, const char *name)
{
    void *f = dlsym(h, name);
    if (!f) {
        fprintf(stderr, "the driver has no %s\n", name);
        exit(9);
    }
    return f;
}

/* The name of a CUDA error, as cuGetErrorName would give it. */
static __attribute__((unused)) const char *cu_error_name(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    }
    return "CUDA_ERROR_UNKNOWN";
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (or "MIG-…" for a MIG device:
 * prefix) from cuDeviceGetUuid's bytes. */
static __attribute__((unused)) void uuid_string(const unsigned char u[16], const char *prefix, char out[41])
{
    snprintf(out, 41, "%.3s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

#define MiB (1024ull * 1024ull)

#endif
