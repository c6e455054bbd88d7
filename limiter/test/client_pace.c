/*
 * client_pace.c - compute pacing in simulated time. Run with FAKE_SIM=1
 * and the simulation build of the limiter (build/sim/), whose clock and
 * sampling period are those of the fake GPU (fake_gpu.c): the launcher, the
 * limiter's gate and its 100 ms control step share one simulated timeline,
 * so the share measured does not depend on how busy the CI machine is.
 *
 *   pacesim SCENARIO TARGET SECONDS
 *
 * A saturating launcher runs SCENARIO for SECONDS of simulated time; after
 * a 3 s warm-up the GPU time its work got (solo GPU seconds per second, so
 * next to a time-slicing neighbour it is the share of solo throughput) must
 * be TARGET +- 5 %, and no gap in its GPU work may exceed 1 s (a stall).
 * Scenarios:
 *   grids               10 ms grids, launched without synchronising
 *   graphs-then-grids   2 ms graphs, then (half-way) 100 ms grids of 100k blocks
 *   persistent          50 ms kernels of 132 blocks
 *   deep-queue          100 us kernels, never synchronised (the queue fills)
 *   sync-each           5 ms kernels, synchronised after each
 *   mixed               graphs, grids, tiny and persistent kernels interleaved
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* The least fraction of the run a saturating launcher spends held back:
 * launches cost no simulated time, so the launcher waits in the gate for
 * all but the GPU time it was given (measured: 0.70 of the run for
 * sync-each, 0.98 to 1.0 for the others) */
#define THROTTLE_MIN 0.5
typedef double (*now_fn)(void);
typedef double (*busy_fn)(int, double, double);
typedef CUfunction (*kernel_fn)(double, double);
typedef void (*gcost_fn)(CUgraphExec, double);

static CUgraphExec make_graph(double us)
{
    CUgraph g;
    CUgraphExec e = NULL;
    api.cuGraphCreate(&g, 0);
    api.cuGraphInstantiateWithFlags(&e, g, 0);
    ((gcost_fn)fake_fn("fake_graph_cost"))(e, us);
    return e;
}

static void pacesim(const char *scenario, double target, double seconds)
{
    now_fn now = (now_fn)fake_fn("fake_now");
    busy_fn busy = (busy_fn)fake_fn("fake_busy");
    kernel_fn kernel = (kernel_fn)fake_fn("fake_kernel");
    if (!now || !busy || !kernel || !getenv("FAKE_SIM")) {
        check(0, "pacesim-setup", "needs the fake libcuda with FAKE_SIM=1");
        return;
    }
    init_cuda();
    CUcontext pc;
    api.cuDevicePrimaryCtxRetain(&pc, 0);
    api.cuCtxSetCurrent(pc);
    CUfunction grid10 = kernel(0, 10), big = kernel(0, 1), persistent = kernel(50000, 0), tiny = kernel(0, 10),
               five = kernel(5000, 0);
    CUgraphExec g2 = make_graph(2000);
    unsigned long long thr0 = 0, thr1 = 0;
    int have = state_counters(0, &thr0, NULL) == 0;
    double t0 = now(), end = t0 + seconds;
    unsigned long long n = 0;
    while (now() < end) {
        double el = now() - t0;
        if (!strcmp(scenario, "grids")) {
            api.cuLaunchKernel(grid10, 1000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        } else if (!strcmp(scenario, "graphs-then-grids")) {
            if (el < seconds / 2)
                api.cuGraphLaunch(g2, NULL);
            else
                api.cuLaunchKernel(big, 100000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        } else if (!strcmp(scenario, "persistent")) {
            api.cuLaunchKernel(persistent, 132, 1, 1, 1024, 1, 1, 0, NULL, NULL, NULL);
        } else if (!strcmp(scenario, "deep-queue")) {
            api.cuLaunchKernel_ptsz(tiny, 10, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL);
        } else if (!strcmp(scenario, "sync-each")) {
            api.cuLaunchKernel(five, 80, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL);
            api.cuCtxSynchronize();
        } else if (!strcmp(scenario, "mixed")) {
            switch (n % 40) {
            case 0: api.cuLaunchKernel(persistent, 132, 1, 1, 1024, 1, 1, 0, NULL, NULL, NULL); break;
            case 1: case 2: case 3: api.cuGraphLaunch(g2, NULL); break;
            case 4: api.cuLaunchKernel(big, 30000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL); break;
            default: {
                TL_LAUNCH_CONFIG c;
                memset(&c, 0, sizeof(c));
                c.gridDimX = 10;
                c.gridDimY = c.gridDimZ = 1;
                api.cuLaunchKernelEx(&c, tiny, NULL, NULL);
            }
            }
        } else {
            check(0, "pacesim-scenario", "unknown scenario %s", scenario);
            return;
        }
        n++;
    }
    /* measure: the share after warm-up, 1 s windows, the longest gap */
    double w0 = t0 + 3, share = 100.0 * busy(0, w0, end) / (end - w0);
    double lo = 1e9, hi = 0;
    for (double t = w0; t + 1 <= end + 1e-9; t += 1) {
        double s = 100.0 * busy(0, t, t + 1);
        lo = s < lo ? s : lo;
        hi = s > hi ? s : hi;
    }
    double gap = 0, run = 0, bin = 0.01;
    for (double t = w0; t + bin <= end + 1e-9; t += bin) {
        run = busy(0, t, t + bin) > 0 ? 0 : run + bin;
        gap = run > gap ? run : gap;
    }
    double stop = now(); /* the last launch may have waited past `end` */
    have = have && state_counters(0, &thr1, NULL) == 0;
    double held = (double)(thr1 - thr0) * 1e-9;
    printf("# pacesim %s: target %.0f%% got %.1f%% (1 s windows %.1f..%.1f%%), longest stall %.2f s, %llu launches, "
           "held back %.2f s\n", scenario, target, share, lo, hi, gap, n, held);
    char name[128];
    snprintf(name, sizeof(name), "pacesim-%s-%.0f%%-share-within-5-points", scenario, target);
    check(fabs(share - target) <= 5, name, "got %.1f%%", share);
    snprintf(name, sizeof(name), "pacesim-%s-%.0f%%-no-stall-over-1s", scenario, target);
    check(gap < 1.0, name, "longest gap in its GPU work %.2f s", gap);
    /* a saturating launcher at its share spends most of the run held back
     * by the gate (one thread: never more than the run) */
    snprintf(name, sizeof(name), "pacesim-%s-%.0f%%-throttle-time-counted", scenario, target);
    check(have && held >= THROTTLE_MIN * (stop - t0) && held <= stop - t0 + 1e-6, name,
          "held back %.2f s of %.2f s (counters readable: %d)", held, stop - t0, have);
}

int pace_main(const char *t, int argc, char **argv)
{
    if (!strcmp(t, "pacesim") && argc > 4) {
        pacesim(argv[2], atof(argv[3]), atof(argv[4]));
        return 1;
    }
    return 0;
}
