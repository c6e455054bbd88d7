/*
 * fake_limits.h - the fake driver's memory partitioning per cgroup, as
 * NVIDIA's r615 driver offers it (nvmlDeviceSetMemoryLimits_v1 /
 * nvmlDeviceGetMemoryLimits_v1, NVIDIA's MPS guide, "MPS v3 memory
 * partitioning"): a cgroup's soft limit (memory guaranteed to it) and
 * hard limit (an allocation past it fails with out-of-memory). Shared by
 * the fake libcuda (enforcement, cuMemGetInfo) and the fake NVML (the two
 * calls, memory info); header-only, after fake_common.h.
 *
 * The table lives in each GPU's state file (FAKE_LIMITS entries after the
 * slots), so every process of the GPU and the node's agent (its emulated
 * NVML writes the same entries, tessera's internal/lab/fakegpu) see one
 * driver. Whether the GPU "supports partitioning" is the header's
 * FAKE_FLAG_PARTITION, set when the state file is created (the lab's node
 * mode; FAKE_NVML_PARTITIONING=1 with FAKE_GPU_STATE_DIR); without it both
 * calls answer NVML_ERROR_NOT_SUPPORTED, as an older driver does.
 *
 * Semantics:
 *   - Set names the cgroup by its directory under the cgroup2 mount (the
 *     "sysfs path", NVML's nameSpace); the entry also keeps the cgroup as
 *     its processes see it in /proc/self/cgroup ("0::/a/b"), by which a
 *     process finds its own limits: keyed by the calling process's own
 *     cgroup, never by an environment variable. Only the processes in that
 *     cgroup itself are limited (a container's leaf; dmem's hierarchy is
 *     not emulated). Soft 0 and hard TL_NVML_MEMORY_LIMIT_MAX clear the
 *     entry; soft above hard, or a hard limit above the GPU, is
 *     NVML_ERROR_INVALID_ARGUMENT; a path that is not a directory of a
 *     cgroup2 mount NVML_ERROR_OPERATING_SYSTEM; not root
 *     NVML_ERROR_NO_PERMISSION.
 *   - An allocation that would take the cgroup's processes past the hard
 *     limit fails; one that crosses the soft limit counts a crossing; one
 *     of a cgroup within its soft limit that the GPU cannot hold while
 *     another cgroup is above its soft limit counts pressure (what MPS
 *     would evict on). cuMemGetInfo and NVML's memory info report the
 *     hard limit as the total, and what is left of it as free.
 *   - A cgroup removed while its soft limit is 0 takes its entry with it
 *     ("removing the cgroup clears its limits"); removed while the soft
 *     limit is set, the entry stays, marked leaked: the guide's ancestor
 *     reservation that outlives a leaf whose soft limit was not zeroed.
 */
#ifndef FAKE_LIMITS_H
#define FAKE_LIMITS_H

#include <sys/statfs.h>

#include "tl_cuda.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

/* The key of a cgroup directory (a path under a cgroup2 mount of this
 * process's mount namespace): the cgroup as /proc/<pid>/cgroup names it.
 * 0, or -1 when path is under no cgroup2 mount. */
static inline int fake_cgroup_key(const char *path, char *key, size_t n)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[1024];
    int found = -1;
    size_t best = 0;
    while (f && fgets(line, sizeof(line), f)) {
        /* id parent major:minor root mountpoint options... - fstype source ... */
        char root[256], mnt[256];
        const char *sep = strstr(line, " - ");
        if (!sep || strncmp(sep + 3, "cgroup2 ", 8) != 0)
            continue;
        if (sscanf(line, "%*s %*s %*s %255s %255s", root, mnt) != 2)
            continue;
        size_t ml = strlen(mnt);
        if (strncmp(path, mnt, ml) != 0 || (path[ml] != '/' && path[ml] != 0) || ml < best)
            continue;
        const char *rest = path + ml;
        const char *base = strcmp(root, "/") == 0 ? "" : root;
        if ((size_t)snprintf(key, n, "%s%s", base, *rest ? rest : (*base ? "" : "/")) >= n)
            continue;
        best = ml;
        found = 0;
    }
    if (f)
        fclose(f);
    return found;
}

/* The live (not leaked) entry of a cgroup, or NULL. */
static inline struct fake_limit *fake_limit_of(struct fake_state *m, const char *key)
{
    for (int i = 0; i < FAKE_LIMITS; i++)
        if (m->limit[i].key[0] && !m->limit[i].leaked && strcmp(m->limit[i].key, key) == 0)
            return &m->limit[i];
    return NULL;
}

/* Device memory the live processes of a cgroup hold on a GPU (the slots
 * whose cgroup hash is the key's; this process's own slot included). */
static inline uint64_t fake_cgroup_used(struct fake_shared *s, const char *key)
{
    uint64_t h = fake_cg_hash(key), sum = 0;
    for (int i = 0; i < FAKE_STATE_SLOTS; i++) {
        struct fake_slot *t = &s->m->slot[i];
        if (__atomic_load_n(&t->ns_pid, __ATOMIC_ACQUIRE) == 0 || __atomic_load_n(&t->cg, __ATOMIC_RELAXED) != h)
            continue;
        if ((s->self == i && s->owner == getpid()) || fake_slot_live(s->fd, i))
            sum += __atomic_load_n(&t->used, __ATOMIC_RELAXED);
    }
    return sum;
}

/* Entries whose cgroup is gone: cleared when their soft limit is 0, kept
 * and marked leaked otherwise. With the state file's lock held. */
