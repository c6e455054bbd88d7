/* tl_pacer.c - see tl_pacer.h. No I/O, no globals. */
#include "tl_pacer.h"

#include <math.h>

void tl_pacer_init(tl_pacer *p, double rate0, double rate_min, double rate_max)
{
    p->rate = rate0;
    p->rate_min = rate_min;
    p->rate_max = rate_max;
    p->kp = 0.2;
    p->ki = 0.5;
    p->prev_err = 0;
}

double tl_pacer_effective_target(double target_pct, double others_pct, int elastic)
{
    if (!elastic)
        return target_pct;
    double idle = 100.0 - others_pct - 5.0;
    double t = idle > target_pct ? idle : target_pct;
    return t > 100.0 ? 100.0 : t;
}

static double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

double tl_pacer_step(tl_pacer *p, double target_pct, double measured_pct,
                     double used_rate, int throttled)
{
    if (!(target_pct > 0))
        target_pct = 1;
    if (!throttled && !(used_rate > 0))
        return p->rate; /* idle period: no evidence either way, hold */
    measured_pct = clamp(measured_pct, 0, 100);
    double err = clamp((target_pct - measured_pct) / target_pct, -4.0, 1.0);
    /* Operating point: if the bucket did not bind, the process ran at
     * used_rate, not at p->rate; steer from where it really was. This is
     * also the anti-windup: an idle process does not accumulate credit. */
    double base = p->rate;
    /* The bucket bound only if launches waited AND the process got close
     * to the allowed rate; if it used far less (it was descheduled, or
     * waited on something else) a low utilisation is no reason to raise. */
    int binding = throttled && used_rate >= 0.5 * p->rate;
    if (!binding && used_rate < base) {
        /* ...but by at most half per step: a period with few or no launches
         * (the process was descheduled, or is between bursts) is weak
         * evidence and must not collapse the rate. */
        base = used_rate > base * 0.5 ? used_rate : base * 0.5;
    }
    base = clamp(base, p->rate_min, p->rate_max);
    double step = clamp(p->kp * (err - p->prev_err) + p->ki * err, -1.0, 1.0);
    p->prev_err = err;
    p->rate = clamp(base * exp(step), p->rate_min, p->rate_max);
    return p->rate;
}

double tl_bucket_take(tl_bucket *b, double rate, double now_s, double cost)
{
    double dt = now_s - b->last_s;
    if (dt > 0) {
        b->tokens += dt * rate;
        double cap = rate * b->burst;
        if (b->tokens > cap)
            b->tokens = cap;
        b->last_s = now_s;
    }
    if (b->tokens > 0) {
        b->tokens -= cost;
        return 0;
    }
    double wait = (-b->tokens + 1e-9) / (rate > 0 ? rate : 1);
    return wait;
}
