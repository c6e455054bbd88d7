/*
 * tl_state.h - the shared-state file that all processes of one container
 * map to share one GPU memory budget.
 *
 * Layout (little-endian, x86_64/aarch64 LP64), versioned by magic/version
 * and the sizes recorded in the header. The Go reader in
 * internal/limiterstate mirrors these offsets; a Go test checks them
 * against offsetof()/sizeof() printed by test/layout_dump.c.
 *
 * Writers hold `lock` (a process-shared robust mutex), waiting at most
 * TL_LOCK_WAIT_S for it. Every change made under the lock is bracketed by
 * seq++ (odd while writing) so lock-free readers (the Go reader) can detect
 * and retry torn snapshots.
 *
 * Counters (version 4): per device, the time launches were held back by
 * the compute pacing and the allocations refused because of the memory
 * limit. They live after the slots, are added to lock-free with atomics
 * (not covered by seq: each is monotone on its own) and never decrease
 * while the file exists, whatever processes come and go.
 *
 * Versions: 4 = 3 + the counters appended (every offset of version 3 is
 * unchanged, including the slot lock bytes). A version-4 limiter that finds
 * a version-3 file with no live process (no slot byte locked) upgrades it
 * in place (grows it, sets version 4); with a live version-3 process it
 * uses the file as version 3 and counts nothing. A version-3 limiter
 * refuses a version-4 file (incompatible layout: fail closed).
 *
 * Liveness: a process that holds slot i also holds an open-file-description
 * lock (F_OFD_SETLK, write) on byte TL_SLOT_LOCK_BASE + i of the file. The
 * kernel drops it when the process dies, whatever pid namespace it lived in,
 * so a sweep that finds slot i in use but its byte unlocked (F_OFD_GETLK)
 * reclaims it: a container restarted in a new pid namespace gets back what
 * the processes of the old one held. Where OFD locks are not available
 * (kernels before 3.15) liveness falls back to kill(pid, 0) within the
 * sweeper's own pid namespace.
 */
#ifndef TL_STATE_H
#define TL_STATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define TL_STATE_MAGIC 0x314D494C53534554ULL /* "TESSLIM1" little-endian */
/* 3: slot liveness by OFD lock (processes of version 2 hold none, so the
 * two must not share a file); the layout is the same as version 2's.
 * 4: version 3 + tl_counters appended (see above) */
#define TL_STATE_VERSION 4u
#define TL_STATE_VERSION_V3 3u
#define TL_MAX_DEVICES 16
#define TL_MAX_PROCS 1024

#define TL_STATE_READY 2u
#define TL_LOCK_WAIT_S 2 /* longest wait for the shared lock */

typedef struct tl_proc_slot {
    int32_t pid;      /* 0 = free */
    int32_t host_pid; /* `pid` as NVML reports it (host pid namespace), 0 = not known yet */
    uint64_t pidns;   /* inode of the pid namespace of `pid` */
    uint64_t used[TL_MAX_DEVICES]; /* bytes charged by this process */
} tl_proc_slot;

/* Monotone counters per device (version 4), updated with atomics. */
typedef struct tl_counters {
    uint64_t throttled_ns[TL_MAX_DEVICES];   /* launches held back by the pacing, summed over
                                               * the waiting launches (threads) */
    uint64_t refused_allocs[TL_MAX_DEVICES]; /* allocations refused by the memory limit */
} tl_counters;

typedef struct tl_state {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;   /* offsetof(tl_state, slots) */
    uint32_t slot_size;     /* sizeof(tl_proc_slot) */
    uint32_t max_devices;
    uint32_t max_procs;
    uint32_t init_state;    /* TL_STATE_READY once initialised */
    uint64_t seq;           /* odd while a writer is mid-update */
    uint64_t limit[TL_MAX_DEVICES];   /* bytes, 0 = unlimited (last writer's config) */
    uint64_t total_used[TL_MAX_DEVICES]; /* sum of slots[].used[dev] */
    uint32_t sm_limit[TL_MAX_DEVICES];   /* percent, 0 = unlimited */
    uint64_t reclaimed_procs;  /* dead processes whose usage was reclaimed */
    uint64_t last_reclaim_ns;  /* CLOCK_MONOTONIC(_COARSE) of last dead-slot sweep */
    union {
        pthread_mutex_t mutex;
        unsigned char pad[64];
    } lock;
    tl_proc_slot slots[TL_MAX_PROCS];
    tl_counters counters; /* version 4 */
} tl_state;

