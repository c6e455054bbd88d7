/*
 * tl_nvml.c - NVML for the limiter's own use: free memory and process lists
 * of a device, and finding this process's host pid.
 *
 * NVML names processes by their pid in the host's pid namespace; inside a
 * container getpid() differs. tl_hostpid.h has the method; here are its
 * inputs: a device's compute-process list around this process's first
 * context creation on it (on devices with a memory or an SM limit) and at
 * later periods until resolved, the host pids the container's other
 * processes published in the shared state, the memory this process has
 * accounted on the device, and NSpid. The result is published in our slot;
 * reconciliation (tl_account.c), pacing and the nvidia-smi filter use it.
 */
#include "tl_compat.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tl_clock.h"
#include "tl_internal.h"

static pthread_once_t up_once = PTHREAD_ONCE_INIT;
static int nvml_ok;

static void up_init(void)
{
    ensure_nvml();
    nvml_ok = real_nvmlInit_v2 && real_nvmlInit_v2() == NVML_SUCCESS;
}

int tl_nvml_up(void)
{
    pthread_once(&up_once, up_init);
    return nvml_ok;
}

int tl_nvml_free(int ld, uint64_t *out)
{
    nvmlDevice_t d;
    TL_NVML_MEMORY m;
    if (tl_nvml_of_ld(ld, &d) != 0 || !real_nvmlDeviceGetMemoryInfo || real_nvmlDeviceGetMemoryInfo(d, &m) != NVML_SUCCESS)
        return -1;
    *out = m.free;
    return 0;
}

#define TL_PID_MAX 4194304u /* PID_MAX_LIMIT: larger pids mean a wrong layout */

int tl_gpu_procs(int ld, tl_gpu_proc *out, int max)
{
    unsigned char buf[TL_HP_MAX * TL_PROCINFO_V3_CC];
    nvmlDevice_t d;
    if (max > TL_HP_MAX)
        max = TL_HP_MAX;
    if (tl_nvml_of_ld(ld, &d) != 0)
        return -1;
    /* _v2 entries are 24 bytes in every driver; _v3 first where there is no
     * _v2 (newer drivers), as 24; v1 last. A list whose pids are 0 or above
     * PID_MAX_LIMIT is a layout mismatch: the next version is tried. */
    struct {
        nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, void *);
        size_t stride;
    } v[] = {{real_nvmlDeviceGetComputeRunningProcesses_v3, TL_PROCINFO_V2},
             {real_nvmlDeviceGetComputeRunningProcesses_v2, TL_PROCINFO_V2},
             {real_nvmlDeviceGetComputeRunningProcesses, TL_PROCINFO_V1}};
    for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) {
        if (!v[k].fn)
            continue;
        unsigned cnt = (unsigned)max;
        memset(buf, 0, sizeof(buf));
        nvmlReturn_t r = v[k].fn(d, &cnt, buf);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE)
            return -1; /* more processes than we consider */
        if (r != NVML_SUCCESS || cnt > (unsigned)max)
            continue;  /* not supported by this driver: an older version */
        int ok = 1;
        for (unsigned i = 0; i < cnt; i++) {
            uint32_t pid;
            uint64_t used;
            memcpy(&pid, buf + i * v[k].stride, sizeof(pid));
            memcpy(&used, buf + i * v[k].stride + 8, sizeof(used));
            if (pid == 0 || pid > TL_PID_MAX)
                ok = 0;
            out[i].pid = pid;
            out[i].used = used;
        }
        if (ok)
            return (int)cnt;
    }
    return -1;
}

/* ---- host pid ---- */

static pthread_mutex_t hp_mu = PTHREAD_MUTEX_INITIALIZER;
static tl_hostpid hp[TL_MAX_DEVICES];
static int hp_probed[TL_MAX_DEVICES]; /* hp[ld] has a `before` list */
static int32_t host_pid;              /* resolved, 0 = not yet */
static uint32_t nspid_outer;          /* from /proc/self/status, 0 = one level */
static int nspid_read;

int32_t tl_host_pid(void)
{
    return __atomic_load_n(&host_pid, __ATOMIC_ACQUIRE);
}

static void hp_reset(void)
{
    for (int i = 0; i < TL_MAX_DEVICES; i++)
        tl_hp_init(&hp[i]);
    memset(hp_probed, 0, sizeof(hp_probed));
    host_pid = 0;
    nspid_read = 0;
}

/* tl_hp_after_alloc's pace: retries so far and when the last was (ns of
 * the coarse clock), read and written by any allocating thread */
static unsigned hp_alloc_n;
static int64_t hp_alloc_last_ns;

void tl_nvml_after_fork(void)
{
    pthread_mutex_init(&hp_mu, NULL);
    hp_reset(); /* the child has another host pid and no context */
    __atomic_store_n(&hp_alloc_n, 0, __ATOMIC_RELAXED); /* its own first few retries */
    __atomic_store_n(&hp_alloc_last_ns, 0, __ATOMIC_RELAXED);
}

static void read_nspid(void)
{
    char buf[4096];
    nspid_read = 1;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = 0;
    uint32_t p = tl_hp_parse_nspid(buf);
    nspid_outer = p != (uint32_t)getpid() ? p : 0;
}

