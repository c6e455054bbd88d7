/*
 * tl_pace.c - compute pacing and the launch entry points.
 *
 * With an SM limit below 100 on a device, every launch (cuLaunchKernel,
 * cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch and their
 * _ptsz forms) is charged its estimated GPU time against a bucket that
 * refills at `rate` GPU-seconds per second (tl_pacer.h). Estimates are
 * learned per kernel function and per graph exec from the driver's own
 * timing of sampled launches: a launch is bracketed by two events on its
 * stream (the first launch of each kernel or graph, then one every 50 ms),
 * and cuEventElapsedTime gives its GPU time. Until a kernel or graph has
 * been measured, its next launch waits (at most 0.5 s) for the first
 * measurement, so a burst of an unknown long kernel cannot flood the queue.
 * The bucket's debt is capped, so no launch waits more than about 0.5 s.
 *
 * A control step every 100 ms (a thread; in the simulation build, the fake
 * GPU's clock) reads NVML's per-process SM utilisation of the container's
 * processes (their host pids, tl_nvml.c) and corrects the rate with the PI
 * law of tl_pacer.c: this absorbs what the estimates miss (time-slicing with
 * a neighbour makes a kernel's wall time twice its GPU time; concurrent
 * streams overlap) and keeps the container's processes together at the
 * share. Without NVML, the rate stays at the share and the pacing relies on
 * the event timings alone.
 *
 * The time a launch is held back (waiting for its first measurement or for
 * the bucket) is added to the shared state's throttled_ns[ld], which the
 * node agent exports as tessera_container_throttled_seconds_total.
 *
 * pace[ld].mu (a spin lock) is never held across a launch, an event record,
 * a sleep or any I/O (stderr, the trace file): what is printed is copied
 * into locals under the lock and written after it is let go.
 */
#include "tl_compat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include "tl_clock.h"
#include "tl_internal.h"
#include "tl_pacer.h"

#define PACE_PERIOD_S 0.1
#define NSAMPLE 8
#define FIRST_SAMPLE_WAIT_S 0.5
#define SAMPLE_EVERY_S 0.05
/* The rate may reach 16 GPU-seconds per second: the event timings of tiny
 * kernels include the launch latency (the GPU waits for the next launch),
 * so their estimates can be many times their GPU time; NVML's low
 * utilisation then lifts the rate until the gate no longer binds. */
#define TL_RATE_MAX 16.0
/* Processes outside the container count as present for this long after
 * their last busy sample (NVML often returns one process per query), and
 * the per-process figures must add up to the device's within this slack. */
#define CONTENDED_S 1.0
#define CONTENDED_SLACK 10.0

enum { S_FREE = 0, S_RESERVED, S_RECORDED };

/* A spin lock: held for a few arithmetic operations (never across a
 * launch, an event record or a sleep), it is cheaper than a mutex on the
 * launch path; a waiter yields after a short spin. */
typedef struct {
    int locked;
} spin;

static void spin_lock(spin *l)
{
    for (int n = 0; __atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE); n++)
        while (__atomic_load_n(&l->locked, __ATOMIC_RELAXED))
            if (++n > 100)
                sched_yield();
}

static void spin_unlock(spin *l)
{
    __atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE);
}

typedef struct {
    int state;
    CUevent a, b;
    uint64_t key;
    int kind;
    double units;
} sample;

typedef struct {
    spin mu;
    tl_pacer pacer;
    tl_gbucket bucket;
    tl_costs costs;
    double used;       /* estimated GPU-seconds admitted since the last step */
    int throttled;     /* a launch waited since the last step */
    sample s[NSAMPLE];
    int events;        /* 1: events created, -1: cannot be */
    int nrecorded;     /* samples in flight (S_RECORDED) */
    unsigned launches; /* since the clock was last read */
    double now;        /* the clock at the last read */
    CUcontext evctx;   /* the context they belong to */
    double last_step;
    unsigned long long last_ts; /* NVML sample timestamps seen */
    unsigned no_sample;
    double others_util; /* SM % of processes outside the container, latest */
    double others_at;   /* when they last had a busy sample (s), 0 = never */
    /* diagnostics since the last step (TESSERA_LIMITER_TRACE) */
    unsigned t_launches, t_learned;
    double t_learned_s, t_held_s;
} dev_pace;