/* The size of a version-3 file: everything before the counters. */
#define TL_STATE_V3_SIZE offsetof(tl_state, counters)

/* Byte of the file whose OFD lock says slot i's process is alive (the
 * bytes of version 3, so that both versions' processes see each other). */
#define TL_SLOT_LOCK_BASE ((long long)TL_STATE_V3_SIZE)

/* Process-local handle. */
typedef struct tl_shared {
    tl_state *st;
    int fd;          /* open file description holding our slot's lock */
    int ofd;         /* OFD locks work here (else pid liveness) */
    int v3;          /* the file is version 3 (a live version-3 process uses it): no counters */
    int slot;        /* index of this process's slot, -1 if none */
    int32_t pid;
    uint64_t pidns;
    uint64_t pending[TL_MAX_DEVICES]; /* releases not yet applied (lock wait timed out) */
    int any_pending;
    int warned;      /* the lock-timeout message was printed */
    char path[4096];
} tl_shared;

/* Open (creating and initialising if needed) the state file at `path`.
 * Returns 0 or -1 with a message printed to stderr. */
int tl_shared_open(tl_shared *sh, const char *path);
/* Register this process (claims a slot and locks its byte). Returns 0 or -1. */
int tl_shared_register(tl_shared *sh);
/* Clear this process's slot (process exit). */
void tl_shared_unregister(tl_shared *sh);
/* In a fork child: give up the parent's slot and open description (whose
 * locks the parent owns) and open the file anew. Async-signal-safe. */
void tl_shared_after_fork(tl_shared *sh);
/* Record configured limits for readers. */
void tl_shared_publish_limits(tl_shared *sh, const uint64_t *limit,
                              const uint32_t *sm_limit, int ndev);
/* Charge `bytes` on `dev` if total stays <= limit. Returns 0 on success,
 * -1 if it would exceed the limit (after reclaiming dead processes) or the
 * lock could not be had within TL_LOCK_WAIT_S. */
int tl_shared_reserve(tl_shared *sh, int dev, uint64_t bytes, uint64_t limit);
/* Give back `bytes` on `dev` previously charged by this process (applied
 * at the next lock if the lock cannot be had now). */
void tl_shared_release(tl_shared *sh, int dev, uint64_t bytes);
/* Container-wide usage on `dev` (lock-free read). */
uint64_t tl_shared_used(const tl_shared *sh, int dev);
/* This process's usage on `dev` (lock-free read). */
uint64_t tl_shared_self_used(const tl_shared *sh, int dev);
/* Sweep dead processes if the last sweep is older than `interval_ns`
 * (reporting paths call this so nvidia-smi does not show the dead). */
void tl_shared_maybe_reclaim(tl_shared *sh, uint64_t interval_ns);
/* Sweep dead processes now; returns number of slots reclaimed. */
int tl_shared_reclaim(tl_shared *sh);
/* Add `ns` to the time launches on `dev` were held back (lock-free). */
void tl_shared_add_throttled(tl_shared *sh, int dev, uint64_t ns);
/* Count one allocation on `dev` refused by the memory limit (lock-free). */
void tl_shared_count_refused(tl_shared *sh, int dev);
/* The counters of `dev` (0 on a version-3 file). */
uint64_t tl_shared_throttled_ns(const tl_shared *sh, int dev);
uint64_t tl_shared_refused(const tl_shared *sh, int dev);
/* Copy the pids of live slots into out (at most n). Returns count. */
int tl_shared_pids(const tl_shared *sh, int32_t *out, int n);
/* Publish this process's host pid in its slot. */
void tl_shared_set_host_pid(tl_shared *sh, int32_t host_pid);
/* Copy the known host pids of live slots other than slot `skip` into out
 * (at most n). Lock-free. Returns count. */
int tl_shared_host_pids(const tl_shared *sh, int32_t *out, int n, int skip);

#endif