static inline void fake_limits_sweep(struct fake_state *m)
{
    for (int i = 0; i < FAKE_LIMITS; i++) {
        struct fake_limit *l = &m->limit[i];
        if (!l->key[0] || l->leaked)
            continue;
        struct stat st;
        if (stat(l->path, &st) == 0)
            continue;
        if (l->soft == 0)
            memset(l, 0, sizeof(*l));
        else
            l->leaked = 1;
    }
}

/* What an allocation of n bytes by this process on GPU ord may do under
 * its cgroup's limits: 0 fine, -1 over the hard limit. `self_used` is what
 * this process holds there now (its slot may not be published yet), and
 * `fits` whether the GPU itself has room. Counts crossings and pressure.
 * With the state file's lock held. */
static inline int fake_limits_admit(int ord, uint64_t self_used, uint64_t n, int fits)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (!s || !(s->m->flags & FAKE_FLAG_PARTITION))
        return 0;
    const char *key = fake_self_cgroup();
    struct fake_limit *l = key[0] ? fake_limit_of(s->m, key) : NULL;
    if (!l)
        return 0;
    struct fake_slot *me = fake_slot_self(ord);
    uint64_t used = fake_cgroup_used(s, key);
    if (me)
        used -= __atomic_load_n(&me->used, __ATOMIC_RELAXED) < used ? __atomic_load_n(&me->used, __ATOMIC_RELAXED) : used;
    used += self_used;
    if (used > l->hard || n > l->hard - used)
        return -1;
    if (!fits && used + n <= l->soft) {
        for (int i = 0; i < FAKE_LIMITS; i++) {
            struct fake_limit *o = &s->m->limit[i];
            if (o != l && o->key[0] && !o->leaked && fake_cgroup_used(s, o->key) > o->soft) {
                l->pressure++;
                break;
            }
        }
    }
    if (fits && used <= l->soft && used + n > l->soft)
        l->crossings++;
    return 0;
}

/* The hard limit of this process's cgroup on GPU ord and what its
 * processes hold (for cuMemGetInfo and NVML's memory info); 0 when none. */
static inline int fake_limits_self(int ord, uint64_t *hard, uint64_t *used)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (!s || !(s->m->flags & FAKE_FLAG_PARTITION))
        return 0;
    const char *key = fake_self_cgroup();
    if (!key[0])
        return 0;
    fake_state_lock(ord);
    struct fake_limit *l = fake_limit_of(s->m, key);
    int have = l && l->hard != TL_NVML_MEMORY_LIMIT_MAX;
    if (have) {
        *hard = l->hard;
        *used = fake_cgroup_used(s, key);
    }
    fake_state_unlock(ord);
    return have;
}

/* nvmlDeviceSetMemoryLimits_v1 on GPU ord (see the top of this file). */
static inline nvmlReturn_t fake_limits_set(int ord, const char *path, uint64_t soft, uint64_t hard)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (!s || !(s->m->flags & FAKE_FLAG_PARTITION))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!path)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    if (soft > hard || (hard != TL_NVML_MEMORY_LIMIT_MAX && hard > s->m->memory) || strlen(path) >= FAKE_LIMIT_PATH)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct statfs sf;
    struct stat st;
    char key[FAKE_LIMIT_KEY];
    if (statfs(path, &sf) != 0 || (unsigned long)sf.f_type != CGROUP2_SUPER_MAGIC || stat(path, &st) != 0 ||
        !S_ISDIR(st.st_mode) || fake_cgroup_key(path, key, sizeof(key)) != 0)
        return NVML_ERROR_OPERATING_SYSTEM;
    nvmlReturn_t r = NVML_SUCCESS;
    fake_state_lock(ord);
    fake_limits_sweep(s->m);
    struct fake_limit *l = fake_limit_of(s->m, key);
    if (soft == 0 && hard == TL_NVML_MEMORY_LIMIT_MAX) {
        if (l)
            memset(l, 0, sizeof(*l)); /* cleared */
    } else {
        for (int i = 0; !l && i < FAKE_LIMITS; i++)
            if (!s->m->limit[i].key[0])
                l = &s->m->limit[i];
        if (l) {
            if (strcmp(l->key, key) != 0) {
                memset(l, 0, sizeof(*l));
                snprintf(l->path, sizeof(l->path), "%s", path);
                snprintf(l->key, sizeof(l->key), "%s", key);
            }
            l->soft = soft;
            l->hard = hard;
        } else {
            r = NVML_ERROR_UNKNOWN; /* the table is full */
        }
    }
    fake_state_unlock(ord);
    return r;
}

/* nvmlDeviceGetMemoryLimits_v1 on GPU ord. */
static inline nvmlReturn_t fake_limits_get(int ord, const char *path, uint64_t *soft, uint64_t *hard, uint64_t *used)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (!s || !(s->m->flags & FAKE_FLAG_PARTITION))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!path)
        return NVML_ERROR_INVALID_ARGUMENT;
    char key[FAKE_LIMIT_KEY];
    struct stat st;
    if (stat(path, &st) != 0 || fake_cgroup_key(path, key, sizeof(key)) != 0)
        return NVML_ERROR_OPERATING_SYSTEM;
    fake_state_lock(ord);
    fake_limits_sweep(s->m);
    struct fake_limit *l = fake_limit_of(s->m, key);
    if (l) {
        *soft = l->soft;
        *hard = l->hard;
        *used = fake_cgroup_used(s, key);
    }
    fake_state_unlock(ord);
    return l ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

#endif