static dev_pace pace[TL_MAX_DEVICES];
static int pace_started;
static pthread_mutex_t pace_start_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- measuring: events around sampled launches ---- */

/* What a learned sample is traced as (TESSERA_LIMITER_TRACE): figures
 * copied under p->mu, written after it is let go (a trace write is a
 * mutex, an open() and a write() on a path the tenant chose). */
typedef struct {
    int n;
    struct {
        int kind;
        uint64_t key;
        double units, gpu_ms, est_ms;
    } r[NSAMPLE];
} sample_trace;

static void trace_samples(int ld, sample_trace *t)
{
    for (int i = 0; t && i < t->n; i++)
        tl_trace("sample dev %d %s %#llx units %.0f gpu_ms %.4f est_ms_before %.4f", ld,
                 t->r[i].kind == TL_COST_GRAPH ? "graph" : "kernel", (unsigned long long)t->r[i].key, t->r[i].units,
                 t->r[i].gpu_ms, t->r[i].est_ms);
    if (t)
        t->n = 0;
}

/* With p->mu held: learn from the samples that completed. What is to be
 * traced goes to *t (NULL: not tracing), for trace_samples() once the lock
 * is let go; a sample that does not fit (more than NSAMPLE between two
 * flushes) is left out of the trace. */
static void poll_samples(dev_pace *p, double now, sample_trace *t)
{
    for (int i = 0; p->nrecorded && i < NSAMPLE; i++) {
        sample *x = &p->s[i];
        if (x->state != S_RECORDED || !real_cuEventQuery || real_cuEventQuery(x->b) != CUDA_SUCCESS)
            continue;
        float ms = 0;
        tl_cost_slot *slot = tl_costs_slot(&p->costs, x->kind, x->key, now);
        if (real_cuEventElapsedTime && real_cuEventElapsedTime(&ms, x->a, x->b) == CUDA_SUCCESS) {
            if (UNLIKELY(t != NULL)) {
                p->t_learned++;
                p->t_learned_s += ms * 1e-3;
                if (t->n < NSAMPLE) {
                    t->r[t->n].kind = x->kind;
                    t->r[t->n].key = x->key;
                    t->r[t->n].units = x->units;
                    t->r[t->n].gpu_ms = (double)ms;
                    t->r[t->n].est_ms = 1e3 * tl_costs_estimate(&p->costs, slot, x->units);
                    t->n++;
                }
            }
            tl_costs_learn(&p->costs, slot, x->units, ms * 1e-3);
        }
        slot->pending = 0;
        x->state = S_FREE;
        p->nrecorded--;
    }
}

static void create_events(dev_pace *p)
{
    CUcontext c = NULL;
    if (!real_cuEventCreate || !real_cuEventRecord || !real_cuEventQuery || !real_cuEventElapsedTime ||
        !real_cuCtxGetCurrent || real_cuCtxGetCurrent(&c) != CUDA_SUCCESS || !c) {
        p->events = -1;
        return;
    }
    for (int i = 0; i < NSAMPLE; i++)
        if (real_cuEventCreate(&p->s[i].a, 0) != CUDA_SUCCESS || real_cuEventCreate(&p->s[i].b, 0) != CUDA_SUCCESS) {
            p->events = -1;
            return;
        }
    p->evctx = c;
    p->events = 1;
}

static CUresult record(CUevent e, CUstream s, int ptsz)
{
    CUresult (*f)(CUevent, CUstream) = ptsz && real_cuEventRecord_ptsz ? real_cuEventRecord_ptsz : real_cuEventRecord;
    return f ? f(e, s) : CUDA_ERROR_NOT_INITIALIZED;
}

/* ---- the gate ---- */

typedef struct {
    int ld;     /* -1: not paced */
    int si;     /* sample slot, -1: not sampled */
    CUstream s;
    int ptsz;
} launch_tok;

static void pace_start(void);

static int slot_measured(dev_pace *p, int kind, uint64_t key, double now)
{
    tl_cost_slot *s = tl_costs_slot(&p->costs, kind, key, now);
    return s->measured || !s->pending;
}

