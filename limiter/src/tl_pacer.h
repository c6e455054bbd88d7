/*
 * tl_pacer.h - the compute-share controller, as pure functions with no I/O
 * so it can be tested against a simulated GPU (test/test_pacer.c).
 *
 * Launches draw tokens from a bucket (one token per thread block); the
 * bucket refills at `rate` tokens/s. Every sampling period (~100 ms) the
 * controller compares the measured SM utilisation with the target and
 * updates the rate with a PI law in log-space (multiplicative steps), so
 * the gain does not depend on how long a block runs.
 */
#ifndef TL_PACER_H
#define TL_PACER_H

typedef struct tl_pacer {
    double rate;      /* tokens per second the bucket refills at */
    double rate_min;
    double rate_max;
    double kp, ki;    /* PI gains on the relative error (target-u)/target */
    double prev_err;
} tl_pacer;

void tl_pacer_init(tl_pacer *p, double rate0, double rate_min, double rate_max);

/* Target actually pursued. Non-elastic (default): `target`. Elastic: also
 * borrow capacity the other tenants leave idle (others_pct = utilisation of
 * everyone else on the device), keeping a 5-point margin. */
double tl_pacer_effective_target(double target_pct, double others_pct, int elastic);

/* One control step.
 *   target_pct    share to reach (0 < target < 100)
 *   measured_pct  this container's SM utilisation over the last period
 *   used_rate     tokens/s actually consumed in the last period
 *   throttled     nonzero if a launch had to wait in the last period
 * The bucket counts as binding only if throttled and used_rate >= rate/2;
 * otherwise the rate is steered from the rate actually used (falling at
 * most by half per step), which prevents wind-up.
 * Returns the new refill rate (also stored in p->rate). */
double tl_pacer_step(tl_pacer *p, double target_pct, double measured_pct,
                     double used_rate, int throttled);

/* Token bucket with debt: a launch may proceed while tokens > 0 and then
 * drives the balance negative by its cost; later launches wait until the
 * refill has paid the debt. Pure: the caller supplies the clock. */
typedef struct tl_bucket {
    double tokens;
    double burst;      /* cap on saved tokens, in seconds of rate */
    double last_s;
} tl_bucket;

/* Returns 0 if the launch may go now (and charges it), otherwise the number
 * of seconds to wait before asking again. */
double tl_bucket_take(tl_bucket *b, double rate, double now_s, double cost);

#endif
