/* tl_hostpid.c - see tl_hostpid.h. */
#include "tl_hostpid.h"

#include <stdlib.h>
#include <string.h>

uint32_t tl_hp_parse_nspid(const char *status)
{
    const char *p = status;
    while (p && *p) {
        if (!strncmp(p, "NSpid:", 6)) {
            p += 6;
            char *end;
            unsigned long first = strtoul(p, &end, 10);
            if (end == p)
                return 0;
            p = end;
            while (*p == ' ' || *p == '\t')
                p++;
            /* a second number: more than one level is visible */
            if (*p < '0' || *p > '9' || first == 0 || first > 0x7fffffff)
                return 0;
            return (uint32_t)first;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return 0;
}

void tl_hp_init(tl_hostpid *h)
{
    memset(h, 0, sizeof(*h));
    h->ncand = -1;
}

void tl_hp_before(tl_hostpid *h, const tl_gpu_proc *list, int n)
{
    h->nbefore = 0;
    for (int i = 0; i < n && h->nbefore < TL_HP_MAX; i++)
        h->before[h->nbefore++] = list[i].pid;
    h->have_before = 1;
    h->ncand = -1;
    h->tries = 0;
}

static int has(const uint32_t *set, int n, uint32_t pid)
{
    for (int i = 0; i < n; i++)
        if (set[i] == pid)
            return 1;
    return 0;
}

static const tl_gpu_proc *find(const tl_gpu_proc *list, int n, uint32_t pid)
{
    for (int i = 0; i < n; i++)
        if (list[i].pid == pid)
            return &list[i];
    return NULL;
}

static uint64_t absdiff(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

uint32_t tl_hp_observe(tl_hostpid *h, const tl_gpu_proc *list, int n, const uint32_t *excl, int nexcl,
                       uint32_t nspid, uint64_t known)
{
    if (h->resolved)
        return h->resolved;
    if (nspid && find(list, n, nspid) && !has(excl, nexcl, nspid)) {
        h->resolved = nspid;
        h->how = "NSpid";
        return nspid;
    }
    if (!h->have_before)
        return 0; /* no context creation seen: nothing to go by */
    /* Candidates now: pids that were not there before our first context
     * and are not the container's other processes. */
    uint32_t now[TL_HP_MAX];
    int nn = 0;
    for (int i = 0; i < n && nn < TL_HP_MAX; i++)
        if (list[i].pid && !has(h->before, h->nbefore, list[i].pid) && !has(excl, nexcl, list[i].pid) &&
            !has(now, nn, list[i].pid))
            now[nn++] = list[i].pid;
    h->tries++;
    int fresh = h->ncand < 0;
    if (fresh) {
        memcpy(h->cand, now, (size_t)nn * sizeof(now[0]));
        h->ncand = nn;
        h->how = "context-creation diff";
    } else {
        int k = 0;
        for (int i = 0; i < h->ncand; i++)
            if (has(now, nn, h->cand[i]))
                h->cand[k++] = h->cand[i];
        h->ncand = k;
        h->how = "candidates intersected over time";
    }
    if (h->ncand == 0) {
        /* Right after the creation NVML may not list us yet: try the next
         * few lists. Later, an empty set means we are not listed at all
         * (no context left): pids that appear from now on are others'. */
        h->ncand = -1;
        if (!fresh || h->tries >= 10)
            h->have_before = 0;
        return 0;
    }
    if (h->ncand == 1) {
        h->resolved = h->cand[0];
        return h->resolved;
    }
    /* Several: the one whose usedGpuMemory matches what we accounted,
     * if exactly one is close and every other is clearly farther. */
    if (known) {
        uint64_t tol = known / 8 > (32ull << 20) ? known / 8 : (32ull << 20);
        int best = -1, close = 0, far = 1;
        uint64_t bestd = UINT64_MAX;
        for (int i = 0; i < h->ncand; i++) {
            const tl_gpu_proc *p = find(list, n, h->cand[i]);
            if (!p || p->used == UINT64_MAX)
                return 0;
            uint64_t d = absdiff(p->used, known);
            if (d <= tol)
                close++;
            if (d < bestd) {
                bestd = d;
                best = i;
            }
        }
        for (int i = 0; i < h->ncand; i++) {
            const tl_gpu_proc *p = find(list, n, h->cand[i]);
            if (i != best && absdiff(p->used, known) <= 2 * tol)
                far = 0;
        }
        if (close == 1 && far && best >= 0) {
            h->resolved = h->cand[best];
            h->how = "usedGpuMemory match";
            return h->resolved;
        }
    }
    return 0;
}