static void pace_begin(launch_tok *t, int kind, uint64_t key, double units, CUstream s, int ptsz)
{
    t->ld = -1;
    t->si = -1;
    t->s = s;
    t->ptsz = ptsz;
    int ld = tl_ld_of_ordinal(tl_current_ordinal());
    if (ld < 0 || !cfg.sm_limit[ld])
        return;
    if (UNLIKELY(!__atomic_load_n(&pace_started, __ATOMIC_ACQUIRE)))
        pace_start();
    dev_pace *p = &pace[ld];
    if (UNLIKELY(p->events == 0)) {
        spin_lock(&p->mu);
        int todo = p->events == 0;
        spin_unlock(&p->mu);
        if (todo) {
            dev_pace tmp; /* created outside the lock: a driver call */
            memset(&tmp, 0, sizeof(tmp));
            create_events(&tmp);
            spin_lock(&p->mu);
            if (p->events == 0) {
                for (int i = 0; i < NSAMPLE; i++) {
                    p->s[i].a = tmp.s[i].a;
                    p->s[i].b = tmp.s[i].b;
                }
                p->evctx = tmp.evctx;
                p->events = tmp.events;
            }
            spin_unlock(&p->mu);
        }
    }
    sample_trace tr_, *tr = NULL; /* learned samples to trace, after the lock */
    if (UNLIKELY(TL_TRACING)) {
        tr = &tr_;
        tr->n = 0;
    }
    spin_lock(&p->mu);
    /* the clock is read when the bucket may need the time to refill, and
     * every 64 launches (sampling, least recently used slots): a launch with
     * credit left costs no clock read */
    double now = p->now;
    if (p->bucket.tokens <= 0 || p->nrecorded || (++p->launches & 63) == 0)
        now = p->now = tl_clock_coarse();
    poll_samples(p, now, tr);
    tl_cost_slot *slot = tl_costs_slot(&p->costs, kind, key, now);
    double held = 0; /* how long this launch is held back (shared-state counter) */
    if (!slot->measured && slot->pending) {
        /* not measured yet, and its first launch is in flight: wait for it */
        double until = now + FIRST_SAMPLE_WAIT_S, from = now;
        while (now < until && !slot_measured(p, kind, key, now)) {
            spin_unlock(&p->mu);
            if (UNLIKELY(tr != NULL))
                trace_samples(ld, tr);
            tl_clock_sleep(0.001);
            now = tl_clock_coarse();
            spin_lock(&p->mu);
            p->now = now;
            poll_samples(p, now, tr);
        }
        slot = tl_costs_slot(&p->costs, kind, key, now);
        held += now - from;
    }
    double est = tl_costs_estimate(&p->costs, slot, units);
    double deadline = now + TL_MAX_DEBT_S + 0.05, from = now;
    int waited = 0;
    for (;;) {
        double w = tl_gbucket_take(&p->bucket, p->pacer.rate, now, est);
        if (w == 0)
            break;
        p->throttled = waited = 1;
        if (now >= deadline) { /* bounded: go, charged */
            p->bucket.tokens -= est;
            break;
        }
        spin_unlock(&p->mu);
        if (UNLIKELY(tr != NULL))
            trace_samples(ld, tr);
        tl_clock_sleep(w < 0.01 ? w : 0.01);
        now = tl_clock_coarse();
        spin_lock(&p->mu);
        p->now = now;
    }
    held += now - from;
    p->used += est;
    p->t_launches++;
    p->t_held_s += held;
    /* sample this launch? (one in flight per kernel or graph) */
    if (waited) /* the lock was let go: the slot may hold another key now */
        slot = tl_costs_slot(&p->costs, kind, key, now);
    int want = p->events > 0 && !slot->pending && (!slot->measured || now - slot->last_sample >= SAMPLE_EVERY_S);
    for (int i = 0; want && i < NSAMPLE; i++)
        if (p->s[i].state == S_FREE) {
            p->s[i].state = S_RESERVED;
            p->s[i].key = key;
            p->s[i].kind = kind;
            p->s[i].units = units;
            slot->pending = 1;
            slot->last_sample = now;
            t->si = i;
            break;
        }
    spin_unlock(&p->mu);
    if (UNLIKELY(tr != NULL))
        trace_samples(ld, tr);
    if (held > 0)
        tl_shared_add_throttled(&sh, ld, (uint64_t)(held * 1e9));
    t->ld = ld;
    if (t->si >= 0) {
        CUcontext c = NULL;
        if (tl_capturing(s, ptsz) || !real_cuCtxGetCurrent || real_cuCtxGetCurrent(&c) != CUDA_SUCCESS ||
            c != p->evctx || record(p->s[t->si].a, s, ptsz) != CUDA_SUCCESS) {
            spin_lock(&p->mu);
            p->s[t->si].state = S_FREE;
            tl_costs_slot(&p->costs, kind, key, now)->pending = 0;
            spin_unlock(&p->mu);
            t->si = -1;
        }
    }
}

