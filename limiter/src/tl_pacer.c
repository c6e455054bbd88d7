/* tl_pacer.c - see tl_pacer.h. No I/O, no globals. */
#include "tl_compat.h"

#include "tl_pacer.h"

#include <math.h>
#include <string.h>

void tl_pacer_init(tl_pacer *p, double rate0, double rate_min, double rate_max)
{
    p->rate = rate0;
    p->rate_min = rate_min;
    p->rate_max = rate_max;
    p->kp = 0.2;
    p->ki = 0.5;
    p->prev_err = 0;
    p->used = -1;
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

double tl_pacer_step(tl_pacer *p, double target_pct, double measured_pct, double used_rate, int throttled)
{
    if (!(target_pct > 0))
        target_pct = 1;
    if (!throttled && !(used_rate > 0))
        return p->rate; /* idle period: no evidence either way, hold */
    used_rate = p->used < 0 ? used_rate : 0.5 * p->used + 0.5 * used_rate;
    p->used = used_rate;
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

void tl_gbucket_init(tl_gbucket *b, double burst_s, double max_debt_s)
{
    memset(b, 0, sizeof(*b));
    b->burst_s = burst_s;
    b->max_debt_s = max_debt_s;
}

double tl_gbucket_take(tl_gbucket *b, double rate, double now_s, double cost)
{
    if (!(rate > 0))
        rate = 1e-6;
    double dt = now_s - b->last_s;
    if (dt > 0) {
        b->tokens += dt * rate;
        double cap = rate * b->burst_s;
        if (b->tokens > cap)
            b->tokens = cap;
        b->last_s = now_s;
    }
    double floor_ = -rate * b->max_debt_s;
    if (b->tokens < floor_)
        b->tokens = floor_; /* the rate fell since the debt was made */
    if (b->tokens > 0) {
        b->tokens -= cost > 0 ? cost : 0;
        if (b->tokens < floor_)
            b->tokens = floor_;
        return 0;
    }
    return (-b->tokens + 1e-9) / rate;
}

void tl_costs_init(tl_costs *c)
{
    memset(c, 0, sizeof(*c));
    c->dflt[TL_COST_KERNEL] = 10e-6; /* per block, until something is measured */
    c->dflt[TL_COST_GRAPH] = 1e-3;   /* per launch */
}

tl_cost_slot *tl_costs_slot(tl_costs *c, int kind, uint64_t key, double now_s)
{
    uint64_t h = (key ^ (uint64_t)kind * 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;
    unsigned i0 = (unsigned)(h >> 56) % TL_COST_SLOTS;
    tl_cost_slot *victim = NULL;
    for (unsigned k = 0; k < 8; k++) { /* a small neighbourhood: bounded work per launch */
        tl_cost_slot *s = &c->s[(i0 + k) % TL_COST_SLOTS];
        if (s->used && s->key == key && s->kind == kind) {
            s->last_use = now_s;
            return s;
        }
        if (!victim || !s->used || (victim->used && s->last_use < victim->last_use))
            victim = s;
    }
    memset(victim, 0, sizeof(*victim));
    victim->used = 1;
    victim->key = key;
    victim->kind = kind;
    victim->last_use = now_s;
    victim->last_sample = -1e9;
    return victim;
}

double tl_costs_estimate(const tl_costs *c, const tl_cost_slot *s, double units)
{
    double per = s->measured ? s->per_unit : c->dflt[s->kind];
    return per * (units > 0 ? units : 1);
}

void tl_costs_learn(tl_costs *c, tl_cost_slot *s, double units, double seconds)
{
    if (!(seconds >= 0) || !(units > 0))
        return;
    double per = seconds / units;
    s->per_unit = s->measured ? 0.5 * s->per_unit + 0.5 * per : per;
    s->measured = 1;
    int k = s->kind;
    c->dflt[k] = c->ndflt[k]++ ? 0.8 * c->dflt[k] + 0.2 * per : per;
}
