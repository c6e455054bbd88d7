/*
 * fake.h - internals shared by the files of the fake libcuda.so.1
 * (fake_cuda.c, fake_graph.c, fake_gpu.c, fake_gpa.c). Nothing here is
 * exported except the fake_* helpers declared in ../fake_api.h.
 *
 * The fake keeps, per process, what a driver keeps: contexts, the physical
 * device memory each allocation holds (fake_mem_*), a FIFO "GPU" per device
 * that runs launched work for a simulated duration (fake_gpu.c), events on
 * that timeline, stream-ordered pools, VMM handles and graphs. Exported
 * driver functions never call each other (with the limiter preloaded such a
 * call would go through its wrapper a second time): they share static
 * helpers instead. The library is linked with -Bsymbolic, so the addresses
 * it hands out through cuGetProcAddress are its own, as a real driver's
 * are, not the limiter's wrappers that interpose on its exported names.
 */
#ifndef FAKE_H
#define FAKE_H

#define _GNU_SOURCE
#include <pthread.h>

#include "fake_api.h"
#include "fake_common.h"
#include "fake_limits.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

extern pthread_mutex_t fake_mu; /* memory, contexts, pools, VMM, graphs */
extern int fake_inited;

#define NEED_INIT()                                \
    do {                                           \
        if (!fake_inited)                          \
            return CUDA_ERROR_NOT_INITIALIZED;     \
    } while (0)

/* ---- contexts ---- */
struct fake_ctx {
    int magic;          /* 1 = live */
    int dev;            /* ordinal */
    int primary;
    int launched;       /* a kernel ran in it (FAKE_CTX_GROWTH taken) */
    size_t limit[3];    /* CUlimit: stack, printf fifo, malloc heap */
    size_t heap_mapped; /* heap bytes backed (at the first launch after a set) */
};
/* The calling thread's current context (NULL: none; the fake then acts
 * as if the primary context of device 0 were current). */
struct fake_ctx *fake_current(void);
int fake_current_dev(void);
/* Device of a stream's context (NULL / legacy / per-thread: current). */
int fake_stream_dev(CUstream s);
/* First launch in the current context: context growth and a pending heap. */
void fake_ctx_on_launch(struct fake_ctx *c);

/* ---- physical device memory of this process ---- */
/* Take n bytes on dev if the GPU has them free (what this process and the
 * other processes of the shared table leave). Returns 0 or -1. With
 * fake_mu held. */
int fake_mem_take(int dev, unsigned long long n);
void fake_mem_give(int dev, unsigned long long n);

/* ---- the GPU: clock, FIFO queues, events (fake_gpu.c) ---- */
/* FAKE_SIM=1: time is simulated (starts at 0, advances only through
 * fake_sleep and the CPU cost of API calls, FAKE_SIM_CALL_US, default 5 us),
 * and periodic callbacks registered by fake_every run as it passes their
 * period boundaries. Otherwise: CLOCK_MONOTONIC and nanosleep. */
int fake_sim(void);
void fake_cpu(void);            /* one API call's CPU time (sim only) */
int fake_every(double period_s, void (*fn)(void));
/* Enqueue work of `solo_s` GPU seconds on dev's FIFO (returns when queued;
 * blocks while FAKE_QUEUE_DEPTH items are pending). */
void fake_gpu_enqueue(int dev, double solo_s);
/* The time at which dev's queue reaches a marker enqueued now. */
double fake_gpu_marker(int dev);
void fake_gpu_wait_until(double t);
void fake_gpu_drain(int dev);
void fake_gpu_drain_all(void);
/* GPU time of a kernel launch (fake_kernel handles, else FAKE_BLOCK_US per
 * block, default 10 us) and of a graph launch (fake_graph_cost, else
 * FAKE_GRAPH_US, default 100 us). */
double fake_kernel_cost(CUfunction f, double blocks);
double fake_graph_launch_cost(CUgraphExec e);

/* ---- stream-ordered pools (fake_cuda.c), for sync calls ---- */
void fake_pools_on_sync(void);

/* ---- graphs (fake_graph.c); capture state lives with the streams ---- */
CUgraph *fake_stream_capture(CUstream s); /* NULL for the legacy/per-thread streams */
int fake_stream_capturing(CUstream s);
CUresult fake_capture_alloc(CUstream s, CUdeviceptr *p, size_t n);

/* ---- entry points (fake_gpa.c) ---- */
void *fake_entry(const char *name);

#endif
