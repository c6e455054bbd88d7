/*
 * test_pacer.c - the pacing maths (tl_pacer.c) against simulated GPUs.
 *
 * 1-5: the PI controller. Plant: a process that launches as fast as the
 * bucket lets it (or only `demand` of the GPU when not saturating). The
 * bucket admits `rate` GPU-seconds per second of *estimated* cost; the
 * estimates are off by a factor `bias` (what the events measure over what
 * the work takes alone: 2 next to a time-slicing neighbour). Alone the
 * process can use the whole GPU; next to a saturating neighbour,
 * time-slicing caps it at `avail`. NVML reports utilisation one period
 * late and with +-noise points of jitter.
 * 6-7: the GPU-time bucket and the cost model.
 * 8: both against a FIFO GPU, launch by launch.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/tl_pacer.h"

static int passed, failed;

static void check(int ok, const char *name, double got, double want)
{
    if (ok) {
        printf("PASS %s (got %.3f, want %.3f)\n", name, got, want);
        passed++;
    } else {
        printf("FAIL %s: got %.3f, want %.3f\n", name, got, want);
        failed++;
    }
}

static unsigned long long rng = 88172645463325252ull;
static double urand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

typedef struct {
    double bias;     /* estimated GPU time / GPU time the work takes alone */
    double avail;    /* fraction of the GPU the process can get at most */
    double demand;   /* fraction the app would use unthrottled (1 = saturating) */
    double noise;    /* +- points of measurement noise */
    int elastic;
    double others;   /* utilisation of other tenants, for elastic mode */
} plant;

typedef struct {
    double util_mean, util_sd, final_rate;
} result;

/* Run `steps` periods of 100 ms; average over the last `window`. Rates in
 * estimated GPU-seconds per second. */
static result simulate(tl_pacer *p, plant *pl, double target, int steps, int window, void (*change)(plant *, int))
{
    double prev_util = 0, sum = 0, sum2 = 0;
    for (int k = 0; k < steps; k++) {
        if (change)
            change(pl, k);
        double cap_rate = pl->avail * pl->bias;  /* what the GPU gives us, in estimate units */
        double want_rate = pl->demand * pl->bias;
        double limit_rate = want_rate < cap_rate ? want_rate : cap_rate;
        double used_rate = p->rate < limit_rate ? p->rate : limit_rate;
        int throttled = p->rate < limit_rate;
        double util = 100.0 * used_rate / pl->bias;
        double measured = prev_util + pl->noise * urand();
        prev_util = util;
        double t = tl_pacer_effective_target(target, pl->others, pl->elastic);
        tl_pacer_step(p, t, measured, used_rate, throttled);
        if (k >= steps - window) {
            sum += util;
            sum2 += util * util;
        }
    }
    result r;
    r.util_mean = sum / window;
    r.util_sd = sqrt(fmax(0, sum2 / window - r.util_mean * r.util_mean));
    r.final_rate = p->rate;
    return r;
}

static void slowdown(plant *pl, int k)
{
    if (k == 150)
        pl->bias *= 3; /* the estimates suddenly three times too high */
}

static void wake(plant *pl, int k)
{
    if (k == 150)
        pl->demand = 1.0; /* light user turns saturating */
}

/* ---- 8: a FIFO GPU, launch by launch ----
 * The launcher asks for launches as fast as the gate admits them (5 us of
 * CPU each); the GPU runs them in order. The cost model learns a launch's
 * GPU time when it completes (as the events report it); an unmeasured kind
 * waits for its first measurement. Returns the share after `warm` s and
 * the longest gap in the GPU work. */
typedef struct {
    double share, gap;
} fifo_result;

#define MAXRUN 400000
static struct {
    double start, end;
} runs[MAXRUN];

/* GPU time of the runs inside [a, b) */
static double busy_in(int n, double a, double b)
{
    double s = 0;
    for (int i = n - 1; i >= 0 && runs[i].end > a; i--) {
        double x = runs[i].start > a ? runs[i].start : a, y = runs[i].end < b ? runs[i].end : b;
        if (y > x)
            s += y - x;
    }
    return s;
}

