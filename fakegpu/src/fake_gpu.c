/*
 * fake_gpu.c - the fake GPU: a clock (real or simulated), one FIFO queue of
 * work per device, events on that timeline, and a log of what ran when, from
 * which the fake NVML reports per-process utilisation.
 *
 * Work runs in order: an item enqueued at t starts at max(t, end of the
 * previous item) and ends `solo` GPU seconds later, or twice that with
 * FAKE_GPU_NEIGHBOUR=1 (a saturating neighbour on device 0 time-slices the
 * GPU: each gets half), or (k + 1) times that while k other processes have
 * work queued on the GPU (its state file; always in the emulated cluster,
 * with FAKE_GPU_TIMESLICE=1 in tests). Each item is published in the
 * process's slot of the GPU's state file (GPU time, end of the queue), from
 * which the other processes and the node read its utilisation. Completion times are fixed when work is enqueued,
 * so nothing needs to run in the background: "now" decides what has
 * finished. FAKE_QUEUE_DEPTH bounds the pending items (default unlimited,
 * 1024 when simulated); a launch into a full queue waits for the oldest.
 *
 * Simulated time (FAKE_SIM=1) makes the closed-loop pacing tests exact and
 * independent of the CI machine's load: the test and the limiter run in one
 * thread, time advances when either sleeps (fake_sleep) and by
 * FAKE_SIM_CALL_US per launch or event call, and callbacks registered with
 * fake_every (the limiter's sampling period) run at their boundaries.
 */
#include "fake.h"

#include <math.h>

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static int cfg_read, sim, depth, neighbour, timeslice;
static double call_s, block_s, graph_s;

static void gpu_cfg(void)
{
    if (cfg_read)
        return;
    const char *v;
    fake_devs_init();
    sim = (v = getenv("FAKE_SIM")) && *v == '1';
    depth = (v = getenv("FAKE_QUEUE_DEPTH")) ? atoi(v) : sim ? 1024 : 0;
    neighbour = (v = getenv("FAKE_GPU_NEIGHBOUR")) && *v == '1';
    /* processes sharing a GPU share its time: always in the emulated
     * cluster, on request in tests */
    timeslice = fake_devs.lab[0] || ((v = getenv("FAKE_GPU_TIMESLICE")) && *v == '1');
    call_s = ((v = getenv("FAKE_SIM_CALL_US")) ? atof(v) : 5.0) * 1e-6;
    block_s = ((v = getenv("FAKE_BLOCK_US")) ? atof(v) : 10.0) * 1e-6;
    graph_s = ((v = getenv("FAKE_GRAPH_US")) ? atof(v) : 100.0) * 1e-6;
    cfg_read = 1;
}

int fake_sim(void)
{
    gpu_cfg();
    return sim;
}

/* ---- clock ---- */

static double sim_t;
#define MAXCB 8
static struct {
    double period, next;
    void (*fn)(void);
} cbs[MAXCB];
static int ncb, in_cb;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

FAKE_EXPORT double fake_now(void)
{
    gpu_cfg();
    if (!sim)
        return mono();
    pthread_mutex_lock(&gmu);
    double t = sim_t;
    pthread_mutex_unlock(&gmu);
    return t;
}

/* Advance simulated time to `target`, running the callbacks whose period
 * boundaries are passed (without the lock: they call the driver and NVML). */
static void advance_to(double target)
{
    for (;;) {
        pthread_mutex_lock(&gmu);
        int k = -1;
        double first = target;
        for (int i = 0; !in_cb && i < ncb; i++)
            if (cbs[i].next <= first) {
                first = cbs[i].next;
                k = i;
            }
        if (k < 0) {
            if (target > sim_t)
                sim_t = target;
            pthread_mutex_unlock(&gmu);
            return;
        }
        if (first > sim_t)
            sim_t = first;
        cbs[k].next += cbs[k].period;
        void (*fn)(void) = cbs[k].fn;
        in_cb = 1;
        pthread_mutex_unlock(&gmu);
        fn();
        pthread_mutex_lock(&gmu);
        in_cb = 0;
        pthread_mutex_unlock(&gmu);
    }
}

FAKE_EXPORT void fake_sleep(double s)
{
    gpu_cfg();
    if (!(s > 0))
        return;
    if (!sim) {
        struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
        nanosleep(&ts, NULL);
        return;
    }
    advance_to(fake_now() + s);
}

