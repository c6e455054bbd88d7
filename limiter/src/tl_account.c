/*
 * tl_account.c - devices and the shared budget.
 *
 * Devices. Limits and charges are kept per limiter device (ld). With limits
 * from the environment (HAMi's convention) ld is the CUDA ordinal. With the
 * limits file, ld is the file's device.<i>, and CUDA ordinals
 * (cuDeviceGetUuid) and NVML handles (nvmlDeviceGetUUID) are matched to it
 * by UUID, never by position: CUDA orders devices fastest first, NVML by PCI
 * bus, and the allocation record names UUIDs. A device whose UUID is not in
 * the file gets limit 1 byte: nothing can be allocated there.
 *
 * Reconciliation. Memory the limiter cannot see in a call (module globals,
 * the first kernel's local memory, lazy loading, the malloc heap once
 * backed) shows up in NVML's per-process used memory. At most once a second
 * (and right away after a module load or when an allocation would not fit)
 * the process's charge on each limited device is raised to what NVML says
 * it holds: the excess over what the limiter accounted is charged as an
 * extra, which is lowered again when NVML says less. Needs the process's
 * host pid (tl_nvml.c).
 *
 * Guaranteed plus burst. A device with a ceiling (cfg.ceiling) charges
 * against guarantee + what it may borrow: min(ceiling - guarantee, the
 * GPU's unguaranteed memory that no other container borrows), read from
 * the node agent's budget file for the GPU (read-only in the container,
 * refreshed by the agent from what NVML says each container holds). The
 * file is re-read at the entry of a call that would charge past the
 * guarantee, at most every BUDGET_PERIOD_S, and at once when the charge
 * would not fit; a missing or malformed file lends nothing. Within its
 * guarantee a container never depends on the file.
 *
 * Reclaim on refusal. The budget is a snapshot, and memory no limiter
 * counts takes room too, so the driver may refuse an allocation that is
 * within the container's guarantee while others hold memory past theirs.
 * Then (tl_reclaim_retry) the limiter writes what it needs to the need
 * file the limits file names (reclaim=, in the container's writable state
 * directory; the node agent watches it), and retries the allocation until
 * it succeeds or reclaim_wait has passed, writing the file again every
 * RECLAIM_RESIGNAL_S. The agent checks the request against what NVML says
 * the container holds and stops the container furthest above its
 * guarantee; the file only asks. Over the guarantee nothing is asked: the
 * refusal is returned at once.
 */
#include "tl_compat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tl_clock.h"
#include "tl_internal.h"

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static int registered;

/* ---- devices ---- */

#define UNRESOLVED (-2)
static int ord_ld[TL_MAX_DEVICES];  /* file mode: UNRESOLVED, -1 (not in the file) or ld */
static int ld_ord[TL_MAX_DEVICES];  /* file mode: ordinal + 1, 0 = unknown */
static int map_init;

static void map_reset(void)
{
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        ord_ld[i] = UNRESOLVED;
        ld_ord[i] = 0;
    }
    __atomic_store_n(&map_init, 1, __ATOMIC_RELEASE);
}

static int cuda_uuid(int ord, unsigned char u[16])
{
    CUresult (*f)(unsigned char *, CUdevice) = real_cuDeviceGetUuid_v2 ? real_cuDeviceGetUuid_v2
                                                                         : real_cuDeviceGetUuid;
    CUdevice d = ord;
    if (real_cuDeviceGet && real_cuDeviceGet(&d, ord) != CUDA_SUCCESS)
        return -1;
    return f && f(u, d) == CUDA_SUCCESS ? 0 : -1;
}

int tl_ld_of_ordinal(int ord)
{
    if (ord < 0 || ord >= TL_MAX_DEVICES)
        return -1;
    if (!cfg.from_file)
        return ord;
    if (UNLIKELY(!__atomic_load_n(&map_init, __ATOMIC_ACQUIRE)))
        map_reset();
    int ld = __atomic_load_n(&ord_ld[ord], __ATOMIC_RELAXED);
    if (LIKELY(ld != UNRESOLVED))
        return ld;
    unsigned char u[16];
    if (cuda_uuid(ord, u) != 0)
        return -1; /* not now (before cuInit?); asked again next time */
    ld = -1;
    for (int i = 0; i < cfg.ndev; i++)
        if (!memcmp(cfg.uuid_bin[i], u, 16))
            ld = i;
    if (ld >= 0)
        __atomic_store_n(&ld_ord[ld], ord + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&ord_ld[ord], ld, __ATOMIC_RELAXED);
    return ld;
}