static void pace_end(launch_tok *t, CUresult r)
{
    if (t->si < 0)
        return;
    dev_pace *p = &pace[t->ld];
    int ok = r == CUDA_SUCCESS && record(p->s[t->si].b, t->s, t->ptsz) == CUDA_SUCCESS;
    spin_lock(&p->mu);
    sample *x = &p->s[t->si];
    if (ok) {
        x->state = S_RECORDED;
        p->nrecorded++;
    } else {
        x->state = S_FREE;
        tl_costs_slot(&p->costs, x->kind, x->key, tl_clock_coarse())->pending = 0;
    }
    spin_unlock(&p->mu);
}

/* ---- the control step ---- */

/* Container SM utilisation on ld from per-process samples newer than
 * last_ts. Once this process's host pid is known, the samples counted are
 * those of the host pids the container's processes published (ours
 * included); before that, of the pids registered there and getpid() (right
 * when the container shares the host's pid namespace). Returns -1 if NVML
 * gave no sample for them.
 *
 * *others: the summed SM % of the processes outside the container (each
 * one's latest busy sample), -1 if none; only once our host pid is known:
 * before, our own samples carry a pid we cannot recognise and would count
 * as a neighbour's. *devfallback: set when the figure returned is the whole
 * device's utilisation (host pid unknown, no pid matched).
 *
 * desc (the trace, a file the tenant can read): the container's own
 * samples and the others' summed SM % only, never a neighbour's pid, SM %
 * or how many there are: the limiter's NVML hooks hide exactly that. */
