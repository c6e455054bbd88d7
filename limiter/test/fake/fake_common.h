/*
 * fake_common.h - what the fake libcuda.so.1 and libnvidia-ml.so.1 share:
 * the list of fake GPUs and the table through which the processes of a
 * test see each other on those GPUs. Header-only (static functions): each
 * library has its own copy of the code, the data lives in the environment
 * and in the shared table file.
 *
 * Devices (read once per process):
 *   FAKE_GPUS="UUID:SIZE[,UUID:SIZE...]"  one GPU per entry, in CUDA ordinal
 *       order; UUID as NVML prints it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx),
 *       SIZE in bytes or with a k/m/g/t suffix.
 *   otherwise FAKE_GPU_COUNT GPUs (default 2) of FAKE_GPU_MEM bytes (default
 *       16 GiB) with UUIDs GPU-fa4e0000-0000-4000-8000-0000000000<ii>.
 *   FAKE_NVML_ORDER="2,0,1": NVML index i is CUDA ordinal ORDER[i] (NVML
 *       enumerates by PCI bus, CUDA fastest first: they can differ).
 *
 * Processes (FAKE_NVML_PROCS=FILE, optional): a table mapped from FILE by
 * every process of a test. The fake libcuda publishes there the device
 * memory each process holds per GPU; the fake NVML publishes each process's
 * SM utilisation, and lists every live entry as a process on the GPU (by
 * host pid), so one process sees the others, and a GPU's free memory is
 * what all of them leave. FAKE_NVML_PID_OFFSET: NVML's (host) pid of a
 * process is getpid() + offset, as for a container with its own pid
 * namespace. FAKE_CTX_RENDEZVOUS=N: the first context creation of each
 * process waits until N processes are inside it before the process appears,
 * then until all N appear (a concurrent start, deterministically).
 * FAKE_NVML_NEIGHBOURS="HOSTPID:UTIL[:MiB],...": further processes that are
 * always on GPU 0 (ordinal 0), with fixed SM utilisation and memory.
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAXDEV 16
#define FAKE_PROCS_MAX 64

typedef struct {
    char uuid[48];          /* "GPU-..." */
    unsigned long long mem; /* bytes */
} fake_gpu;

static struct {
    int ready;
    int n;
    fake_gpu gpu[FAKE_MAXDEV];
    int nvml_order[FAKE_MAXDEV]; /* NVML index -> CUDA ordinal */
} fake_devs;

static unsigned long long fake_parse_size(const char *s, const char **end)
{
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    switch (*e) {
    case 'k': case 'K': v <<= 10; e++; break;
    case 'm': case 'M': v <<= 20; e++; break;
    case 'g': case 'G': v <<= 30; e++; break;
    case 't': case 'T': v <<= 40; e++; break;
    }
    if (end)
        *end = e;
    return v;
}

static void fake_devs_init(void)
{
    if (fake_devs.ready)
        return;
    const char *g = getenv("FAKE_GPUS");
    int n = 0;
    while (g && *g && n < FAKE_MAXDEV) {
        const char *colon = strchr(g, ':');
        if (!colon || colon - g >= (long)sizeof(fake_devs.gpu[0].uuid))
            break;
        memcpy(fake_devs.gpu[n].uuid, g, (size_t)(colon - g));
        fake_devs.gpu[n].uuid[colon - g] = 0;
        const char *e;
        fake_devs.gpu[n].mem = fake_parse_size(colon + 1, &e);
        n++;
        g = *e == ',' ? e + 1 : NULL;
    }
    if (n == 0) {
        const char *c = getenv("FAKE_GPU_COUNT"), *m = getenv("FAKE_GPU_MEM");
        n = c ? atoi(c) : 2;
        if (n < 1 || n > FAKE_MAXDEV)
            n = 2;
        unsigned long long mem = m ? fake_parse_size(m, NULL) : 16ull << 30;
        for (int i = 0; i < n; i++) {
            snprintf(fake_devs.gpu[i].uuid, sizeof(fake_devs.gpu[i].uuid),
                     "GPU-fa4e0000-0000-4000-8000-0000000000%02x", i);
            fake_devs.gpu[i].mem = mem;
        }
    }
    fake_devs.n = n;
    for (int i = 0; i < n; i++)
        fake_devs.nvml_order[i] = i;
    const char *o = getenv("FAKE_NVML_ORDER");
    for (int i = 0; o && *o && i < n; i++) {
        int v = atoi(o);
        if (v >= 0 && v < n)
            fake_devs.nvml_order[i] = v;
        o = strchr(o, ',');
        o = o ? o + 1 : NULL;
    }
    fake_devs.ready = 1;
}

static inline int fake_ndev(void)
{
    fake_devs_init();
    return fake_devs.n;
}

static inline const fake_gpu *fake_gpu_of(int ordinal)
{
    fake_devs_init();
    return ordinal >= 0 && ordinal < fake_devs.n ? &fake_devs.gpu[ordinal] : NULL;
}

/* "GPU-01234567-89ab-cdef-0123-456789abcdef" <-> 16 bytes (MIG- too). */
static inline int fake_uuid_bytes(const char *s, unsigned char out[16])
{
    if (strncmp(s, "GPU-", 4) && strncmp(s, "MIG-", 4))
        return -1;
    s += 4;
    for (int i = 0; i < 16; i++) {
        if (*s == '-')
            s++;
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1)
            return -1;
        out[i] = (unsigned char)v;
        s += 2;
    }
    return *s ? -1 : 0;
}