/* With hp_mu held: one observation of ld's process list. */
static void hp_step(int ld)
{
    tl_gpu_proc list[TL_HP_MAX];
    int n = tl_gpu_procs(ld, list, TL_HP_MAX);
    if (n < 0)
        return;
    uint32_t excl[64];
    int ne = 0;
    uint64_t known = 0;
    if (sh.st && tl_ensure_registered() == 0) {
        int32_t hs[64];
        ne = tl_shared_host_pids(&sh, hs, 64, sh.slot);
        for (int i = 0; i < ne; i++)
            excl[i] = (uint32_t)hs[i];
        if (cfg.mem_active)
            known = tl_shared_self_used(&sh, ld);
    }
    int had = hp[ld].ncand;
    uint32_t r = tl_hp_observe(&hp[ld], list, n, excl, ne, nspid_outer, known);
    if (r) {
        __atomic_store_n(&host_pid, (int32_t)r, __ATOMIC_RELEASE);
        if (sh.st && tl_ensure_registered() == 0)
            tl_shared_set_host_pid(&sh, (int32_t)r);
        tl_trace("host-pid %u (pid %d here) from %s on device %d", r, (int)getpid(), hp[ld].how, ld);
        if (cfg.debug)
            fprintf(stderr, "tessera-limiter: host pid %u (pid %d here), from %s on device %d\n", r, (int)getpid(),
                    hp[ld].how, ld);
        return;
    }
    if (hp[ld].ncand != had) /* not how many processes the GPU has: the NVML hooks hide that */
        tl_trace("host-pid device %d: not resolved, %d candidates", ld, hp[ld].ncand < 0 ? 0 : hp[ld].ncand);
    if (!hp[ld].have_before)
        hp_probed[ld] = 0; /* wait for a new context creation */
    if (cfg.debug && hp[ld].ncand != had)
        fprintf(stderr, "tessera-limiter: device %d: host pid not resolved yet (%d candidates); "
                        "using whole-device utilisation meanwhile\n", ld, hp[ld].ncand < 0 ? 0 : hp[ld].ncand);
}

/* Worth finding on devices the limiter reconciles or paces. */
static int hp_wanted(int ld)
{
    return ld >= 0 && ld < TL_MAX_DEVICES && (cfg.sm_limit[ld] || cfg.mem_limit[ld]);
}

int tl_hp_ctx_begin(int ordinal)
{
    int ld = tl_ld_of_ordinal(ordinal);
    if (!hp_wanted(ld) || tl_host_pid() || __atomic_load_n(&hp_probed[ld], __ATOMIC_ACQUIRE) || !tl_nvml_up())
        return -1;
    tl_gpu_proc list[TL_HP_MAX];
    pthread_mutex_lock(&hp_mu);
    if (!nspid_read)
        read_nspid();
    int n = hp_probed[ld] || host_pid ? -1 : tl_gpu_procs(ld, list, TL_HP_MAX);
    if (n < 0) {
        pthread_mutex_unlock(&hp_mu);
        return -1;
    }
    tl_hp_before(&hp[ld], list, n);
    return ld;
}

void tl_hp_ctx_end(int ordinal, int ld, CUresult r)
{
    (void)ordinal;
    if (ld < 0)
        return;
    if (r == CUDA_SUCCESS) {
        __atomic_store_n(&hp_probed[ld], 1, __ATOMIC_RELEASE);
        hp_step(ld);
    } else {
        tl_hp_init(&hp[ld]);
    }
    pthread_mutex_unlock(&hp_mu);
}

void tl_hp_period(int ld)
{
    if (tl_host_pid() || ld < 0 || ld >= TL_MAX_DEVICES || !__atomic_load_n(&hp_probed[ld], __ATOMIC_ACQUIRE))
        return;
    if (pthread_mutex_trylock(&hp_mu) != 0)
        return; /* a context is being created: next period */
    if (!host_pid && hp_probed[ld])
        hp_step(ld);
    pthread_mutex_unlock(&hp_mu);
}

/* After an allocation: a process with a memory limit but no SM limit has
 * no pacing step to resolve its host pid later, and at its context's
 * creation it may be ambiguous (another process created one at the same
 * moment: run 2's holder next to the neighbour, both ~the context's size,
 * nothing accounted yet to compare) or not listed yet. Its allocations are
 * when usedGpuMemory tells it apart: observe again, the first few times
 * and then at most every 100 ms, until resolved. */
void tl_hp_after_alloc(int ld)
{
    if (LIKELY(tl_host_pid() != 0) || ld < 0 || ld >= TL_MAX_DEVICES ||
        !__atomic_load_n(&hp_probed[ld], __ATOMIC_ACQUIRE))
        return;
    int64_t now = (int64_t)(tl_clock_coarse() * 1e9);
    if (__atomic_load_n(&hp_alloc_n, __ATOMIC_RELAXED) >= 8 &&
        now - __atomic_load_n(&hp_alloc_last_ns, __ATOMIC_RELAXED) < 100000000)
        return;
    __atomic_add_fetch(&hp_alloc_n, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&hp_alloc_last_ns, now, __ATOMIC_RELAXED);
    tl_hp_period(ld);
}

int tl_container_host_pids(int32_t *out, int n)
{
    int k = 0;
    int32_t me = tl_host_pid();
    if (me && n > 0)
        out[k++] = me;
    if (sh.st)
        k += tl_shared_host_pids(&sh, out + k, n - k, sh.slot);
    return k;
}