static double container_util(nvmlDevice_t d, unsigned long long *last_ts, double *others, int *devfallback,
                             char *desc, size_t dn)
{
    *others = -1;
    *devfallback = 0;
    if (desc && dn)
        snprintf(desc, dn, "nvml none");
    unsigned n = 0;
    if (!real_nvmlDeviceGetProcessUtilization)
        return -1;
    nvmlReturn_t r = real_nvmlDeviceGetProcessUtilization(d, NULL, &n, *last_ts);
    if ((r != NVML_ERROR_INSUFFICIENT_SIZE && r != NVML_SUCCESS) || n == 0)
        return -1;
    n += 8;
    TL_NVML_PROC_UTIL_SAMPLE *s = calloc(n, sizeof(*s));
    if (!s)
        return -1;
    r = real_nvmlDeviceGetProcessUtilization(d, s, &n, *last_ts);
    int32_t pids[64];
    int np = 0;
    int32_t self = tl_host_pid();
    if (self) {
        np = tl_container_host_pids(pids, 64);
    } else {
        if (sh.st)
            np = tl_shared_pids(&sh, pids, 63);
        pids[np++] = getpid();
    }
    /* NVML may return several samples per process: use each pid's latest. */
    unsigned long long best_ts[64] = {0};
    unsigned best_util[64] = {0};
    int have[64] = {0};
    double sum = 0;
    int seen = 0;
    unsigned long long newest = *last_ts;
    /* the processes not recognised as the container's: each one's latest
     * busy sample */
    uint32_t opid[16];
    unsigned long long ots[16];
    unsigned outil[16];
    int no = 0;
    double osum = -1;
    if (r == NVML_SUCCESS) {
        for (unsigned i = 0; i < n; i++) {
            if (s[i].timeStamp > newest)
                newest = s[i].timeStamp;
            for (int k = 0; k < np; k++)
                if ((unsigned)pids[k] == s[i].pid) {
                    if (!have[k] || s[i].timeStamp >= best_ts[k]) {
                        best_ts[k] = s[i].timeStamp;
                        best_util[k] = s[i].smUtil;
                    }
                    have[k] = 1;
                    break;
                }
            int mine = 0;
            for (int k = 0; k < np; k++)
                mine |= (unsigned)pids[k] == s[i].pid;
            if (mine || !s[i].smUtil)
                continue;
            int j = 0;
            while (j < no && opid[j] != s[i].pid)
                j++;
            if (j == no && no < 16) {
                opid[no] = s[i].pid;
                ots[no] = 0;
                no++;
            }
            if (j < no && s[i].timeStamp >= ots[j]) {
                ots[j] = s[i].timeStamp;
                outil[j] = s[i].smUtil;
            }
        }
        for (int j = 0; j < no; j++)
            osum = (osum < 0 ? 0 : osum) + outil[j];
        if (self)
            *others = osum;
        for (int k = 0; k < np; k++)
            if (have[k]) {
                sum += best_util[k];
                seen++;
            }
    }
    if (desc && dn) {
        /* the container's samples: pid:sm%:age of the sample (ms) */
        size_t o = (size_t)snprintf(desc, dn, "nvml r %d since %llu host_pid %d:", (int)r, *last_ts, (int)self);
        unsigned long long nowts = 0;
        for (unsigned i = 0; r == NVML_SUCCESS && i < n; i++)
            if (s[i].timeStamp > nowts)
                nowts = s[i].timeStamp;
        for (int k = 0; k < np && o < dn; k++)
            if (have[k])
                o += (size_t)snprintf(desc + o, dn - o, " %d:%u:%llu", (int)pids[k], best_util[k],
                                      (nowts - best_ts[k]) / 1000);
        if (o < dn)
            snprintf(desc + o, dn - o, " others-sm-sum %.0f", osum < 0 ? 0.0 : osum);
    }
    free(s);
    *last_ts = newest;
    if (seen || self)
        return seen ? sum : -1; /* host pid known: no sample of ours is no news */
    /* Host pid not resolved yet and no pid matches: fall back to
     * whole-device utilisation: exact when the container is alone on the
     * GPU, conservative (less than its share) next to busy neighbours. */
    TL_NVML_UTILIZATION ur;
    if (r == NVML_SUCCESS && n > 0 && real_nvmlDeviceGetUtilizationRates &&
        real_nvmlDeviceGetUtilizationRates(d, &ur) == NVML_SUCCESS) {
        *devfallback = 1;
        return ur.gpu;
    }
    return -1;
}

static int have_nvml;

