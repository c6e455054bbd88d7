/*
 * fake_procs.h - the fake driver's view of the other processes on the GPU,
 * so that NVML's process lists can show more than the calling process.
 *
 * Host pids: every process's NVML pid is getpid() + FAKE_NVML_PID_OFFSET,
 * as for a container whose pid namespace is not the host's.
 * FAKE_NVML_PROCS=FILE: a table shared by the processes of a test (mapped
 * from FILE): the fake libcuda adds the process at its first context, the
 * fake NVML publishes its utilisation and memory there and lists every live
 * entry. FAKE_CTX_RENDEZVOUS=N: the first context creation of each process
 * waits until N processes are inside it before the process appears, then
 * until all N appear (a concurrent start, deterministically).
 * FAKE_NVML_NEIGHBOURS="HOSTPID:UTIL[:MiB],...": further processes that are
 * always on device 0, with fixed SM utilisation and memory.
 */
#ifndef FAKE_PROCS_H
#define FAKE_PROCS_H

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKE_PROCS_MAX 64

struct fake_proc {
    int32_t pid;      /* real pid, 0 = free */
    uint32_t host_pid;
    uint64_t used;    /* device-0 bytes */
    uint32_t util;    /* SM % */
    uint32_t pad;
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
        m->p[i].used = 0;
        m->p[i].util = 0;
        if (__atomic_compare_exchange_n(&m->p[i].pid, &cur, (int32_t)getpid(), 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            break;
    }
    for (int i = 0; want > 0 && i < 1000 && fake_procs_live(m) < want; i++)
        fake_sleep_ms(10);
}

#endif