static fifo_result fifo(double target, double seconds, double warm, double (*work)(double t, int *kind, double *units))
{
    tl_pacer p;
    tl_pacer_init(&p, target / 100, 0.001, 2.0);
    tl_gbucket b;
    tl_gbucket_init(&b, 0.1, TL_MAX_DEBT_S);
    tl_costs c;
    tl_costs_init(&c);
    double t = 0, tail = 0, used = 0, next_step = 0.1, prev_util = -1;
    int thr = 0, n = 0;
    struct {
        double end, units, dur;
        int pending;
    } inflight[2];
    memset(inflight, 0, sizeof(inflight));
    while (t < seconds && n < MAXRUN) {
        int kind;
        double units;
        double dur = work(t, &kind, &units);
        for (int k = 0; k < 2; k++) /* a finished sample: the events' elapsed time */
            if (inflight[k].pending && inflight[k].end <= t) {
                tl_cost_slot *ks = tl_costs_slot(&c, k, (uint64_t)k, t);
                tl_costs_learn(&c, ks, inflight[k].units, inflight[k].dur);
                ks->pending = 0;
                inflight[k].pending = 0;
            }
        tl_cost_slot *s = tl_costs_slot(&c, kind, (uint64_t)kind, t);
        if (!s->measured && s->pending) { /* wait for the first measurement */
            t = inflight[kind].end > t ? inflight[kind].end : t + 1e-3;
        } else {
            double est = tl_costs_estimate(&c, s, units);
            double w = tl_gbucket_take(&b, p.rate, t, est);
            if (w > 0) {
                thr = 1;
                t += w < 0.01 ? w : 0.01;
            } else {
                used += est;
                double start = tail > t ? tail : t;
                tail = start + dur;
                runs[n].start = start;
                runs[n++].end = tail;
                if (!s->pending && (!s->measured || t - s->last_sample > 0.05)) {
                    s->pending = 1;
                    s->last_sample = t;
                    inflight[kind].pending = 1;
                    inflight[kind].end = tail;
                    inflight[kind].units = units;
                    inflight[kind].dur = dur;
                }
                t += 5e-6;
            }
        }
        while (t >= next_step) { /* control step: NVML reports the last period, one period late */
            double util = 100.0 * busy_in(n, next_step - 0.1, next_step) / 0.1;
            tl_pacer_step(&p, target, prev_util < 0 ? util : prev_util, used / 0.1, thr);
            prev_util = util;
            used = 0;
            thr = 0;
            next_step += 0.1;
        }
    }
    /* the longest gap in the GPU work after the warm-up */
    double gap = 0, last = warm;
    for (int i = 0; i < n; i++) {
        if (runs[i].end <= warm)
            continue;
        if (runs[i].start - last > gap)
            gap = runs[i].start - last;
        if (runs[i].end > last)
            last = runs[i].end;
    }
    if (seconds - last > gap)
        gap = seconds - last;
    fifo_result r = {100.0 * busy_in(n, warm, seconds) / (seconds - warm), gap};
    return r;
}

/* 2 ms graphs, then 100 ms grids (100k blocks of 1 us): the case where
 * one token per graph used to leave minutes of debt */
static double graphs_then_grids(double t, int *kind, double *units)
{
    if (t < 10) {
        *kind = TL_COST_GRAPH;
        *units = 1;
        return 0.002;
    }
    *kind = TL_COST_KERNEL;
    *units = 100000;
    return 0.1;
}

static double persistent(double t, int *kind, double *units)
{
    (void)t;
    *kind = TL_COST_KERNEL;
    *units = 132;
    return 0.05;
}