int tl_ordinal_of_ld(int ld)
{
    if (ld < 0 || ld >= TL_MAX_DEVICES)
        return -1;
    if (!cfg.from_file)
        return ld;
    if (UNLIKELY(!__atomic_load_n(&map_init, __ATOMIC_ACQUIRE)))
        map_reset();
    int o = __atomic_load_n(&ld_ord[ld], __ATOMIC_RELAXED);
    if (o)
        return o - 1;
    int n = 0;
    if (!real_cuDeviceGetCount || real_cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < n && i < TL_MAX_DEVICES; i++)
        if (tl_ld_of_ordinal(i) == ld)
            return i;
    return -1;
}

static struct {
    nvmlDevice_t h;
    int ld;
} nv_cache[TL_MAX_DEVICES];

int tl_ld_of_nvml(nvmlDevice_t d)
{
    for (int i = 0; i < TL_MAX_DEVICES; i++)
        if (__atomic_load_n(&nv_cache[i].h, __ATOMIC_ACQUIRE) == d && d)
            return nv_cache[i].ld;
    char s[TL_NVML_UUID_LEN];
    unsigned char u[16];
    int ld = -1;
    if (real_nvmlDeviceGetUUID && real_nvmlDeviceGetUUID(d, s, sizeof(s)) == NVML_SUCCESS &&
        tl_uuid_parse(s, u) == 0) {
        if (cfg.from_file) {
            for (int i = 0; i < cfg.ndev; i++)
                if (!memcmp(cfg.uuid_bin[i], u, 16))
                    ld = i;
        } else {
            /* the environment's indices are CUDA ordinals: find the one
             * with this UUID when CUDA is up in this process (never
             * loaded for it: nvidia-smi has no use for libcuda) */
            int n = 0;
            unsigned char cu[16];
            if (__atomic_load_n(&tl_cuda_ready, __ATOMIC_ACQUIRE) && real_cuDeviceGetCount && real_cuDeviceGetCount(&n) == CUDA_SUCCESS)
                for (int o = 0; o < n && o < TL_MAX_DEVICES && ld < 0; o++)
                    if (cuda_uuid(o, cu) == 0 && !memcmp(cu, u, 16))
                        ld = o;
        }
    }
    if (ld < 0 && !cfg.from_file) {
        /* no CUDA here (nvidia-smi): NVML index = CUDA ordinal, HAMi's assumption */
        unsigned idx;
        if (real_nvmlDeviceGetIndex && real_nvmlDeviceGetIndex(d, &idx) == NVML_SUCCESS && idx < TL_MAX_DEVICES)
            return (int)idx; /* not cached: CUDA may come up later */
    }
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        nvmlDevice_t none = NULL;
        if (__atomic_load_n(&nv_cache[i].h, __ATOMIC_ACQUIRE) == NULL) {
            nv_cache[i].ld = ld;
            if (__atomic_compare_exchange_n(&nv_cache[i].h, &none, d, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
                break;
        }
    }
    return ld;
}

int tl_nvml_of_ld(int ld, nvmlDevice_t *out)
{
    if (ld < 0 || ld >= TL_MAX_DEVICES || !tl_nvml_up())
        return -1;
    char s[TL_NVML_UUID_LEN];
    unsigned char u[16];
    if (cfg.from_file && ld < cfg.ndev)
        snprintf(s, sizeof(s), "%s", cfg.uuid[ld]);
    else if (!cfg.from_file && cuda_uuid(ld, u) == 0)
        tl_uuid_format(u, s, sizeof(s));
    else
        s[0] = 0;
    if (s[0] && real_nvmlDeviceGetHandleByUUID && real_nvmlDeviceGetHandleByUUID(s, out) == NVML_SUCCESS)
        return 0;
    if (!cfg.from_file && real_nvmlDeviceGetHandleByIndex_v2 &&
        real_nvmlDeviceGetHandleByIndex_v2((unsigned)ld, out) == NVML_SUCCESS)
        return 0;
    return -1;
}

int tl_current_ordinal(void)
{
    CUdevice d = 0;
    if (real_cuCtxGetDevice && real_cuCtxGetDevice(&d) == CUDA_SUCCESS)
        return d;
    return 0;
}

int tl_stream_ordinal(CUstream s, int ptsz)
{
    /* NULL, the legacy (1) and the per-thread (2) default streams belong to
     * the current context */
    if ((uintptr_t)s <= 2)
        return tl_current_ordinal();
    CUcontext c = NULL;
    CUresult (*f)(CUstream, CUcontext *) = ptsz && real_cuStreamGetCtx_ptsz ? real_cuStreamGetCtx_ptsz
                                                                            : real_cuStreamGetCtx;
    if (f && f(s, &c) == CUDA_SUCCESS && c) {
        int o = tl_ctx_ordinal(c);
        if (o >= 0)
            return o;
    }
    return tl_current_ordinal();
}

uint64_t tl_limit_of(int ld)
{
    if (ld < 0 || ld >= TL_MAX_DEVICES)
        return 1; /* unknown device while limits are on: fail closed */
    return cfg.mem_limit[ld];
}

/* ---- guaranteed plus burst ---- */

#define BUDGET_PERIOD_S 0.1
static pthread_mutex_t budget_mu = PTHREAD_MUTEX_INITIALIZER; /* taken alone, at a call's entry */
static uint64_t lendable[TL_MAX_DEVICES];   /* bytes this container may borrow on ld (atomic) */
static double budget_read_at[TL_MAX_DEVICES];
static int budget_warned[TL_MAX_DEVICES];

uint64_t tl_total_of(int ld)
{
    uint64_t lim = tl_limit_of(ld);
    if (lim && ld >= 0 && ld < TL_MAX_DEVICES && cfg.ceiling[ld])
        return cfg.ceiling[ld];
    return lim;
}

uint64_t tl_alloc_limit(int ld)
{
    uint64_t lim = tl_limit_of(ld);
    if (!lim || ld < 0 || ld >= TL_MAX_DEVICES || !cfg.ceiling[ld])
        return lim;
    uint64_t room = cfg.ceiling[ld] - lim, lend = __atomic_load_n(&lendable[ld], __ATOMIC_ACQUIRE);
    return lim + (lend < room ? lend : room);
}

static void budget_read(int ld, double now)
{
    static char buf[TL_BUDGET_MAX_BYTES + 1];
    char err[160];
    uint64_t avail = 0;
    pthread_mutex_lock(&budget_mu);
    int fd = open(cfg.budget_path[ld], O_RDONLY | O_CLOEXEC | O_NOCTTY);
    size_t n = 0;
    if (fd < 0) {
        snprintf(err, sizeof(err), "cannot open it: %s", strerror(errno));
    } else {
        ssize_t r;
        while (n < sizeof(buf) && ((r = read(fd, buf + n, sizeof(buf) - n)) > 0 || (r < 0 && errno == EINTR)))
            if (r > 0)
                n += (size_t)r;
        close(fd);
        if (tl_budget_parse(buf, n, cfg.borrower, &avail, err, sizeof(err)) == 0)
            err[0] = 0;
    }
    __atomic_store_n(&lendable[ld], avail, __ATOMIC_RELEASE);
    budget_read_at[ld] = now;
    if (err[0] && (cfg.debug || !budget_warned[ld]))
        fprintf(stderr, "tessera-limiter: device %d: budget file %s: %s; nothing is lent past the guarantee\n", ld,
                cfg.budget_path[ld], err);
    budget_warned[ld] = err[0] != 0;
    if (TL_TRACING)
        tl_trace("budget dev %d lendable %llu err %s", ld, (unsigned long long)avail, err[0] ? err : "-");
    pthread_mutex_unlock(&budget_mu);
}

void tl_budget_refresh(int ld, uint64_t bytes)
{
    if (ld < 0 || ld >= TL_MAX_DEVICES || !cfg.ceiling[ld] || !tl_limit_of(ld))
        return;
    uint64_t used = tl_shared_used(&sh, ld), lim = tl_limit_of(ld), want = used + bytes;
    if (bytes && want <= lim)
        return; /* within the guarantee: the budget does not matter */
    double now = tl_clock_coarse();
    if (now - budget_read_at[ld] < BUDGET_PERIOD_S && want <= tl_alloc_limit(ld))
        return;
    budget_read(ld, now);
}

#define RECLAIM_POLL_S 0.02
#define RECLAIM_RESIGNAL_S 0.25
static double reclaim_signalled_at; /* racy reads and writes are harmless: one write more or less */
static int reclaim_told;

/* The need file: replaced whole (rename), so the agent never reads half of it. */
static void reclaim_signal(int ld, uint64_t bytes, uint64_t used)
{
    char tmp[TL_RECLAIM_PATH_MAX + 32], text[256];
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", cfg.reclaim_path, (int)getpid());
    int n = snprintf(text, sizeof(text), "version=1\ndevice=%s\nbytes=%llu\nused=%llu\n", cfg.uuid[ld],
                     (unsigned long long)bytes, (unsigned long long)used);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644);
    int ok = fd >= 0 && write(fd, text, (size_t)n) == n;
    if (fd >= 0)
        close(fd);
    ok = ok && rename(tmp, cfg.reclaim_path) == 0;
    if (!ok) {
        unlink(tmp);
        if (cfg.debug || !__atomic_exchange_n(&reclaim_told, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "tessera-limiter: device %d: cannot ask the node agent to reclaim memory (%s: %s)\n", ld,
                    cfg.reclaim_path, strerror(errno));
    }
    if (TL_TRACING)
        tl_trace("reclaim dev %d bytes %llu used %llu ok %d", ld, (unsigned long long)bytes,
                 (unsigned long long)used, ok);
}

int tl_reclaim_retry(int ld, uint64_t bytes, double *deadline)
{
    if (!cfg.reclaim_path[0] || ld < 0 || ld >= cfg.ndev || !tl_limit_of(ld))
        return 0;
    /* the charge includes this allocation: within the guarantee only */
    uint64_t used = tl_shared_used(&sh, ld);
    if (used > tl_limit_of(ld))
        return 0;
    double now = tl_clock_now();
    if (*deadline == 0) {
        *deadline = now + cfg.reclaim_wait_ms / 1000.0;
        if (cfg.debug)
            fprintf(stderr, "tessera-limiter: device %d: the driver refused %llu bytes within the guarantee; asking "
                            "the node agent to reclaim memory borrowed past other guarantees (up to %u ms)\n",
                    ld, (unsigned long long)bytes, cfg.reclaim_wait_ms);
    } else if (now >= *deadline) {
        return 0;
    }
    double last = reclaim_signalled_at;
    if (last == 0 || now - last >= RECLAIM_RESIGNAL_S || now < last) {
        reclaim_signalled_at = now;
        reclaim_signal(ld, bytes, used);
    }
    double left = *deadline - now;
    tl_clock_sleep(left < RECLAIM_POLL_S ? left : RECLAIM_POLL_S);
    return 1;
}

/* ---- charging ---- */

int tl_ensure_registered(void)
{
    if (LIKELY(__atomic_load_n(&registered, __ATOMIC_ACQUIRE)))
        return 0;
    pthread_mutex_lock(&reg_mu);
    int r = 0;
    if (!registered) {
        r = sh.st ? tl_shared_register(&sh) : -1;
        if (r == 0) {
            tl_shared_publish_limits(&sh, cfg.mem_limit, cfg.sm_limit, TL_MAX_DEVICES);
            __atomic_store_n(&registered, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return r;
}

int tl_reserve_uncounted(int ld, uint64_t bytes)
{
    uint64_t lim = tl_alloc_limit(ld);
    if (!lim)
        return 0;
    if (ld < 0 || ld >= TL_MAX_DEVICES || tl_ensure_registered() != 0)
        return -1;
    return tl_shared_reserve(&sh, ld, bytes, lim) == 0 ? 1 : -1;
}

void tl_count_refused(int ld)
{
    tl_shared_count_refused(&sh, ld);
}

int tl_reserve(int ld, uint64_t bytes)
{
    int r = tl_reserve_uncounted(ld, bytes);
    if (r < 0)
        tl_count_refused(ld);
    return r;
}

void tl_release(int ld, uint64_t bytes)
{
    if (ld >= 0 && ld < TL_MAX_DEVICES && tl_limit_of(ld))
        tl_shared_release(&sh, ld, bytes);
}

void tl_force_charge(int ld, uint64_t bytes)
{
    if (ld >= 0 && ld < TL_MAX_DEVICES && tl_limit_of(ld) && tl_ensure_registered() == 0)
        tl_shared_reserve(&sh, ld, bytes, UINT64_MAX);
}

int tl_track(int kind, uint64_t key, uint64_t bytes, int ld)
{
    if (tl_table_put(kind, key, bytes, ld) == 0) {
        tl_hp_after_alloc(ld);
        return 0;
    }
    switch (kind) {
    case TL_K_PTR: CALL_REAL(cuMemFree_v2, (CUdeviceptr)key); break;
    case TL_K_ARRAY: CALL_REAL(cuArrayDestroy, (CUarray)(uintptr_t)key); break;
    case TL_K_MIPMAP: CALL_REAL(cuMipmappedArrayDestroy, (CUmipmappedArray)(uintptr_t)key); break;
    case TL_K_CTX: CALL_REAL(cuCtxDestroy_v2, (CUcontext)(uintptr_t)key); break;
    }
    tl_release(ld, bytes);
    return -1;
}

/* ---- reconciliation with NVML ---- */

#define RECONCILE_PERIOD_S 1.0
static pthread_mutex_t acct_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t extra[TL_MAX_DEVICES]; /* charged beyond what calls accounted, from NVML */
static double last_reconcile[TL_MAX_DEVICES];
static int dirty[TL_MAX_DEVICES];

void tl_mark_dirty(int ld)
{
    for (int i = 0; i < TL_MAX_DEVICES; i++)
        if (ld < 0 || i == ld)
            __atomic_store_n(&dirty[i], 1, __ATOMIC_RELEASE);
}

static void reconcile(int ld)
{
    int32_t me = tl_host_pid();
    if (!me || !sh.st || sh.slot < 0)
        return;
    tl_gpu_proc list[TL_HP_MAX];
    int n = tl_gpu_procs(ld, list, TL_HP_MAX);
    if (n < 0)
        return;
    uint64_t held = 0;
    int found = 0;
    for (int i = 0; i < n; i++)
        if (list[i].pid == (uint32_t)me && list[i].used != UINT64_MAX) {
            held = list[i].used;
            found = 1;
        }
    if (!found)
        held = 0; /* not on the GPU (no context): holds nothing */
    pthread_mutex_lock(&acct_mu);
    uint64_t charged = tl_shared_self_used(&sh, ld), accounted = charged > extra[ld] ? charged - extra[ld] : 0;
    uint64_t want = held > accounted ? held - accounted : 0;
    if (want > extra[ld]) {
        tl_shared_reserve(&sh, ld, want - extra[ld], UINT64_MAX);
        if (cfg.debug)
            fprintf(stderr, "tessera-limiter: device %d: NVML says this process holds %llu bytes, %llu more than "
                            "its calls were charged; charged\n", ld, (unsigned long long)held,
                    (unsigned long long)want);
    } else if (want < extra[ld]) {
        tl_shared_release(&sh, ld, extra[ld] - want);
    }
    extra[ld] = want;
    pthread_mutex_unlock(&acct_mu);
}

void tl_account_prepare(int ld, uint64_t bytes)
{
    if (!tl_limit_of(ld) || ld < 0 || ld >= TL_MAX_DEVICES)
        return;
    tl_budget_refresh(ld, bytes);
    uint64_t lim = tl_alloc_limit(ld);
    double now = tl_clock_coarse();
    uint64_t used = tl_shared_used(&sh, ld);
    int fits = used <= lim && bytes <= lim - used;
    int due = now - last_reconcile[ld] >= RECONCILE_PERIOD_S; /* a racy read is harmless here */
    if (LIKELY(fits && !due && !__atomic_load_n(&dirty[ld], __ATOMIC_RELAXED)))
        return;
    if (!fits)
        tl_pools_resync(ld);
    __atomic_store_n(&dirty[ld], 0, __ATOMIC_RELAXED);
    last_reconcile[ld] = now;
    if (tl_ensure_registered() == 0)
        reconcile(ld);
}

void tl_account_after_fork(void)
{
    pthread_mutex_init(&reg_mu, NULL);
    pthread_mutex_init(&acct_mu, NULL);
    pthread_mutex_init(&budget_mu, NULL);
    registered = 0;
    memset(extra, 0, sizeof(extra));
    memset(last_reconcile, 0, sizeof(last_reconcile));
    reclaim_signalled_at = 0;
}
