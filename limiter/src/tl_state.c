/*
 * tl_state.c - shared accounting across the processes of a container.
 * See tl_state.h for the layout, the locking rules and liveness.
 */
#include "tl_compat.h"

#include "tl_state.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h> /* fchmod only: no stat() (tl_compat.h) */
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif

#define RECLAIM_INTERVAL_NS 100000000ull /* 100 ms */

/* The sweep intervals (100 ms, 1 s) need no precision: the coarse clock
 * (vDSO, a few ns, a few ms resolution) keeps the hot paths cheap. */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The inode of our pid namespace, from the link "pid:[4026531836]" (no
 * stat(): its glibc symbol is too new, see tl_compat.h). */
static uint64_t self_pidns(void)
{
    char buf[64];
    ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strchr(buf, '[');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* fcntl through the system call: glibc's fcntl symbol is versioned
 * GLIBC_2.28 (fcntl64) on current builds. */
static int ofd_lock(int fd, int cmd, short type, long long byte, struct flock *out)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)byte;
    fl.l_len = 1;
    long r = syscall(SYS_fcntl, fd, cmd, &fl);
    if (out)
        *out = fl;
    return r == 0 ? 0 : -1;
}

/* Seqlock writer side. Only lock holders write seq, so plain stores do;
 * the fences order the odd value before the data and the data before the
 * even value, for lock-free readers. */
