/*
 * tl_state.c - shared accounting across the processes of a container.
 * See tl_state.h for the layout and the locking rules.
 */
#define _GNU_SOURCE
#include "tl_state.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RECLAIM_INTERVAL_NS 100000000ull /* 100 ms */

/* The sweep intervals (100 ms, 1 s) need no precision: the coarse clock
 * (vDSO, a few ns, a few ms resolution) keeps the hot paths cheap. */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t self_pidns(void)
{
    struct stat sb;
    if (stat("/proc/self/ns/pid", &sb) == 0)
        return (uint64_t)sb.st_ino;
    return 0;
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

/* Must hold the lock. Clears slots of processes (in our pid namespace)
 * that no longer exist. */
static int sweep_locked(tl_shared *sh)
{
    tl_state *st = sh->st;
    int n = 0;
    for (int i = 0; i < TL_MAX_PROCS; i++) {
        tl_proc_slot *s = &st->slots[i];
        if (s->pid == 0 || i == sh->slot)
            continue;
        if (s->pidns != sh->pidns)
            continue; /* cannot judge a pid from another namespace */
        if ((kill(s->pid, 0) == -1 && errno == ESRCH) || is_zombie(s->pid)) {
            clear_slot(st, i);
            st->reclaimed_procs++;
            n++;
        }
    }
    st->last_reclaim_ns = now_ns();
    return n;
}

static int lock_state(tl_shared *sh)
{
    tl_state *st = sh->st;
    int r = pthread_mutex_lock(&st->lock.mutex);
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
        return 0;
    }
    if (r != 0) {
        fprintf(stderr, "tessera-limiter: shared state lock failed: %s\n", strerror(r));
        return -1;
    }
    return 0;
}

static void unlock_state(tl_shared *sh)
{
    pthread_mutex_unlock(&sh->st->lock.mutex);
}

int tl_shared_open(tl_shared *sh, const char *path)
{
    memset(sh, 0, sizeof(*sh));
    sh->slot = -1;
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
    struct stat sb;
    tl_state *st = MAP_FAILED;
    if (fstat(fd, &sb) != 0)
        goto out;
    if (sb.st_size == 0) {
        (void)fchmod(fd, 0666);
        if (ftruncate(fd, (off_t)sizeof(tl_state)) != 0) {
            fprintf(stderr, "tessera-limiter: cannot size shared state %s: %s\n", path, strerror(errno));
            goto out;
        }
    } else if ((size_t)sb.st_size < sizeof(tl_state)) {
        fprintf(stderr, "tessera-limiter: shared state %s has size %lld, want %zu (incompatible layout)\n",
                path, (long long)sb.st_size, sizeof(tl_state));
        goto out;
    }
    st = mmap(NULL, sizeof(tl_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED) {
        fprintf(stderr, "tessera-limiter: cannot map shared state %s: %s\n", path, strerror(errno));
        goto out;
    }
    if (st->magic == 0 && st->init_state == 0) {
        pthread_mutexattr_t a;
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
    } else if (st->magic != TL_STATE_MAGIC || st->version != TL_STATE_VERSION ||
               st->header_size != offsetof(tl_state, slots) ||
               st->slot_size != sizeof(tl_proc_slot) || st->max_devices != TL_MAX_DEVICES ||
               st->max_procs != TL_MAX_PROCS || st->init_state != TL_STATE_READY) {
        fprintf(stderr, "tessera-limiter: shared state %s has an incompatible layout "
                "(magic %#llx version %u)\n", path, (unsigned long long)st->magic, st->version);
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
    close(fd);
    return ok;
}

int tl_shared_register(tl_shared *sh)
{
    tl_state *st = sh->st;
    sh->pid = getpid();
    sh->slot = -1;
    if (lock_state(sh) != 0)
        return -1;
    write_begin(st);
    for (int pass = 0; pass < 2 && sh->slot < 0; pass++) {
        int free_slot = -1;
        for (int i = 0; i < TL_MAX_PROCS; i++) {
            tl_proc_slot *s = &st->slots[i];
            if (s->pid == sh->pid && s->pidns == sh->pidns) {
                /* A dead process had our pid: its usage is stale. */
                clear_slot(st, i);
                st->reclaimed_procs++;
            }
            if (s->pid == 0 && free_slot < 0)
                free_slot = i;
        }
        if (free_slot >= 0) {
            tl_proc_slot *s = &st->slots[free_slot];
            memset(s->used, 0, sizeof(s->used));
            s->host_pid = 0;
            s->pidns = sh->pidns;
            __atomic_store_n(&s->pid, sh->pid, __ATOMIC_RELEASE);
            sh->slot = free_slot;
        } else {
            sweep_locked(sh);
        }
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
    if (dev < 0 || dev >= TL_MAX_DEVICES || sh->slot < 0)
        return;
    if (lock_state(sh) != 0)
        return;
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

void tl_shared_maybe_reclaim(tl_shared *sh, uint64_t interval_ns)
{
    if (sh->st && now_ns() - __atomic_load_n(&sh->st->last_reclaim_ns, __ATOMIC_RELAXED) > interval_ns)
        tl_shared_reclaim(sh);
}

int tl_shared_reclaim(tl_shared *sh)
{
    if (lock_state(sh) != 0)
        return 0;
    write_begin(sh->st);
    int n = sweep_locked(sh);
    write_end(sh->st);
    unlock_state(sh);
    return n;
}

int tl_shared_pids(const tl_shared *sh, int32_t *out, int n)
{
    int k = 0;
    for (int i = 0; i < TL_MAX_PROCS && k < n; i++) {
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