static void pace_period(void)
{
    double now = tl_clock_now();
    if (sh.st)
        tl_shared_maybe_reclaim(&sh, 1000000000ull); /* stale host pids */
    for (int ld = 0; ld < TL_MAX_DEVICES; ld++) {
        if (!cfg.sm_limit[ld])
            continue;
        dev_pace *p = &pace[ld];
        nvmlDevice_t d = NULL;
        double u = -1, others = 0;
        char desc[640];
        int tracing = TL_TRACING;
        int devutil = -1, contended = 0, devfallback = 0;
        desc[0] = 0;
        if (have_nvml && tl_nvml_of_ld(ld, &d) == 0) {
            tl_hp_period(ld);
            double ou;
            u = container_util(d, &p->last_ts, &ou, &devfallback, tracing ? desc : NULL, sizeof(desc));
            if (ou > 0) {
                p->others_util = ou;
                p->others_at = now;
            }
            TL_NVML_UTILIZATION du;
            int recent = p->others_at > 0 && now - p->others_at < CONTENDED_S;
            if ((tracing || (u > 0 && recent)) && real_nvmlDeviceGetUtilizationRates &&
                real_nvmlDeviceGetUtilizationRates(d, &du) == NVML_SUCCESS)
                devutil = (int)du.gpu;
            /* Per-process SM % is a share of GPU time only if the processes'
             * figures add up to the device's. On a GPU time-sliced between
             * contexts NVML reports ~99 % for whichever process it samples
             * (run 2, H200): ours and a neighbour's together far above the
             * device's 100 %. Then NVML cannot say we had too much. The
             * rule needs our own figure: not the device's (our host pid
             * unknown), which already holds any neighbour's time. */
            contended = u > 0 && !devfallback && recent &&
                        u + p->others_util > (devutil >= 0 ? devutil : 100) + CONTENDED_SLACK;
            TL_NVML_UTILIZATION ur;
            if (cfg.elastic && real_nvmlDeviceGetUtilizationRates &&
                real_nvmlDeviceGetUtilizationRates(d, &ur) == NVML_SUCCESS)
                others = (double)ur.gpu - (u > 0 ? u : 0);
        }
        spin_lock(&p->mu);
        double dt = now - p->last_step;
        double used_rate = dt > 0 ? p->used / dt : 0;
        int thr = p->throttled;
        double rate0 = p->pacer.rate, tokens = p->bucket.tokens;
        const char *act = "step";
        int no_sample_5s = 0;
        double target = tl_pacer_effective_target(cfg.sm_limit[ld], others < 0 ? 0 : others, cfg.elastic);
        /* A step compares what was admitted since the last step with the
         * utilisation NVML measured. No launches: nothing to learn, hold
         * the rate. No new NVML sample (NVML samples less often than every
         * 100 ms): keep accumulating until there is one; a missing sample
         * must not read as 0 % or the rate would run away. */
        if ((used_rate > 0 || thr) && u >= 0) {
            tl_pacer_step(&p->pacer, target, u, used_rate, thr);
            if (contended) {
                /* NVML's word may still lift the rate (estimates too high:
                 * tiny kernels), never take it below the share: there the
                 * event timings alone pace, as without NVML. */
                act = "step-contended";
                if (p->pacer.rate < target / 100.0)
                    p->pacer.rate = target / 100.0;
            }
            p->no_sample = 0;
            p->used = 0;
            p->throttled = 0;
            p->last_step = now;
        } else if (!have_nvml) {
            act = "no-nvml";
            p->pacer.rate = target / 100.0; /* events alone: the share itself */
            p->used = 0;
            p->throttled = 0;
            p->last_step = now;
        } else if (!(used_rate > 0) && !thr) {
            act = "idle";
            p->last_step = now; /* idle */
        } else if (act = "wait-sample", ++p->no_sample == 50) {
            no_sample_5s = 1;
        }
        double rate1 = p->pacer.rate;
        char line[1024];
        line[0] = 0;
        if (tracing && (strcmp(act, "idle") || u > 0 || devutil > 0)) {
            snprintf(line, sizeof(line),
                     "step dev %d %s target %.1f util %.1f devutil %d others %.0f used %.4f throttled %d rate %.4f -> %.4f "
                     "tokens %.4f launches %u held_s %.4f learned %u learned_ms %.4f dflt_kernel_us %.3f "
                     "dflt_graph_ms %.4f | %s",
                     ld, act, target, u, devutil, p->others_at > 0 && now - p->others_at < CONTENDED_S ? p->others_util : 0.0,
                     used_rate, thr, rate0, p->pacer.rate, tokens, p->t_launches,
                     p->t_held_s, p->t_learned, p->t_learned ? 1e3 * p->t_learned_s / p->t_learned : 0.0,
                     1e6 * p->costs.dflt[TL_COST_KERNEL], 1e3 * p->costs.dflt[TL_COST_GRAPH], desc);
            p->t_launches = p->t_learned = 0;
            p->t_learned_s = p->t_held_s = 0;
        }
        spin_unlock(&p->mu);
        /* stderr and the trace only once the lock is let go */
        if (no_sample_5s)
            fprintf(stderr, "tessera-limiter: device %d: NVML gave no utilisation sample for 5 s while kernels ran; "
                            "pacing on the driver's event timings alone\n", ld);
        if (cfg.debug)
            fprintf(stderr, "tessera-limiter: dev %d util %.1f used %.3f GPU-s/s throttled %d -> rate %.3f\n", ld, u,
                    used_rate, thr, rate1);
        if (line[0])
            tl_trace("%s", line);
    }
}

