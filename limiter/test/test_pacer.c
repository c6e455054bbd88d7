/*
 * test_pacer.c - the pacing controller against a simulated GPU.
 *
 * Plant: a process that launches as fast as the token bucket lets it (or
 * only `demand` of the GPU when not saturating). Each token (block) costs
 * `c` seconds of GPU time. Alone the process can use the whole GPU; next to
 * a saturating neighbour, time-slicing caps it at `avail` of the GPU. NVML
 * reports utilisation one period late and with +-noise points of jitter.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/tl_pacer.h"

static int passed, failed;

static void check(int ok, const char *name, double got, double want)
{
    if (ok) {
        printf("PASS %s (got %.2f, want %.2f)\n", name, got, want);
        passed++;
    } else {
        printf("FAIL %s: got %.2f, want %.2f\n", name, got, want);
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
    double c;        /* GPU seconds per token */
    double avail;    /* fraction of GPU the process can get at most */
    double demand;   /* fraction the app would use unthrottled (1 = saturating) */
    double noise;    /* +- points of measurement noise */
    int elastic;
    double others;   /* utilisation of other tenants, for elastic mode */
} plant;

typedef struct {
    double util_mean, util_sd, share_of_solo, final_rate;
} result;

/* Run `steps` periods of 100 ms; average over the last `window`. */
static result simulate(tl_pacer *p, plant *pl, double target, int steps, int window,
                       void (*change)(plant *, int))
{
    double prev_util = 0, sum = 0, sum2 = 0, tok = 0;
    for (int k = 0; k < steps; k++) {
        if (change)
            change(pl, k);
        double cap_rate = pl->avail / pl->c;             /* tokens/s the GPU gives us */
        double want_rate = pl->demand / pl->c;           /* tokens/s the app asks for */
        double limit_rate = want_rate < cap_rate ? want_rate : cap_rate;
        double used_rate = p->rate < limit_rate ? p->rate : limit_rate;
        int throttled = p->rate < limit_rate;
        double util = 100.0 * used_rate * pl->c;
        double measured = prev_util + pl->noise * urand();
        prev_util = util;
        double t = tl_pacer_effective_target(target, pl->others, pl->elastic);
        tl_pacer_step(p, t, measured, used_rate, throttled);
        if (k >= steps - window) {
            sum += util;
            sum2 += util * util;
            tok += used_rate;
        }
    }
    result r;
    r.util_mean = sum / window;
    r.util_sd = sqrt(fmax(0, sum2 / window - r.util_mean * r.util_mean));
    r.share_of_solo = 100.0 * (tok / window) / (1.0 / pl->c); /* solo: whole GPU */
    r.final_rate = p->rate;
    return r;
}

static void slowdown(plant *pl, int k)
{
    if (k == 150)
        pl->c *= 10; /* kernels suddenly 10x longer */
}

static void wake(plant *pl, int k)
{
    if (k == 150)
        pl->demand = 1.0; /* light user turns saturating */
}

