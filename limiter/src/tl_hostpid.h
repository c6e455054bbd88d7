/*
 * tl_hostpid.h - finding this process's pid as NVML reports it (the pid in
 * the host's pid namespace) from inside a container, where getpid() gives
 * the container's pid. Pure functions, no I/O (tested in test_units.c).
 *
 * NVML lists the processes holding a context on a device. The list is read
 * just before this process's first context on the device is created and
 * again right after: a pid that appeared is a candidate for ours. Pids the
 * other processes of the container have published (shared state) are not
 * ours. Later lists, read while we still hold a context, must contain our
 * pid, so the candidates are intersected with each of them. Left with
 * several, the device memory this process has accounted is compared with
 * each candidate's usedGpuMemory. One candidate left: resolved.
 */
#ifndef TL_HOSTPID_H
#define TL_HOSTPID_H

#include <stdint.h>

#define TL_HP_MAX 256 /* processes per device considered */

typedef struct tl_gpu_proc {
    uint32_t pid;
    uint64_t used; /* usedGpuMemory, bytes; UINT64_MAX = not available */
} tl_gpu_proc;

typedef struct tl_hostpid {
    uint32_t resolved;   /* 0 = not yet */
    const char *how;     /* how it was resolved, for the debug message */
    int have_before;     /* the list before our first context was read */
    int nbefore;
    uint32_t before[TL_HP_MAX];
    int tries;           /* lists seen since the first context was created */
    int ncand;           /* -1 = no candidate set yet */
    uint32_t cand[TL_HP_MAX];
} tl_hostpid;

/* Outermost pid from the text of /proc/self/status ("NSpid:\t7\t1"), or 0
 * when NSpid is missing or shows one level only (then /proc belongs to our
 * own pid namespace and says nothing about the host). */
uint32_t tl_hp_parse_nspid(const char *status);

void tl_hp_init(tl_hostpid *h);

/* The list read just before the first context creation. */
void tl_hp_before(tl_hostpid *h, const tl_gpu_proc *list, int n);

/* A list read while this process holds a context on the device (right
 * after creating it, then at sampling periods). `excl`: host pids of the
 * container's other processes. `nspid`: outermost pid from NSpid, 0 if
 * none; accepted when the list contains it. `known`: bytes of device
 * memory this process has accounted there, 0 if unknown. Returns the
 * resolved pid, or 0. When the candidates run out (we are not in the
 * list: no context any more, or a wrong guess), have_before is cleared:
 * only a new context creation (a new `before` list) can start over. */
uint32_t tl_hp_observe(tl_hostpid *h, const tl_gpu_proc *list, int n, const uint32_t *excl, int nexcl,
                       uint32_t nspid, uint64_t known);

#endif