static void pace_start(void)
{
    pthread_mutex_lock(&pace_start_mu);
    if (!pace_started) {
        ensure_nvml();
        have_nvml = tl_nvml_up();
        if (!have_nvml)
            fprintf(stderr, "tessera-limiter: NVML unavailable; CUDA_DEVICE_SM_LIMIT is enforced on the driver's "
                            "event timings alone, without correction for other tenants or other processes of this "
                            "container\n");
        double now = tl_clock_now();
        for (int i = 0; i < TL_MAX_DEVICES; i++) {
            double target = cfg.sm_limit[i] ? cfg.sm_limit[i] / 100.0 : 1.0;
            tl_pacer_init(&pace[i].pacer, target, 0.001, TL_RATE_MAX);
            tl_gbucket_init(&pace[i].bucket, 0.1, TL_MAX_DEBT_S);
            tl_costs_init(&pace[i].costs);
            pace[i].last_step = now;
            pace[i].bucket.last_s = tl_clock_coarse();
        }
        if (tl_clock_every(PACE_PERIOD_S, pace_period) != 0)
            fprintf(stderr, "tessera-limiter: cannot start the pacing step; launches are paced at the share on "
                            "the driver's event timings alone\n");
        __atomic_store_n(&pace_started, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&pace_start_mu);
}

void tl_pace_after_fork(void)
{
    pthread_mutex_init(&pace_start_mu, NULL);
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        pace[i].mu.locked = 0;
        memset(pace[i].s, 0, sizeof(pace[i].s));
        pace[i].events = 0; /* the parent's events belong to its contexts */
    }
    pace_started = 0;
}

/* ---- the launch entry points ---- */

static inline double blocks(unsigned x, unsigned y, unsigned z)
{
    return (double)(x ? x : 1) * (double)(y ? y : 1) * (double)(z ? z : 1);
}

#define PACED(kind, key, units, stream, ptsz, call)                                \
    ensure_cuda();                                                                 \
    if (LIKELY(!cfg.sm_active))                                                    \
        return call;                                                               \
    launch_tok t_;                                                                 \
    pace_begin(&t_, kind, (uint64_t)(uintptr_t)(key), units, stream, ptsz);        \
    CUresult r_ = call;                                                            \
    pace_end(&t_, r_);                                                             \
    return r_;

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{
    PACED(TL_COST_KERNEL, f, blocks(gx, gy, gz), s, 0,
          CALL_REAL(cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                    void **extra)
{
    PACED(TL_COST_KERNEL, f, blocks(gx, gy, gz), s, 1,
          CALL_REAL(cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
}

EXPORT CUresult cuLaunchKernelEx(const TL_LAUNCH_CONFIG *c, CUfunction f, void **params, void **extra)
{
    PACED(TL_COST_KERNEL, f, c ? blocks(c->gridDimX, c->gridDimY, c->gridDimZ) : 1, c ? c->hStream : NULL, 0,
          CALL_REAL(cuLaunchKernelEx, c, f, params, extra))
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const TL_LAUNCH_CONFIG *c, CUfunction f, void **params, void **extra)
{
    PACED(TL_COST_KERNEL, f, c ? blocks(c->gridDimX, c->gridDimY, c->gridDimZ) : 1, c ? c->hStream : NULL, 1,
          CALL_REAL(cuLaunchKernelEx_ptsz, c, f, params, extra))
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params)
{
    PACED(TL_COST_KERNEL, f, blocks(gx, gy, gz), s, 0,
          CALL_REAL(cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shm, s, params))
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                                               void **params)
{
    PACED(TL_COST_KERNEL, f, blocks(gx, gy, gz), s, 1,
          CALL_REAL(cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params))
}

/* A graph is charged per launch what its launches were measured to take. */
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    PACED(TL_COST_GRAPH, g, 1, s, 0, tl_graph_run(g, s, 0, 0))
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    PACED(TL_COST_GRAPH, g, 1, s, 1, tl_graph_run(g, s, 1, 0))
}
