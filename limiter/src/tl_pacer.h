/*
 * tl_pacer.h - the compute-share controller, as pure functions with no I/O
 * so it can be tested against a simulated GPU (test/test_pacer.c).
 *
 * Pacing is by GPU time. Each launch is charged its estimated GPU time
 * (tl_costs: learned per kernel and per graph from the driver's event
 * timings of sampled launches) against a bucket that refills at `rate`
 * GPU-seconds per second (tl_gbucket). Every sampling period (~100 ms) the
 * controller compares the container's measured SM utilisation (NVML) with
 * the target and corrects the rate with a PI law in log-space
 * (tl_pacer_step), which absorbs what the estimates get wrong (time-slicing
 * with neighbours, concurrent streams). A launch waits at most
 * TL_MAX_DEBT_S for its turn: the bucket's debt is capped, so one long
 * grid after many cheap launches cannot stall the process for minutes.
 */
#ifndef TL_PACER_H
#define TL_PACER_H

#include <stdint.h>

typedef struct tl_pacer {
    double rate;      /* refill: GPU-seconds per second */
    double rate_min;
    double rate_max;
    double kp, ki;    /* PI gains on the relative error (target-u)/target */
    double prev_err;
    double used;      /* the admitted rate, smoothed over a few periods: one
                       * long launch per several periods is still binding */
} tl_pacer;

void tl_pacer_init(tl_pacer *p, double rate0, double rate_min, double rate_max);

/* Target actually pursued. Non-elastic (default): `target`. Elastic: also
 * borrow capacity the other tenants leave idle (others_pct = utilisation of
 * everyone else on the device), keeping a 5-point margin. */
double tl_pacer_effective_target(double target_pct, double others_pct, int elastic);

/* One control step.
 *   target_pct    share to reach (0 < target < 100)
 *   measured_pct  this container's SM utilisation over the last period
 *   used_rate     estimated GPU-seconds/s admitted in the last period
 *                 (smoothed here over a few periods)
 *   throttled     nonzero if a launch had to wait in the last period
 * The bucket counts as binding only if throttled and used_rate >= rate/2;
 * otherwise the rate is steered from the rate actually used (falling at
 * most by half per step), which prevents wind-up.
 * Returns the new rate (also stored in p->rate). */
double tl_pacer_step(tl_pacer *p, double target_pct, double measured_pct,
                     double used_rate, int throttled);

/* GPU-time bucket. A launch may go while tokens > 0 and then drives the
 * balance down by its cost, but never below rate * max_debt_s: a launch
 * bigger than that is forgiven the excess rather than stalling the process
 * (a kernel longer than the debt cap cannot be paced below its length). */
#define TL_MAX_DEBT_S 0.5
typedef struct tl_gbucket {
    double tokens;     /* GPU-seconds; negative = debt */
    double last_s;
    double burst_s;    /* at most this many seconds of refill are saved */
    double max_debt_s; /* the debt is capped at this many seconds of refill */
} tl_gbucket;

void tl_gbucket_init(tl_gbucket *b, double burst_s, double max_debt_s);
/* Returns 0 if the launch may go now (and charges `cost` GPU-seconds),
 * otherwise the seconds to wait before asking again. */
double tl_gbucket_take(tl_gbucket *b, double rate, double now_s, double cost);

/* Estimated GPU time of launches, learned per key (a kernel function or a
 * graph exec) from measured launches: kernels scale with their blocks,
 * graphs are charged per launch. A key never measured gets the class
 * default, the running average of the measured ones. */
#define TL_COST_SLOTS 256
enum { TL_COST_KERNEL = 0, TL_COST_GRAPH = 1 };

typedef struct tl_cost_slot {
    uint64_t key;
    int used, kind;
    int measured;       /* per_unit is from a measurement */
    int pending;        /* a sampled launch of this key is in flight */
    double per_unit;    /* GPU-seconds per block (kernel) or per launch (graph) */
    double last_sample; /* when the last sample was taken (s) */
    double last_use;
} tl_cost_slot;

typedef struct tl_costs {
    tl_cost_slot s[TL_COST_SLOTS];
    double dflt[2];     /* class defaults */
    int ndflt[2];
} tl_costs;

void tl_costs_init(tl_costs *c);
/* The slot of (kind, key), claiming the least recently used one for a new
 * key. Never NULL. */
tl_cost_slot *tl_costs_slot(tl_costs *c, int kind, uint64_t key, double now_s);
/* Estimated GPU-seconds of a launch of `units` blocks (kernel) or 1 (graph). */
double tl_costs_estimate(const tl_costs *c, const tl_cost_slot *s, double units);
/* A measured launch: `units` took `seconds`. */
void tl_costs_learn(tl_costs *c, tl_cost_slot *s, double units, double seconds);

#endif