void fake_cpu(void)
{
    if (fake_sim())
        advance_to(fake_now() + call_s);
}

FAKE_EXPORT int fake_every(double period_s, void (*fn)(void))
{
    if (!fake_sim() || !(period_s > 0))
        return -1;
    pthread_mutex_lock(&gmu);
    int ok = ncb < MAXCB;
    if (ok) {
        cbs[ncb].period = period_s;
        cbs[ncb].next = sim_t + period_s;
        cbs[ncb++].fn = fn;
    }
    pthread_mutex_unlock(&gmu);
    return ok ? 0 : -1;
}

void fake_gpu_wait_until(double t)
{
    double now = fake_now();
    if (t > now)
        fake_sleep(t - now);
}

/* ---- queues and the execution log ---- */

#define LOG 65536 /* ring of executed items per device */
static struct run {
    double start, end, solo;
} runs[FAKE_MAXDEV][LOG];
static unsigned long long nruns[FAKE_MAXDEV];
static double tail[FAKE_MAXDEV];

/* With gmu held: the time the item `back` places before the newest ends. */
static double end_back(int dev, unsigned long long back)
{
    return back < nruns[dev] && back < LOG ? runs[dev][(nruns[dev] - 1 - back) % LOG].end : 0;
}

void fake_gpu_enqueue(int dev, double solo)
{
    gpu_cfg();
    if (dev < 0 || dev >= FAKE_MAXDEV)
        return;
    if (depth > 0) {
        for (;;) { /* a full queue: wait for its oldest pending item */
            pthread_mutex_lock(&gmu);
            double t = end_back(dev, (unsigned long long)depth - 1);
            pthread_mutex_unlock(&gmu);
            if (t <= fake_now())
                break;
            fake_gpu_wait_until(t);
        }
    }
    double now = fake_now();
    /* real time: the other processes with work queued on the GPU take
     * their turns (time-slicing), each item lasts that much longer */
    int others = !sim && timeslice ? fake_others_busy(dev, fake_mono_ns()) : 0;
    pthread_mutex_lock(&gmu);
    double start = tail[dev] > now ? tail[dev] : now;
    double d = solo * (neighbour && dev == 0 ? 2.0 : 1.0) * (1 + others);
    struct run *r = &runs[dev][nruns[dev] % LOG];
    r->start = start;
    r->end = start + d;
    r->solo = solo;
    nruns[dev]++;
    tail[dev] = r->end;
    double end = r->end;
    pthread_mutex_unlock(&gmu);
    struct fake_slot *me = sim ? NULL : fake_slot_self(dev);
    if (me) { /* for the other processes' NVML and the node's */
        __atomic_store_n(&me->rate_ppm, (uint32_t)(d > 0 ? 1e6 * solo / d : 1e6), __ATOMIC_RELAXED);
        __atomic_store_n(&me->tail_ns, (uint64_t)(end * 1e9), __ATOMIC_RELAXED);
        __atomic_add_fetch(&me->busy_ns, (uint64_t)(solo * 1e9), __ATOMIC_RELAXED);
    }
}

double fake_gpu_marker(int dev)
{
    double now = fake_now();
    if (dev < 0 || dev >= FAKE_MAXDEV)
        return now;
    pthread_mutex_lock(&gmu);
    double t = tail[dev] > now ? tail[dev] : now;
    pthread_mutex_unlock(&gmu);
    return t;
}

void fake_gpu_drain(int dev)
{
    fake_gpu_wait_until(fake_gpu_marker(dev));
}

void fake_gpu_drain_all(void)
{
    double t = 0;
    for (int d = 0; d < FAKE_MAXDEV; d++) {
        double m = fake_gpu_marker(d);
        t = m > t ? m : t;
    }
    fake_gpu_wait_until(t);
}

/* Solo GPU seconds of this process's work executed on dev within [t0, t1]
 * (clipped to now): utilisation over the window is busy / (t1 - t0). */