/* ---- the cross-process table ---- */

struct fake_proc {
    int32_t pid;      /* real pid, 0 = free */
    uint32_t host_pid;
    uint64_t used[FAKE_MAXDEV]; /* device bytes per ordinal */
    uint32_t util[FAKE_MAXDEV]; /* SM % per ordinal */
};

struct fake_procs {
    uint32_t arrived;
    uint32_t pad;
    struct fake_proc p[FAKE_PROCS_MAX];
};

static inline uint32_t fake_host_pid(int pid)
{
    const char *off = getenv("FAKE_NVML_PID_OFFSET");
    return (uint32_t)pid + (off ? (uint32_t)atoi(off) : 0u);
}

static inline struct fake_procs *fake_procs_map(void)
{
    static struct fake_procs *m;
    static int tried;
    if (tried)
        return m;
    tried = 1;
    const char *path = getenv("FAKE_NVML_PROCS");
    if (!path)
        return NULL;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, sizeof(struct fake_procs)) == 0) {
        void *p = mmap(NULL, sizeof(struct fake_procs), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED)
            m = p;
    }
    close(fd);
    return m;
}

static inline int fake_alive(int32_t pid)
{
    return pid > 0 && kill(pid, 0) == 0;
}

/* This process's entry, or NULL. */
static inline struct fake_proc *fake_proc_self(void)
{
    struct fake_procs *m = fake_procs_map();
    for (int i = 0; m && i < FAKE_PROCS_MAX; i++)
        if (__atomic_load_n(&m->p[i].pid, __ATOMIC_ACQUIRE) == getpid())
            return &m->p[i];
    return NULL;
}

static inline int fake_procs_live(struct fake_procs *m)
{
    int n = 0;
    for (int i = 0; i < FAKE_PROCS_MAX; i++)
        n += fake_alive(__atomic_load_n(&m->p[i].pid, __ATOMIC_ACQUIRE));
    return n;
}

static inline void fake_sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Called by the fake libcuda at each context creation. */
static inline void fake_proc_register(void)
{
    struct fake_procs *m = fake_procs_map();
    if (!m || fake_proc_self())
        return;
    int want = getenv("FAKE_CTX_RENDEZVOUS") ? atoi(getenv("FAKE_CTX_RENDEZVOUS")) : 0;
    if (want > 0) {
        __atomic_add_fetch(&m->arrived, 1, __ATOMIC_ACQ_REL);
        for (int i = 0; i < 1000 && __atomic_load_n(&m->arrived, __ATOMIC_ACQUIRE) < (uint32_t)want; i++)
            fake_sleep_ms(10);
    }
    for (int i = 0; i < FAKE_PROCS_MAX; i++) {
        int32_t cur = __atomic_load_n(&m->p[i].pid, __ATOMIC_ACQUIRE);
        if (cur != 0 && fake_alive(cur))
            continue;
        m->p[i].host_pid = fake_host_pid(getpid());
        memset(m->p[i].used, 0, sizeof(m->p[i].used));
        memset(m->p[i].util, 0, sizeof(m->p[i].util));
        if (__atomic_compare_exchange_n(&m->p[i].pid, &cur, (int32_t)getpid(), 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            break;
    }
    for (int i = 0; want > 0 && i < 1000 && fake_procs_live(m) < want; i++)
        fake_sleep_ms(10);
}

/* The processes other than this one on a GPU: live entries of the shared
 * table, then (GPU 0 only) FAKE_NVML_NEIGHBOURS. */
struct fake_other {
    uint32_t host_pid, util;
    uint64_t used;
};

static inline int fake_others(int ordinal, struct fake_other *o, int max)
{
    int k = 0;
    struct fake_procs *m = fake_procs_map();
    for (int i = 0; m && i < FAKE_PROCS_MAX && k < max; i++) {
        int32_t pid = __atomic_load_n(&m->p[i].pid, __ATOMIC_ACQUIRE);
        if (pid == getpid() || !fake_alive(pid))
            continue;
        uint64_t used = __atomic_load_n(&m->p[i].used[ordinal], __ATOMIC_RELAXED);
        uint32_t util = __atomic_load_n(&m->p[i].util[ordinal], __ATOMIC_RELAXED);
        if (ordinal != 0 && !used && !util)
            continue; /* the table's processes are on GPU 0 unless they use another */
        o[k].host_pid = m->p[i].host_pid;
        o[k].util = util;
        o[k++].used = used;
    }
    const char *nb = ordinal == 0 ? getenv("FAKE_NVML_NEIGHBOURS") : NULL;
    while (nb && *nb && k < max) {
        unsigned hp = 0, util = 0, mib = 1024;
        if (sscanf(nb, "%u:%u:%u", &hp, &util, &mib) < 2)
            break;
        o[k].host_pid = hp;
        o[k].util = util;
        o[k++].used = (uint64_t)mib << 20;
        nb = strchr(nb, ',');
        nb = nb ? nb + 1 : NULL;
    }
    return k;
}

/* Device memory the other processes hold on a GPU. */
static inline uint64_t fake_others_used(int ordinal)
{
    struct fake_other o[FAKE_PROCS_MAX * 2];
    int n = fake_others(ordinal, o, FAKE_PROCS_MAX * 2);
    uint64_t s = 0;
    for (int i = 0; i < n; i++)
        s += o[i].used;
    return s;
}

#endif