static void write_begin(tl_state *st)
{
    __atomic_store_n(&st->seq, st->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void write_end(tl_state *st)
{
    __atomic_store_n(&st->seq, st->seq + 1, __ATOMIC_RELEASE);
}

static void recompute_totals(tl_state *st)
{
    for (int d = 0; d < TL_MAX_DEVICES; d++) {
        uint64_t sum = 0;
        for (int i = 0; i < TL_MAX_PROCS; i++)
            if (st->slots[i].pid != 0)
                sum += st->slots[i].used[d];
        st->total_used[d] = sum;
    }
}

static void clear_slot(tl_state *st, int i)
{
    tl_proc_slot *s = &st->slots[i];
    for (int d = 0; d < TL_MAX_DEVICES; d++) {
        uint64_t u = s->used[d];
        st->total_used[d] = st->total_used[d] >= u ? st->total_used[d] - u : 0;
        s->used[d] = 0;
    }
    s->host_pid = 0;
    s->pidns = 0;
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

/* A zombie still answers kill(pid, 0) but holds no GPU memory. */
static int is_zombie(int32_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* Is the process of slot i gone? */
static int slot_dead(tl_shared *sh, int i)
{
    tl_proc_slot *s = &sh->st->slots[i];
    if (sh->ofd) {
        struct flock fl;
        if (ofd_lock(sh->fd, F_OFD_GETLK, F_WRLCK, TL_SLOT_LOCK_BASE + i, &fl) == 0)
            return fl.l_type == F_UNLCK;
        return 0; /* cannot tell: keep it */
    }
    if (s->pidns != sh->pidns)
        return 0; /* cannot judge a pid from another namespace */
    return (kill(s->pid, 0) == -1 && errno == ESRCH) || is_zombie(s->pid);
}

/* Must hold the lock. Clears the slots of processes that are gone. */
static int sweep_locked(tl_shared *sh)
{
    tl_state *st = sh->st;
    int n = 0;
    for (int i = 0; i < TL_MAX_PROCS; i++) {
        if (st->slots[i].pid == 0 || i == sh->slot)
            continue;
        if (slot_dead(sh, i)) {
            clear_slot(st, i);
            st->reclaimed_procs++;
            n++;
        }
    }
    st->last_reclaim_ns = now_ns();
    return n;
}

static void apply_pending(tl_shared *sh)
{
    tl_state *st = sh->st;
    for (int d = 0; d < TL_MAX_DEVICES && sh->slot >= 0; d++) {
        uint64_t b = sh->pending[d];
        if (!b)
            continue;
        tl_proc_slot *s = &st->slots[sh->slot];
        if (b > s->used[d])
            b = s->used[d];
        s->used[d] -= b;
        st->total_used[d] = st->total_used[d] >= b ? st->total_used[d] - b : 0;
        sh->pending[d] = 0;
    }
    sh->any_pending = 0;
}

#define UNLIKELY_PENDING(sh) __builtin_expect(__atomic_load_n(&(sh)->any_pending, __ATOMIC_RELAXED) && (sh)->slot >= 0, 0)

static int lock_state(tl_shared *sh)
{
    tl_state *st = sh->st;
    int r = pthread_mutex_trylock(&st->lock.mutex); /* the common case: free, no clock read */
    if (r == EBUSY) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += TL_LOCK_WAIT_S;
        r = pthread_mutex_timedlock(&st->lock.mutex, &dl);
    }
    if (r == EOWNERDEAD) {
        /* The previous owner died holding the lock: its half-finished
         * update may have left totals inconsistent, so rebuild them. */
        pthread_mutex_consistent(&st->lock.mutex);
        if (st->seq & 1)
            st->seq++;
        write_begin(st);
        recompute_totals(st);
        sweep_locked(sh);
        write_end(st);
        r = 0;
    }
    if (r == ETIMEDOUT) {
        if (!__atomic_exchange_n(&sh->warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "tessera-limiter: the lock of the shared state %s has been held for more than %d s "
                            "(a process of this container is stopped or stuck); refusing allocations while it is\n",
                    sh->path, TL_LOCK_WAIT_S);
        return -1;
    }
    if (r != 0) {
        fprintf(stderr, "tessera-limiter: shared state lock failed: %s\n", strerror(r));
        return -1;
    }
    if (UNLIKELY_PENDING(sh)) {
        write_begin(st);
        apply_pending(sh);
        write_end(st);
    }
    return 0;
}

static void unlock_state(tl_shared *sh)
{
    pthread_mutex_unlock(&sh->st->lock.mutex);
}

/* Size the file for version 4. */
static int grow(int fd, const char *path)
{
    if (ftruncate(fd, (off_t)sizeof(tl_state)) != 0) {
        fprintf(stderr, "tessera-limiter: cannot size shared state %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Does another process hold a slot byte (a live process of the file)? */
static int v3_holders(int fd)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)TL_SLOT_LOCK_BASE;
    fl.l_len = TL_MAX_PROCS;
    if (syscall(SYS_fcntl, fd, F_OFD_GETLK, &fl) != 0)
        return 1; /* cannot tell: assume so */
    return fl.l_type != F_UNLCK;
}

int tl_shared_open(tl_shared *sh, const char *path)
{
    memset(sh, 0, sizeof(*sh));
    sh->slot = -1;
    sh->fd = -1;
    snprintf(sh->path, sizeof(sh->path), "%s", path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "tessera-limiter: cannot open shared state %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX) != 0) {
        fprintf(stderr, "tessera-limiter: cannot lock shared state %s: %s\n", path, strerror(errno));
        close(fd);
        return -1;
    }
    int ok = -1;
    tl_state *st = MAP_FAILED;
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < 0) {
        fprintf(stderr, "tessera-limiter: cannot size shared state %s: %s\n", path, strerror(errno));
        goto out;
    }
    if (size == 0) {
        (void)fchmod(fd, 0666);
        if (grow(fd, path) != 0)
            goto out;
        size = (off_t)sizeof(tl_state);
    }
    if (size != 0 && (size_t)size < TL_STATE_V3_SIZE) {
        fprintf(stderr, "tessera-limiter: shared state %s has size %lld, want %zu (incompatible layout)\n", path,
                (long long)size, sizeof(tl_state));
        goto out;
    }
    /* the whole version-4 size even over a version-3 file: its counters
     * are never touched then (sh->v3) */
    st = mmap(NULL, sizeof(tl_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED) {
        fprintf(stderr, "tessera-limiter: cannot map shared state %s: %s\n", path, strerror(errno));
        goto out;
    }
    /* OFD locks available? (probe on a byte no slot uses) */
    sh->ofd = ofd_lock(fd, F_OFD_GETLK, F_WRLCK, TL_SLOT_LOCK_BASE + TL_MAX_PROCS, NULL) == 0;
    int same_header = st->header_size == offsetof(tl_state, slots) && st->slot_size == sizeof(tl_proc_slot) &&
                      st->max_devices == TL_MAX_DEVICES && st->max_procs == TL_MAX_PROCS &&
                      st->init_state == TL_STATE_READY && st->magic == TL_STATE_MAGIC;
    if (st->magic == 0 && st->init_state == 0) {
        pthread_mutexattr_t a;
        if ((size_t)size < sizeof(tl_state) && grow(fd, path) != 0)
            goto out;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        memset(st, 0, sizeof(*st));
        if (pthread_mutex_init(&st->lock.mutex, &a) != 0) {
            pthread_mutexattr_destroy(&a);
            fprintf(stderr, "tessera-limiter: cannot init shared mutex\n");
            goto out;
        }
        pthread_mutexattr_destroy(&a);
        st->version = TL_STATE_VERSION;
        st->header_size = (uint32_t)offsetof(tl_state, slots);
        st->slot_size = (uint32_t)sizeof(tl_proc_slot);
        st->max_devices = TL_MAX_DEVICES;
        st->max_procs = TL_MAX_PROCS;
        st->init_state = TL_STATE_READY;
        __atomic_store_n(&st->magic, TL_STATE_MAGIC, __ATOMIC_RELEASE);
    } else if (same_header && st->version == TL_STATE_VERSION_V3) {
        /* A version-3 file (a container or claim that ran an older
         * limiter). Nobody alive in it: upgrade it in place (version-3
         * processes that start later refuse it). Someone alive (or no way
         * to tell): share it as version 3, without counters. */
        if (sh->ofd && !v3_holders(fd)) {
            if ((size_t)size < sizeof(tl_state) && grow(fd, path) != 0)
                goto out;
            memset(&st->counters, 0, sizeof(st->counters));
            __atomic_store_n(&st->version, TL_STATE_VERSION, __ATOMIC_RELEASE);
        } else {
            sh->v3 = 1;
        }
    } else if (same_header && st->version == TL_STATE_VERSION && (size_t)size < sizeof(tl_state)) {
        fprintf(stderr, "tessera-limiter: shared state %s has version %u but size %lld, want %zu (truncated?); "
                        "remove it when no process of the container runs\n",
                path, st->version, (long long)size, sizeof(tl_state));
        goto out;
    } else if (!same_header || st->version != TL_STATE_VERSION) {
        fprintf(stderr, "tessera-limiter: shared state %s has an incompatible layout (magic %#llx version %u, "
                        "want version %u); remove it when no process of the container runs\n",
                path, (unsigned long long)st->magic, st->version, TL_STATE_VERSION);
        goto out;
    }
    sh->st = st;
    sh->pid = getpid();
    sh->pidns = self_pidns();
    ok = 0;
out:
    if (ok != 0 && st != MAP_FAILED)
        munmap(st, sizeof(tl_state));
    flock(fd, LOCK_UN);
    if (ok == 0)
        sh->fd = fd;
    else
        close(fd);
    return ok;
}

void tl_shared_after_fork(tl_shared *sh)
{
    if (!sh->st)
        return;
    if (sh->fd >= 0)
        close(sh->fd); /* the parent's description: its locks are the parent's */
    sh->fd = open(sh->path, O_RDWR | O_CLOEXEC);
    sh->slot = -1;
    sh->pid = getpid();
    memset(sh->pending, 0, sizeof(sh->pending));
    sh->any_pending = 0;
}

int tl_shared_register(tl_shared *sh)
{
    tl_state *st = sh->st;
    sh->pid = getpid();
    sh->slot = -1;
    if (sh->fd < 0)
        return -1;
    if (lock_state(sh) != 0)
        return -1;
    write_begin(st);
    for (int pass = 0; pass < 2 && sh->slot < 0; pass++) {
        for (int i = 0; i < TL_MAX_PROCS; i++) {
            tl_proc_slot *s = &st->slots[i];
            if (s->pid == sh->pid && s->pidns == sh->pidns && (!sh->ofd || slot_dead(sh, i))) {
                /* a dead process had our pid: its usage is stale */
                clear_slot(st, i);
                st->reclaimed_procs++;
            }
        }
        for (int i = 0; i < TL_MAX_PROCS && sh->slot < 0; i++) {
            tl_proc_slot *s = &st->slots[i];
            if (s->pid != 0)
                continue;
            /* claim the slot's byte first: a sweeper must never see our pid
             * in a slot whose byte nobody holds */
            if (sh->ofd && ofd_lock(sh->fd, F_OFD_SETLK, F_WRLCK, TL_SLOT_LOCK_BASE + i, NULL) != 0)
                continue; /* still held by a process that cleared its slot and lives on */
            memset(s->used, 0, sizeof(s->used));
            s->host_pid = 0;
            s->pidns = sh->pidns;
            __atomic_store_n(&s->pid, sh->pid, __ATOMIC_RELEASE);
            sh->slot = i;
        }
        if (sh->slot < 0)
            sweep_locked(sh);
    }
    write_end(st);
    unlock_state(sh);
    if (sh->slot < 0) {
        fprintf(stderr, "tessera-limiter: shared state full (%d processes)\n", TL_MAX_PROCS);
        return -1;
    }
    return 0;
}

void tl_shared_unregister(tl_shared *sh)
{
    if (!sh->st || sh->slot < 0)
        return;
    if (lock_state(sh) != 0)
        return;
    write_begin(sh->st);
    if (sh->st->slots[sh->slot].pid == sh->pid)
        clear_slot(sh->st, sh->slot);
    write_end(sh->st);
    unlock_state(sh);
    if (sh->ofd)
        ofd_lock(sh->fd, F_OFD_SETLK, F_UNLCK, TL_SLOT_LOCK_BASE + sh->slot, NULL);
    sh->slot = -1;
}

void tl_shared_publish_limits(tl_shared *sh, const uint64_t *limit, const uint32_t *sm_limit, int ndev)
{
    if (lock_state(sh) != 0)
        return;
    write_begin(sh->st);
    for (int d = 0; d < ndev && d < TL_MAX_DEVICES; d++) {
        sh->st->limit[d] = limit[d];
        sh->st->sm_limit[d] = sm_limit[d];
    }
    write_end(sh->st);
    unlock_state(sh);
}

int tl_shared_reserve(tl_shared *sh, int dev, uint64_t bytes, uint64_t limit)
{
    tl_state *st = sh->st;
    if (dev < 0 || dev >= TL_MAX_DEVICES || sh->slot < 0)
        return -1;
    if (lock_state(sh) != 0)
        return -1;
    int ok = -1;
    write_begin(st);
    if (now_ns() - st->last_reclaim_ns > RECLAIM_INTERVAL_NS)
        sweep_locked(sh);
    for (int pass = 0; pass < 2; pass++) {
        uint64_t cur = st->total_used[dev];
        if (bytes <= limit && cur <= limit - bytes) {
            st->total_used[dev] = cur + bytes;
            st->slots[sh->slot].used[dev] += bytes;
            ok = 0;
            break;
        }
        if (pass == 0 && sweep_locked(sh) == 0)
            break; /* nothing reclaimed: the answer will not change */
    }
    write_end(st);
    unlock_state(sh);
    return ok;
}

void tl_shared_release(tl_shared *sh, int dev, uint64_t bytes)
{
    tl_state *st = sh->st;
    if (dev < 0 || dev >= TL_MAX_DEVICES || sh->slot < 0 || !bytes)
        return;
    if (lock_state(sh) != 0) {
        __atomic_add_fetch(&sh->pending[dev], bytes, __ATOMIC_RELAXED); /* applied at the next lock */
        __atomic_store_n(&sh->any_pending, 1, __ATOMIC_RELAXED);
        return;
    }
    write_begin(st);
    tl_proc_slot *s = &st->slots[sh->slot];
    uint64_t b = bytes <= s->used[dev] ? bytes : s->used[dev];
    s->used[dev] -= b;
    st->total_used[dev] = st->total_used[dev] >= b ? st->total_used[dev] - b : 0;
    write_end(st);
    unlock_state(sh);
}

uint64_t tl_shared_used(const tl_shared *sh, int dev)
{
    if (!sh->st || dev < 0 || dev >= TL_MAX_DEVICES)
        return 0;
    return __atomic_load_n(&sh->st->total_used[dev], __ATOMIC_ACQUIRE);
}

uint64_t tl_shared_self_used(const tl_shared *sh, int dev)
{
    if (!sh->st || sh->slot < 0 || dev < 0 || dev >= TL_MAX_DEVICES)
        return 0;
    return __atomic_load_n(&sh->st->slots[sh->slot].used[dev], __ATOMIC_ACQUIRE);
}

void tl_shared_maybe_reclaim(tl_shared *sh, uint64_t interval_ns)
{
    if (sh->st && now_ns() - __atomic_load_n(&sh->st->last_reclaim_ns, __ATOMIC_RELAXED) > interval_ns)
        tl_shared_reclaim(sh);
}

int tl_shared_reclaim(tl_shared *sh)
{
    if (!sh->st || lock_state(sh) != 0)
        return 0;
    write_begin(sh->st);
    int n = sweep_locked(sh);
    write_end(sh->st);
    unlock_state(sh);
    return n;
}

static int counts(const tl_shared *sh, int dev)
{
    return sh->st && !sh->v3 && dev >= 0 && dev < TL_MAX_DEVICES;
}

void tl_shared_add_throttled(tl_shared *sh, int dev, uint64_t ns)
{
    if (counts(sh, dev) && ns)
        __atomic_add_fetch(&sh->st->counters.throttled_ns[dev], ns, __ATOMIC_RELAXED);
}

void tl_shared_count_refused(tl_shared *sh, int dev)
{
    if (counts(sh, dev))
        __atomic_add_fetch(&sh->st->counters.refused_allocs[dev], 1, __ATOMIC_RELAXED);
}

uint64_t tl_shared_throttled_ns(const tl_shared *sh, int dev)
{
    return counts(sh, dev) ? __atomic_load_n(&sh->st->counters.throttled_ns[dev], __ATOMIC_RELAXED) : 0;
}

uint64_t tl_shared_refused(const tl_shared *sh, int dev)
{
    return counts(sh, dev) ? __atomic_load_n(&sh->st->counters.refused_allocs[dev], __ATOMIC_RELAXED) : 0;
}

int tl_shared_pids(const tl_shared *sh, int32_t *out, int n)
{
    int k = 0;
    for (int i = 0; sh->st && i < TL_MAX_PROCS && k < n; i++) {
        int32_t p = __atomic_load_n(&sh->st->slots[i].pid, __ATOMIC_ACQUIRE);
        if (p != 0)
            out[k++] = p;
    }
    return k;
}

void tl_shared_set_host_pid(tl_shared *sh, int32_t host_pid)
{
    if (!sh->st || sh->slot < 0 || lock_state(sh) != 0)
        return;
    write_begin(sh->st);
    if (sh->st->slots[sh->slot].pid == sh->pid)
        __atomic_store_n(&sh->st->slots[sh->slot].host_pid, host_pid, __ATOMIC_RELEASE);
    write_end(sh->st);
    unlock_state(sh);
}

int tl_shared_host_pids(const tl_shared *sh, int32_t *out, int n, int skip)
{
    int k = 0;
    if (!sh->st)
        return 0;
    for (int i = 0; i < TL_MAX_PROCS && k < n; i++) {
        if (i == skip || __atomic_load_n(&sh->st->slots[i].pid, __ATOMIC_ACQUIRE) == 0)
            continue;
        int32_t h = __atomic_load_n(&sh->st->slots[i].host_pid, __ATOMIC_ACQUIRE);
        if (h > 0)
            out[k++] = h;
    }
    return k;
}