int main(void)
{
    char name[128];
    const double targets[] = {10, 30, 50, 70, 90};
    const double costs[] = {1e-7, 1e-5, 1e-3};
    /* 1. alone on the GPU, saturating: converges to the target */
    for (size_t i = 0; i < 5; i++)
        for (size_t j = 0; j < 3; j++) {
            tl_pacer p;
            tl_pacer_init(&p, 1e6, 10, 1e12);
            plant pl = {costs[j], 1.0, 1.0, 3.0, 0, 0};
            result r = simulate(&p, &pl, targets[i], 200, 100, NULL);
            snprintf(name, sizeof(name), "alone target %.0f cost %.0e: mean util", targets[i], costs[j]);
            check(fabs(r.util_mean - targets[i]) <= 5, name, r.util_mean, targets[i]);
            snprintf(name, sizeof(name), "alone target %.0f cost %.0e: share of solo throughput", targets[i],
                     costs[j]);
            check(fabs(r.share_of_solo - targets[i]) <= 5, name, r.share_of_solo, targets[i]);
            snprintf(name, sizeof(name), "alone target %.0f cost %.0e: steady (sd <= 5)", targets[i], costs[j]);
            check(r.util_sd <= 5, name, r.util_sd, 5);
        }
    /* 2. next to a saturating neighbour (time-slicing caps us at 50%) */
    for (size_t i = 0; i < 3; i++) {
        tl_pacer p;
        tl_pacer_init(&p, 1e6, 10, 1e12);
        plant pl = {1e-5, 0.5, 1.0, 3.0, 0, 0};
        result r = simulate(&p, &pl, targets[i], 200, 100, NULL);
        double want = targets[i] < 50 ? targets[i] : 50;
        snprintf(name, sizeof(name), "vs saturating neighbour target %.0f: share of solo", targets[i]);
        check(fabs(r.share_of_solo - want) <= 5, name, r.share_of_solo, want);
    }
    /* 3. workload changes: re-converges */
    {
        tl_pacer p;
        tl_pacer_init(&p, 1e6, 10, 1e12);
        plant pl = {1e-5, 1.0, 1.0, 3.0, 0, 0};
        result r = simulate(&p, &pl, 30, 250, 60, slowdown);
        check(fabs(r.util_mean - 30) <= 5, "kernels 10x longer mid-run: re-converges to 30", r.util_mean, 30);
    }
    /* 4. a light user (10%) under a 30% cap is not throttled, and the rate
     *    does not wind up: when it turns saturating it is held to 30% fast */
    {
        tl_pacer p;
        tl_pacer_init(&p, 1e6, 10, 1e12);
        plant pl = {1e-5, 1.0, 0.10, 2.0, 0, 0};
        result r = simulate(&p, &pl, 30, 150, 50, NULL);
        check(fabs(r.util_mean - 10) <= 1, "light user keeps its 10%", r.util_mean, 10);
        double demand_rate = 0.10 / 1e-5;
        check(r.final_rate <= 3 * demand_rate, "no wind-up: rate within 3x of use", r.final_rate / demand_rate, 3);
        tl_pacer_init(&p, 1e6, 10, 1e12);
        plant pl2 = {1e-5, 1.0, 0.10, 2.0, 0, 0};
        r = simulate(&p, &pl2, 30, 200, 20, wake);
        check(fabs(r.util_mean - 30) <= 5, "light user turns saturating: held to 30 within 3 s", r.util_mean, 30);
    }
    /* 4b. an idle period (no launches) holds the rate: a bursty process
     *     resumes at its operating point instead of ramping up again */
    {
        tl_pacer p;
        tl_pacer_init(&p, 1e6, 10, 1e12);
        plant pl = {1e-5, 1.0, 1.0, 3.0, 0, 0};
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
        tl_pacer_init(&p, 1e6, 10, 1e12);
        plant pl = {1e-5, 1.0, 1.0, 3.0, 0, 0};
        result r = simulate(&p, &pl, 30, 200, 100, NULL);
        check(fabs(r.util_mean - 30) <= 5, "default (non-elastic) alone on GPU stays at 30", r.util_mean, 30);
        tl_pacer_init(&p, 1e6, 10, 1e12);
        plant pe = {1e-5, 1.0, 1.0, 3.0, 1, 0};
        r = simulate(&p, &pe, 30, 200, 100, NULL);
        check(r.util_mean >= 85, "elastic alone on GPU uses idle capacity", r.util_mean, 95);
    }
    /* 6. token bucket: long-run rate equals the refill rate */
    {
        tl_bucket b;
        memset(&b, 0, sizeof(b));
        b.burst = 0.02;
        double rate = 5000, t = 0, got = 0;
        while (t < 10) {
            double w = tl_bucket_take(&b, rate, t, 7);
            if (w == 0)
                got += 7;
            else
                t += w;
            t += 1e-5;
        }
        check(fabs(got / 10 - rate) / rate < 0.02, "bucket long-run rate = refill rate", got / 10, rate);
        /* a launch bigger than the burst is allowed, then paid back */
        memset(&b, 0, sizeof(b));
        b.burst = 0.02;
        double w1 = tl_bucket_take(&b, 100, 1.0, 1000);
        double w2 = tl_bucket_take(&b, 100, 1.0, 1);
        check(w1 == 0 && w2 > 9.9, "oversized launch goes, next waits for the debt", w2, 10);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
