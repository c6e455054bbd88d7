/* bench.c - cost of intercepted calls through the fake driver. Run once
 * without and once with the limiter preloaded; run_bench.sh prints the
 * difference. The fake calls themselves cost a few ns. Each figure is the
 * best of 10 rounds (of N/10 calls), so that time the process spent
 * descheduled on a busy machine does not count.
 *
 * An idle thread is started first, because a process using the real driver
 * always has several (libcuda starts its own at cuInit), and with an SM
 * limit the limiter starts one too: in a single-threaded process glibc
 * skips atomics (malloc, stdio), and the difference (20 to 70 ns per call
 * of the fake, measured) would be counted against the limiter. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "fake_api.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static volatile size_t sink;

static double round_getinfo(long n)
{
    size_t f, t;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        cuMemGetInfo_v2(&f, &t);
        sink += f;
    }
    return (now_ns() - t0) / (double)n;
}

static double round_launch(long n)
{
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    return (now_ns() - t0) / (double)n;
}

static double round_alloc(long n)
{
    CUdeviceptr d;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        cuMemAlloc_v2(&d, 4096);
        cuMemFree_v2(d);
    }
    return (now_ns() - t0) / (double)n;
}

static double round_async(long n)
{
    CUdeviceptr d;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        cuMemAllocAsync(&d, 4096, NULL);
        cuMemFreeAsync(d, NULL);
    }
    return (now_ns() - t0) / (double)n;
}

static CUgraphExec gexec; /* first a graph without memory nodes */

static double round_graph(long n)
{
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        cuGraphLaunch(gexec, NULL);
    return (now_ns() - t0) / (double)n;
}

static double best(double (*f)(long), long n)
{
    double b = 1e30;
    f(n / 10); /* warm-up */
    for (int r = 0; r < 10; r++) {
        double v = f(n / 10);
        if (v < b)
            b = v;
    }
    return b;
}

static void *idle(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    if (n < 10)
        n = 10;
    pthread_t t;
    if (pthread_create(&t, NULL, idle, NULL) != 0)
        return 1;
    cuInit(0);
    CUcontext pc; /* as cudart does: launches run in the primary context */
    cuDevicePrimaryCtxRetain(&pc, 0);
    cuCtxSetCurrent(pc);
    printf("cuMemGetInfo_v2 %.1f\n", best(round_getinfo, n));
    printf("cuLaunchKernel %.1f\n", best(round_launch, n));
    printf("cuMemAlloc_v2+cuMemFree_v2 %.1f\n", best(round_alloc, n / 10));
    printf("cuMemAllocAsync+cuMemFreeAsync %.1f\n", best(round_async, n / 10));
    CUgraph g0;
    cuGraphCreate(&g0, 0);
    cuGraphInstantiateWithFlags(&gexec, g0, 0);
    printf("cuGraphLaunch(no-alloc-nodes) %.1f\n", best(round_graph, n));
    /* a graph with a memory-alloc node, relaunched (its memory is backed) */
    CUgraph g;
    CUgraphNode node;
    TL_MEM_ALLOC_NODE_PARAMS ap = {0};
    ap.poolProps.location.type = 1;
    ap.bytesize = 1 << 20;
    cuGraphCreate(&g, 0);
    cuGraphAddMemAllocNode(&node, g, NULL, 0, &ap);
    cuGraphInstantiateWithFlags(&gexec, g, 0);
    cuGraphLaunch(gexec, NULL);
    printf("cuGraphLaunch(alloc-node) %.1f\n", best(round_graph, n));
    return 0;
}
