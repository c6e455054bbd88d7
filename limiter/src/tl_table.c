/*
 * tl_table.c - open-addressing hash table (linear probing, backward-shift
 * deletion so no tombstones), guarded by a process-local mutex. Only the
 * allocation and free paths use it.
 */
#include "tl_compat.h"

#include "tl_table.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    uint64_t key;   /* 0 = empty slot */
    uint64_t size;
    uint64_t aux;
    int32_t kind;
    int32_t dev;
} entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry *tab;
static uint64_t cap, count;

static uint64_t hash(int kind, uint64_t key)
{
    uint64_t h = key ^ ((uint64_t)kind << 56);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static int grow(void)
{
    uint64_t ncap = cap ? cap * 2 : 1024;
    entry *n = calloc(ncap, sizeof(entry));
    if (!n)
        return -1;
    for (uint64_t i = 0; i < cap; i++) {
        if (!tab[i].key)
            continue;
        uint64_t j = hash(tab[i].kind, tab[i].key) & (ncap - 1);
        while (n[j].key)
            j = (j + 1) & (ncap - 1);
        n[j] = tab[i];
    }
    free(tab);
    tab = n;
    cap = ncap;
    return 0;
}

/* A zero key (NULL pointer, handle 0) is never a live allocation and is
 * used to mark empty slots, so it is rejected. */
int tl_table_put(int kind, uint64_t key, uint64_t size, int dev)
{
    return tl_table_put_aux(kind, key, size, dev, 0);
}

int tl_table_put_aux(int kind, uint64_t key, uint64_t size, int dev, uint64_t aux)
{
    if (!key)
        return -1;
    pthread_mutex_lock(&mu);
    if ((count + 1) * 2 > cap && grow() != 0) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    uint64_t j = hash(kind, key) & (cap - 1);
    while (tab[j].key && !(tab[j].key == key && tab[j].kind == kind))
        j = (j + 1) & (cap - 1);
    if (!tab[j].key)
        count++;
    tab[j].key = key;
    tab[j].kind = kind;
    tab[j].size = size;
    tab[j].dev = dev;
    tab[j].aux = aux;
    pthread_mutex_unlock(&mu);
    return 0;
}

int tl_table_take(int kind, uint64_t key, uint64_t *size, int *dev)
{
    return tl_table_take_aux(kind, key, size, dev, NULL);
}

int tl_table_take_aux(int kind, uint64_t key, uint64_t *size, int *dev, uint64_t *aux)
{
    if (!key)
        return 0;
    pthread_mutex_lock(&mu);
    if (!cap) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    uint64_t m = cap - 1, j = hash(kind, key) & m;
    while (tab[j].key && !(tab[j].key == key && tab[j].kind == kind))
        j = (j + 1) & m;
    if (!tab[j].key) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    if (size)
        *size = tab[j].size;
    if (dev)
        *dev = tab[j].dev;
    if (aux)
        *aux = tab[j].aux;
    /* backward-shift deletion */
    uint64_t i = j;
    for (;;) {
        tab[i].key = 0;
        uint64_t k = i;
        for (;;) {
            k = (k + 1) & m;
            if (!tab[k].key) {
                count--;
                pthread_mutex_unlock(&mu);
                return 1;
            }
            uint64_t home = hash(tab[k].kind, tab[k].key) & m;
            /* can tab[k] move into hole i? yes if home is not in (i, k] cyclically */
            if (i <= k ? (home <= i || home > k) : (home <= i && home > k))
                break;
        }
        tab[i] = tab[k];
        i = k;
    }
}

int tl_table_get(int kind, uint64_t key, uint64_t *size, int *dev)
{
    return tl_table_get_aux(kind, key, size, dev, NULL);
}

int tl_table_get_aux(int kind, uint64_t key, uint64_t *size, int *dev, uint64_t *aux)
{
    if (!key)
        return 0;
    pthread_mutex_lock(&mu);
    int found = 0;
    if (cap) {
        uint64_t m = cap - 1, j = hash(kind, key) & m;
        while (tab[j].key && !(tab[j].key == key && tab[j].kind == kind))
            j = (j + 1) & m;
        if (tab[j].key) {
            if (size)
                *size = tab[j].size;
            if (dev)
                *dev = tab[j].dev;
            if (aux)
                *aux = tab[j].aux;
            found = 1;
        }
    }
    pthread_mutex_unlock(&mu);
    return found;
}

void tl_table_reset(void)
{
    pthread_mutex_lock(&mu);
    free(tab);
    tab = NULL;
    cap = count = 0;
    pthread_mutex_unlock(&mu);
}

void tl_table_reset_after_fork(void)
{
    pthread_mutex_init(&mu, NULL);
    tab = NULL; /* the parent's copy is left behind, deliberately */
    cap = count = 0;
}

uint64_t tl_table_count(void)
{
    pthread_mutex_lock(&mu);
    uint64_t n = count;
    pthread_mutex_unlock(&mu);
    return n;
}