int main(void)
{
    char name[128];
    const double targets[] = {10, 30, 50, 70, 90};
    const double biases[] = {0.5, 1, 2};
    /* 1. alone on the GPU, saturating: converges to the target whatever the
     *    estimates' error */
    for (size_t i = 0; i < 5; i++)
        for (size_t j = 0; j < 3; j++) {
            tl_pacer p;
            tl_pacer_init(&p, targets[i] / 100, 0.001, 2.0);
            plant pl = {biases[j], 1.0, 1.0, 3.0, 0, 0};
            result r = simulate(&p, &pl, targets[i], 200, 100, NULL);
            snprintf(name, sizeof(name), "alone target %.0f estimates x%.1f: mean util", targets[i], biases[j]);
            check(fabs(r.util_mean - targets[i]) <= 5, name, r.util_mean, targets[i]);
            snprintf(name, sizeof(name), "alone target %.0f estimates x%.1f: steady (sd <= 5)", targets[i], biases[j]);
            check(r.util_sd <= 5, name, r.util_sd, 5);
        }
    /* 2. next to a saturating neighbour: time-slicing caps us at 50 %, and
     *    the events see each kernel take twice its time */
    for (size_t i = 0; i < 3; i++) {
        tl_pacer p;
        tl_pacer_init(&p, targets[i] / 100, 0.001, 2.0);
        plant pl = {2.0, 0.5, 1.0, 3.0, 0, 0};
        result r = simulate(&p, &pl, targets[i], 200, 100, NULL);
        double want = targets[i] < 50 ? targets[i] : 50;
        snprintf(name, sizeof(name), "vs saturating neighbour target %.0f: share of solo", targets[i]);
        check(fabs(r.util_mean - want) <= 5, name, r.util_mean, want);
    }
    /* 3. the estimates go wrong mid-run: re-converges */
    {
        tl_pacer p;
        tl_pacer_init(&p, 0.3, 0.001, 2.0);
        plant pl = {1.0, 1.0, 1.0, 3.0, 0, 0};
        result r = simulate(&p, &pl, 30, 250, 60, slowdown);
        check(fabs(r.util_mean - 30) <= 5, "estimates 3x too high mid-run: re-converges to 30", r.util_mean, 30);
    }
    /* 4. a light user (10%) under a 30% cap is not throttled, and the rate
     *    does not wind up: when it turns saturating it is held to 30% fast */
    {
        tl_pacer p;
        tl_pacer_init(&p, 0.3, 0.001, 2.0);
        plant pl = {1.0, 1.0, 0.10, 2.0, 0, 0};
        result r = simulate(&p, &pl, 30, 150, 50, NULL);
        check(fabs(r.util_mean - 10) <= 1, "light user keeps its 10%", r.util_mean, 10);
        check(r.final_rate <= 3 * 0.10, "no wind-up: rate within 3x of use", r.final_rate / 0.10, 3);
        tl_pacer_init(&p, 0.3, 0.001, 2.0);
        plant pl2 = {1.0, 1.0, 0.10, 2.0, 0, 0};
        r = simulate(&p, &pl2, 30, 200, 20, wake);
        check(fabs(r.util_mean - 30) <= 5, "light user turns saturating: held to 30 within 3 s", r.util_mean, 30);
    }
    /* 4b. an idle period (no launches) holds the rate */
    {
        tl_pacer p;
        tl_pacer_init(&p, 0.3, 0.001, 2.0);
        plant pl = {1.0, 1.0, 1.0, 3.0, 0, 0};
        simulate(&p, &pl, 30, 100, 10, NULL);
        double before = p.rate;
        for (int k = 0; k < 50; k++)
            tl_pacer_step(&p, 30, 0, 0, 0);
        check(p.rate == before, "idle periods hold the rate", p.rate / before, 1);
    }
    /* 5. elastic mode */
    check(tl_pacer_effective_target(30, 0, 0) == 30, "non-elastic target ignores idle GPU",
          tl_pacer_effective_target(30, 0, 0), 30);
    check(tl_pacer_effective_target(30, 0, 1) == 95, "elastic borrows idle capacity (5-point margin)",
          tl_pacer_effective_target(30, 0, 1), 95);
    check(tl_pacer_effective_target(30, 80, 1) == 30, "elastic never below the guaranteed share",
          tl_pacer_effective_target(30, 80, 1), 30);
    {
        tl_pacer p;
        tl_pacer_init(&p, 0.3, 0.001, 2.0);
        plant pe = {1.0, 1.0, 1.0, 3.0, 1, 0};
        result r = simulate(&p, &pe, 30, 200, 100, NULL);
        check(r.util_mean >= 85, "elastic alone on GPU uses idle capacity", r.util_mean, 95);
    }
    /* 6. the GPU-time bucket */
    {
        tl_gbucket b;
        tl_gbucket_init(&b, 0.02, TL_MAX_DEBT_S);
        double rate = 0.3, t = 0, got = 0;
        while (t < 10) {
            double w = tl_gbucket_take(&b, rate, t, 0.001);
            if (w == 0)
                got += 0.001;
            else
                t += w;
            t += 1e-5;
        }
        check(fabs(got / 10 - rate) / rate < 0.02, "bucket long-run rate = refill rate", got / 10, rate);
        /* a launch far bigger than the bucket goes, and the debt it leaves
         * is capped: the next launch waits at most TL_MAX_DEBT_S */
        tl_gbucket_init(&b, 0.1, TL_MAX_DEBT_S);
        double w1 = tl_gbucket_take(&b, 0.3, 1.0, 0.001);
        double w2 = tl_gbucket_take(&b, 0.3, 1.0, 100.0);
        double w3 = tl_gbucket_take(&b, 0.3, 1.0, 0.001);
        check(w1 == 0 && w2 == 0 && w3 > 0 && w3 <= TL_MAX_DEBT_S + 1e-6,
              "a 100 s launch after a cheap one: the next waits at most the debt cap", w3, TL_MAX_DEBT_S);
        /* a rate that fell while in debt does not stretch the wait */
        double w4 = tl_gbucket_take(&b, 0.003, 1.0, 0.001);
        check(w4 <= TL_MAX_DEBT_S + 1e-6, "rate drop while in debt: wait still capped", w4, TL_MAX_DEBT_S);
    }
    /* 7. the cost model */
    {
        tl_costs c;
        tl_costs_init(&c);
        tl_cost_slot *k = tl_costs_slot(&c, TL_COST_KERNEL, 0x1000, 0);
        check(!k->measured && fabs(tl_costs_estimate(&c, k, 100) - 100 * 10e-6) < 1e-12,
              "unmeasured kernel: the class default per block", tl_costs_estimate(&c, k, 100), 1e-3);
        tl_costs_learn(&c, k, 1000, 0.05); /* 50 us per block */
        check(fabs(tl_costs_estimate(&c, k, 2000) - 0.1) < 1e-9, "kernel cost scales with its blocks",
              tl_costs_estimate(&c, k, 2000), 0.1);
        tl_cost_slot *g = tl_costs_slot(&c, TL_COST_GRAPH, 0x1000, 0);
        check(g != k && !g->measured, "a graph and a kernel with the same handle are apart", g->measured, 0);
        tl_costs_learn(&c, g, 1, 0.002);
        check(fabs(tl_costs_estimate(&c, tl_costs_slot(&c, TL_COST_GRAPH, 0x1000, 0), 1) - 0.002) < 1e-12,
              "graph cost per launch", tl_costs_estimate(&c, g, 1), 0.002);
        tl_cost_slot *n = tl_costs_slot(&c, TL_COST_KERNEL, 0x2000, 0);
        check(fabs(tl_costs_estimate(&c, n, 1) - 50e-6) < 1e-9, "a new kernel starts at the measured average",
              tl_costs_estimate(&c, n, 1), 50e-6);
        tl_costs_learn(&c, k, 1000, 0.15);
        check(fabs(k->per_unit - 100e-6) < 1e-9, "remeasured: the estimate follows (halfway)", k->per_unit, 100e-6);
        /* a thousand keys: slots are reused, lookups stay bounded */
        for (uint64_t key = 1; key <= 1000; key++)
            tl_costs_slot(&c, TL_COST_KERNEL, key << 12, (double)key);
        tl_cost_slot *again = tl_costs_slot(&c, TL_COST_KERNEL, 1000ull << 12, 2000);
        check(again->key == 1000ull << 12, "recent key found after many", (double)again->key, (double)(1000ull << 12));
    }
    /* 8. a FIFO GPU, launch by launch (the old token pacer left this case
     *    stalled for hours: one token per graph, then 100k-token grids) */
    {
        fifo_result r = fifo(30, 40, 12, graphs_then_grids);
        check(fabs(r.share - 30) <= 5, "fifo: graphs then 100 ms grids: 30% share", r.share, 30);
        check(r.gap < 1.0, "fifo: graphs then 100 ms grids: no stall over 1 s", r.gap, 1.0);
        r = fifo(30, 20, 3, persistent);
        check(fabs(r.share - 30) <= 5, "fifo: 50 ms persistent kernels: 30% share", r.share, 30);
        check(r.gap < 1.0, "fifo: 50 ms persistent kernels: no stall over 1 s", r.gap, 1.0);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