FAKE_EXPORT double fake_busy(int dev, double t0, double t1)
{
    if (dev < 0 || dev >= FAKE_MAXDEV || !(t1 > t0))
        return 0;
    double now = fake_now();
    if (t1 > now)
        t1 = now;
    double s = 0;
    pthread_mutex_lock(&gmu);
    unsigned long long n = nruns[dev], k = n < LOG ? n : LOG;
    for (unsigned long long i = 0; i < k; i++) {
        const struct run *r = &runs[dev][(n - 1 - i) % LOG];
        if (r->end <= t0)
            break; /* FIFO: every older item ended earlier still */
        double a = r->start > t0 ? r->start : t0, b = r->end < t1 ? r->end : t1;
        if (b > a && r->end > r->start)
            s += (b - a) * r->solo / (r->end - r->start);
    }
    pthread_mutex_unlock(&gmu);
    return s;
}

/* ---- what launches cost ---- */

#define MAXK 64
static struct fake_kernel_cost {
    double fixed, per_block;
} kernels[MAXK];
static int nkernels;

/* A kernel handle whose launches take fixed_us + blocks * per_block_us. */
FAKE_EXPORT CUfunction fake_kernel(double fixed_us, double per_block_us)
{
    pthread_mutex_lock(&gmu);
    CUfunction f = NULL;
    if (nkernels < MAXK) {
        kernels[nkernels].fixed = fixed_us * 1e-6;
        kernels[nkernels].per_block = per_block_us * 1e-6;
        f = &kernels[nkernels++];
    }
    pthread_mutex_unlock(&gmu);
    return f;
}

double fake_kernel_cost(CUfunction f, double blocks)
{
    gpu_cfg();
    struct fake_kernel_cost *k = f;
    if (k >= kernels && k < kernels + MAXK)
        return k->fixed + blocks * k->per_block;
    return blocks * block_s;
}

#define MAXGC 64
static struct {
    CUgraphExec e;
    double s;
} gcost[MAXGC];
static int ngcost;

/* Launches of graph exec e take us microseconds of GPU time. */
FAKE_EXPORT void fake_graph_cost(CUgraphExec e, double us)
{
    pthread_mutex_lock(&gmu);
    int i = 0;
    while (i < ngcost && gcost[i].e != e)
        i++;
    if (i < MAXGC) {
        gcost[i].e = e;
        gcost[i].s = us * 1e-6;
        if (i == ngcost)
            ngcost++;
    }
    pthread_mutex_unlock(&gmu);
}

double fake_graph_launch_cost(CUgraphExec e)
{
    gpu_cfg();
    double s = graph_s;
    pthread_mutex_lock(&gmu);
    for (int i = 0; i < ngcost; i++)
        if (gcost[i].e == e)
            s = gcost[i].s;
    pthread_mutex_unlock(&gmu);
    return s;
}

/* ---- events ---- */

#define MAXEV 4096
static struct fake_event {
    int live, recorded;
    double t;
} events[MAXEV];

static struct fake_event *ev(CUevent e)
{
    struct fake_event *f = e;
    return f >= events && f < events + MAXEV && f->live ? f : NULL;
}

FAKE_EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    NEED_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&gmu);
    for (int i = 0; i < MAXEV; i++)
        if (!events[i].live) {
            memset(&events[i], 0, sizeof(events[i]));
            events[i].live = 1;
            *e = &events[i];
            pthread_mutex_unlock(&gmu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&gmu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult record(CUevent e, CUstream s)
{
    struct fake_event *f = ev(e);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    fake_cpu();
    double t = fake_gpu_marker(fake_stream_dev(s));
    pthread_mutex_lock(&gmu);
    f->t = t;
    f->recorded = 1;
    pthread_mutex_unlock(&gmu);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return record(e, s); }
FAKE_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return record(e, s); }

FAKE_EXPORT CUresult cuEventQuery(CUevent e)
{
    struct fake_event *f = ev(e);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    return !f->recorded || f->t <= fake_now() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent e)
{
    struct fake_event *f = ev(e);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (f->recorded)
        fake_gpu_wait_until(f->t);
    fake_pools_on_sync();
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    struct fake_event *x = ev(a), *y = ev(b);
    if (!ms || !x || !y || !x->recorded || !y->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    double now = fake_now();
    if (x->t > now || y->t > now)
        return CUDA_ERROR_NOT_READY;
    const char *sc = getenv("FAKE_EVENT_SCALE"); /* timings that miss part of the work (README) */
    *ms = (float)((y->t - x->t) * 1e3 * (sc && *sc ? atof(sc) : 1.0));
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    struct fake_event *f = ev(e);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    f->live = 0;
    return CUDA_SUCCESS;
}
