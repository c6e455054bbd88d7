/*
 * fake_common.h - what the fake libcuda.so.1 and libnvidia-ml.so.1 share:
 * the list of fake GPUs and the state file through which the processes
 * using a GPU see each other. Header-only (static functions): each library
 * has its own copy of the code, the data lives in the environment and in
 * the state files.
 *
 * Devices (read once per process), the first that applies:
 *   an installed driver (a real node: make e2e): R/run/fakegpu exists, R
 *       being the driver root the library was loaded from (its directory
 *       less /usr/lib[64] or /lib[64] and an architecture directory:
 *       /driver-root in the node agent, / in a container the CDI spec
 *       gave the driver's files). The GPUs are the device nodes R/dev/nvidiaN
 *       this process sees, in minor order (a container sees those its
 *       runtime made from the CDI spec); GPU N's state file is
 *       R/run/fakegpu/nvidiaN (its UUID, model, memory, written by whoever
 *       installed the driver) and the driver socket R/run/fakegpu/driver.sock.
 *       A read-only state file (the agent's read-only driver root) is read,
 *       never written.
 *   the emulated cluster: a directory FAKE_GPU_DEVICES (default
 *       /run/tessera-fakegpu, where tessera-lab's runtime mounts it into a
 *       container) holding one state file per GPU of the container, named
 *       0, 1, ... in CUDA ordinal order; each names its GPU (UUID, model,
 *       memory). The environment cannot change them.
 *   FAKE_GPUS="UUID:SIZE[,UUID:SIZE...]"  one GPU per entry, in CUDA ordinal
 *       order; UUID as NVML prints it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx),
 *       SIZE in bytes or with a k/m/g/t suffix.
 *   otherwise FAKE_GPU_COUNT GPUs (default 2) of FAKE_GPU_MEM bytes (default
 *       16 GiB) with UUIDs GPU-fa4e0000-0000-4000-8000-0000000000<ii>.
 *   FAKE_NVML_ORDER="2,0,1": NVML index i is CUDA ordinal ORDER[i] (NVML
 *       enumerates by PCI bus, CUDA fastest first: they can differ).
 *
 * Shared state (optional outside the emulated cluster: FAKE_GPU_STATE_DIR=DIR
 * makes DIR/<UUID> the state file of each GPU, created on first use): one
 * file per GPU, layout version FAKE_STATE_VERSION (struct fake_state; the Go
 * reader is tessera's internal/lab/fakegpu). A process takes a slot of a
 * GPU's file when it creates a context there and holds an OFD write lock on
 * the slot while it lives, so a slot is live exactly while its process is
 * (whatever PID namespace the process and the reader are in). The fake
 * libcuda publishes there the device memory the process holds and the GPU
 * time of the work it enqueued; a GPU's memory is shared by all of them
 * (an allocation takes the file's lock, byte 0, to check what the others
 * hold); the fake NVML lists every live slot as a process (by host pid)
 * and derives each one's utilisation from its GPU time.
 *
 * Host pids: in the emulated cluster the driver socket DIR/driver.sock
 * (beside the state files) answers a process's host pid (the runtime reads
 * it from the connection's credentials); otherwise NVML's (host) pid of a
 * process is getpid() + FAKE_NVML_PID_OFFSET, as for a container with its
 * own pid namespace. FAKE_CTX_RENDEZVOUS=N: the first context creation of
 * each process waits until N processes are inside it before the process
 * appears, then until all N appear (a concurrent start, deterministically).
 * FAKE_NVML_NEIGHBOURS="HOSTPID:UTIL[:MiB],...": further processes that are
 * always on GPU 0 (ordinal 0), with fixed SM utilisation and memory.
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAXDEV 16
/* The driver the fake stands for: what NVML and cuDriverGetVersion report
 * (CUDA 12.4 is the R550 branch's). */
#define FAKE_DRIVER_VERSION "550.163.01"
#define FAKE_CUDA_VERSION 12040
#define FAKE_LAB_DEVICES "/run/tessera-fakegpu"

/* ---- the state file of one GPU (layout version 2) ---- */
#define FAKE_STATE_MAGIC 0x55504754u /* "TGPU" */
#define FAKE_STATE_VERSION 2u
#define FAKE_STATE_SLOTS 256
#define FAKE_LIMITS 64        /* entries of the memory partitioning table (fake_limits.h) */
#define FAKE_LIMIT_PATH 256
#define FAKE_LIMIT_KEY 200
#define FAKE_FLAG_PARTITION 1u /* the driver partitions memory per cgroup */

struct fake_slot {      /* 64 bytes */
    uint32_t host_pid;  /* NVML's pid of the process (host pid namespace) */
    int32_t ns_pid;     /* its getpid(), in its own pid namespace */
    uint64_t pidns;     /* inode of its pid namespace */
    uint64_t used;      /* device bytes it holds */
    uint64_t busy_ns;   /* GPU time (run alone) of all the work it enqueued */
    uint64_t tail_ns;   /* CLOCK_MONOTONIC ns at which its queued work ends */
    uint64_t start_ns;  /* CLOCK_MONOTONIC ns at which it took the slot */
    uint32_t rate_ppm;  /* GPU time per ns of its last work, in millionths (shared GPU: < 1e6) */
    uint32_t reserved0;
    uint64_t cg;        /* fake_cg_hash of its cgroup v2 path, 0 = none */
};

/* One cgroup's memory limits on the GPU (fake_limits.h). */
struct fake_limit {           /* 512 bytes */
    char path[FAKE_LIMIT_PATH]; /* the cgroup's directory, as Set named it; "" = free */
    char key[FAKE_LIMIT_KEY];   /* the same cgroup as /proc/<pid>/cgroup names it */
    uint64_t soft, hard;        /* bytes; hard TL_NVML_MEMORY_LIMIT_MAX = none */
    uint32_t crossings;         /* allocations that took it past its soft limit */
    uint32_t pressure;          /* its allocations within the soft limit the GPU could not hold while another was above its own */
    uint32_t leaked;            /* its cgroup went away while its soft limit was set */
    uint32_t reserved0;
    uint64_t reserved[3];
};

struct fake_state {     /* header: 256 bytes, then the slots, then the limits */
    uint32_t magic;     /* FAKE_STATE_MAGIC */
    uint32_t version;   /* FAKE_STATE_VERSION */
    uint32_t header_size, slot_size, slots;
    uint32_t arrived;   /* FAKE_CTX_RENDEZVOUS */
    uint64_t memory;    /* bytes */
    uint32_t sms;
    uint32_t flags;     /* FAKE_FLAG_PARTITION */
    char uuid[48];
    char name[96];
    uint32_t limit_size, limits;
    uint8_t reserved[64];
    struct fake_slot slot[FAKE_STATE_SLOTS];
    struct fake_limit limit[FAKE_LIMITS];
};
_Static_assert(sizeof(struct fake_slot) == 64, "fake_slot layout");
_Static_assert(sizeof(struct fake_limit) == 512, "fake_limit layout");
_Static_assert(__builtin_offsetof(struct fake_state, slot) == 256, "fake_state header layout");
_Static_assert(__builtin_offsetof(struct fake_state, limit) == 256 + 64 * FAKE_STATE_SLOTS, "fake_state limits layout");

typedef struct {
    char uuid[48];          /* "GPU-..." */
    char name[96];          /* "" outside the emulated cluster */
    unsigned long long mem; /* bytes */
} fake_gpu;

static struct {
    int ready;
    int n;
    fake_gpu gpu[FAKE_MAXDEV];
    int nvml_order[FAKE_MAXDEV]; /* NVML index -> CUDA ordinal */
    char lab[256];               /* the emulated cluster's device directory, or "" */
    char state_dir[256];         /* FAKE_GPU_STATE_DIR, or "" */
} fake_devs;

/* This process's view of a GPU's state file. */
static struct fake_shared {
    int fd;               /* -1: none */
    struct fake_state *m;
    int self;             /* the slot this process holds (libcuda), or -1 */
    int owner;            /* getpid() when it was taken (a forked child has none) */
} fake_sh[FAKE_MAXDEV];

static int fake_state_open(int ord, const char *path, int create);
static void fake_gpu_from_state(int ord);

/* The driver root this library was loaded from (see the top): its
 * directory less the library directory; 0, or -1 when it lies in none. */
static int fake_driver_root(char *root, size_t size)
{
    Dl_info info;
    if (!dladdr((void *)fake_driver_root, &info) || !info.dli_fname || info.dli_fname[0] != '/')
        return -1;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    *slash = 0;
    static const char *const libdirs[] = {"/usr/lib64", "/usr/lib", "/lib64", "/lib"};
    for (int k = 0; k < 2; k++) { /* the directory, then its parent (an architecture directory) */
        size_t n = strlen(dir);
        for (size_t i = 0; i < sizeof(libdirs) / sizeof(libdirs[0]); i++) {
            size_t l = strlen(libdirs[i]);
            if (n >= l && !strcmp(dir + n - l, libdirs[i])) {
                dir[n - l] = 0;
                if (strlen(dir) >= size)
                    return -1;
                snprintf(root, size, "%s", dir[0] ? dir : "/");
                return 0;
            }
        }
        if (!(slash = strrchr(dir, '/')) || slash == dir)
            break;
        *slash = 0;
    }
    return -1;
}

static int fake_cmp_uint(const void *a, const void *b)
{
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    return x < y ? -1 : x > y;
}

/* An installed driver's GPUs (see the top): their count, or -1 when no
 * driver is installed where this library lies. */
static int fake_installed_devs(void)
{
    char root[192], state[208], path[512];
    struct stat st;
    if (fake_driver_root(root, sizeof(root)) != 0)
        return -1;
    const char *sep = strcmp(root, "/") ? "/" : "";
    snprintf(state, sizeof(state), "%s%srun/fakegpu", root, sep);
    if (stat(state, &st) != 0 || !S_ISDIR(st.st_mode))
        return -1;
    snprintf(fake_devs.lab, sizeof(fake_devs.lab), "%s", state);
    unsigned minors[FAKE_MAXDEV];
    int n = 0;
    snprintf(path, sizeof(path), "%s%sdev", root, sep);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d)) && n < FAKE_MAXDEV;) {
        const char *p = e->d_name;
        if (strncmp(p, "nvidia", 6) || !p[6] || strspn(p + 6, "0123456789") != strlen(p + 6))
            continue;
        snprintf(path, sizeof(path), "%s%sdev/%s", root, sep, p);
        if (stat(path, &st) == 0 && S_ISCHR(st.st_mode))
            minors[n++] = minor(st.st_rdev);
    }
    if (d)
        closedir(d);
    qsort(minors, (size_t)n, sizeof(minors[0]), fake_cmp_uint);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/nvidia%u", state, minors[i]);
        if (fake_state_open(i, path, 0) != 0)
            return 0; /* reported; no GPU rather than a wrong one */
        fake_gpu_from_state(i);
    }
    return n;
}

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
    for (int i = 0; i < FAKE_MAXDEV; i++) {
        fake_sh[i].fd = -1;
        fake_sh[i].self = -1;
    }
    const char *lab = getenv("FAKE_GPU_DEVICES");
    if (!lab || !*lab)
        lab = FAKE_LAB_DEVICES;
    char path[320];
    snprintf(path, sizeof(path), "%s/0", lab);
    int installed = fake_installed_devs();
    int n = installed > 0 ? installed : 0;
    if (installed >= 0) {
        /* an installed driver: its device nodes and state files */
    } else if (access(path, F_OK) == 0) {
        /* the emulated cluster: the container's GPUs are its state files */
        snprintf(fake_devs.lab, sizeof(fake_devs.lab), "%s", lab);
        for (; n < FAKE_MAXDEV; n++) {
            snprintf(path, sizeof(path), "%s/%d", lab, n);
            if (access(path, F_OK) != 0)
                break;
            if (fake_state_open(n, path, 0) != 0) {
                n = 0; /* reported; no GPU rather than a wrong one */
                break;
            }
            fake_gpu_from_state(n);
        }
    } else {
        const char *g = getenv("FAKE_GPUS");
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
        const char *sd = getenv("FAKE_GPU_STATE_DIR");
        if (sd && *sd) {
            snprintf(fake_devs.state_dir, sizeof(fake_devs.state_dir), "%s", sd);
            mkdir(sd, 0777);
            for (int i = 0; i < n; i++) {
                snprintf(path, sizeof(path), "%s/%s", sd, fake_devs.gpu[i].uuid);
                fake_state_open(i, path, 1);
            }
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

/* GPU ord as its state file names it. */
static void fake_gpu_from_state(int ord)
{
    const struct fake_state *m = fake_sh[ord].m;
    memcpy(fake_devs.gpu[ord].uuid, m->uuid, sizeof(fake_devs.gpu[ord].uuid));
    fake_devs.gpu[ord].uuid[sizeof(fake_devs.gpu[ord].uuid) - 1] = 0;
    memcpy(fake_devs.gpu[ord].name, m->name, sizeof(fake_devs.gpu[ord].name));
    fake_devs.gpu[ord].name[sizeof(fake_devs.gpu[ord].name) - 1] = 0;
    fake_devs.gpu[ord].mem = m->memory;
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

/* ---- the state files ---- */

static inline uint64_t fake_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void fake_sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static inline off_t fake_slot_off(int i)
{
    return (off_t)__builtin_offsetof(struct fake_state, slot) + (off_t)i * (off_t)sizeof(struct fake_slot);
}

/* An OFD lock (fcntl F_OFD_*): held by an open file description, released
 * when the last descriptor of it closes, whatever process or namespace. */
static inline int fake_lock(int fd, int cmd, short type, off_t start, off_t len)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    int r;
    do
        r = fcntl(fd, cmd, &fl);
    while (r < 0 && errno == EINTR);
    return r;
}

/* Whether slot i's process lives: someone (another open file description)
 * holds its lock. */
static inline int fake_slot_live(int fd, int i)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = fake_slot_off(i);
    fl.l_len = (off_t)sizeof(struct fake_slot);
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return 0;
    return fl.l_type != F_UNLCK;
}

static int fake_state_open(int ord, const char *path, int create)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    int prot = PROT_READ | PROT_WRITE;
    if (fd < 0 && !create && (errno == EROFS || errno == EACCES)) {
        fd = open(path, O_RDONLY | O_CLOEXEC); /* a reader: NVML in the node agent */
        prot = PROT_READ;
    }
    if (fd < 0) {
        fprintf(stderr, "fake GPU: cannot open the GPU state file %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int bad = 0;
    if (create) {
        /* the first process to come writes the header */
        fake_lock(fd, F_OFD_SETLKW, F_WRLCK, 0, 1);
        if (fstat(fd, &st) == 0 && st.st_size == 0) {
            struct fake_state h;
            memset(&h, 0, __builtin_offsetof(struct fake_state, slot));
            h.magic = FAKE_STATE_MAGIC;
            h.version = FAKE_STATE_VERSION;
            h.header_size = (uint32_t)__builtin_offsetof(struct fake_state, slot);
            h.slot_size = sizeof(struct fake_slot);
            h.slots = FAKE_STATE_SLOTS;
            h.limit_size = sizeof(struct fake_limit);
            h.limits = FAKE_LIMITS;
            h.memory = fake_devs.gpu[ord].mem;
            if (getenv("FAKE_NVML_PARTITIONING") && !strcmp(getenv("FAKE_NVML_PARTITIONING"), "1"))
                h.flags |= FAKE_FLAG_PARTITION;
            snprintf(h.uuid, sizeof(h.uuid), "%s", fake_devs.gpu[ord].uuid);
            bad = ftruncate(fd, (off_t)sizeof(struct fake_state)) != 0 ||
                  pwrite(fd, &h, h.header_size, 0) != (ssize_t)h.header_size;
        }
        fake_lock(fd, F_OFD_SETLK, F_UNLCK, 0, 1);
    }
    uint32_t hdr[3] = {0, 0, 0};
    if (!bad && (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(struct fake_state) ||
                 pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)))
        bad = 1;
    if (bad || hdr[0] != FAKE_STATE_MAGIC || hdr[1] != FAKE_STATE_VERSION ||
        hdr[2] != __builtin_offsetof(struct fake_state, slot)) {
        fprintf(stderr, "fake GPU: %s is not a GPU state file of layout version %u (magic %#x, version %u)\n",
                path, FAKE_STATE_VERSION, hdr[0], hdr[1]);
        close(fd);
        return -1;
    }
    void *m = mmap(NULL, sizeof(struct fake_state), prot, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return -1;
    }
    fake_sh[ord].fd = fd;
    fake_sh[ord].m = m;
    return 0;
}

/* The state of a GPU, or NULL when there is none (no shared state). */
static inline struct fake_shared *fake_shared_of(int ord)
{
    fake_devs_init();
    return ord >= 0 && ord < fake_devs.n && fake_sh[ord].m ? &fake_sh[ord] : NULL;
}

static inline int fake_shared_any(void)
{
    fake_devs_init();
    return fake_devs.lab[0] || fake_devs.state_dir[0];
}

static inline uint64_t fake_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* FNV-1a of a cgroup as its processes see it: a slot's fake_slot.cg. */
static inline uint64_t fake_cg_hash(const char *key)
{
    uint64_t h = 1469598103934665603ull;
    for (; *key; key++)
        h = (h ^ (unsigned char)*key) * 1099511628211ull;
    return h ? h : 1;
}

/* This process's cgroup v2 path ("/a/b", from the "0::" line of
 * /proc/self/cgroup), "" when it has none. Read once per process. */
static inline const char *fake_self_cgroup(void)
{
    static char cg[FAKE_LIMIT_KEY];
    static int for_pid;
    if (for_pid == getpid())
        return cg;
    cg[0] = 0;
    FILE *f = fopen("/proc/self/cgroup", "re");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "0::", 3) != 0)
            continue;
        line[strcspn(line, "\n")] = 0;
        if (strlen(line + 3) < sizeof(cg))
            snprintf(cg, sizeof(cg), "%s", line + 3);
        break;
    }
    if (f)
        fclose(f);
    for_pid = getpid();
    return cg;
}

static inline uint64_t fake_self_cg_hash(void)
{
    const char *cg = fake_self_cgroup();
    return cg[0] ? fake_cg_hash(cg) : 0;
}

/* This process's host pid: asked from the emulated cluster's driver
 * socket, else getpid() + FAKE_NVML_PID_OFFSET. */
static inline uint32_t fake_self_host_pid(void)
{
    static uint32_t hp;
    static int for_pid;
    if (hp && for_pid == getpid())
        return hp;
    fake_devs_init();
    uint32_t v = 0;
    size_t dl = strlen(fake_devs.lab);
    struct sockaddr_un a;
    if (dl && dl + sizeof("/driver.sock") <= sizeof(a.sun_path)) {
        memset(&a, 0, sizeof(a));
        a.sun_family = AF_UNIX;
        memcpy(a.sun_path, fake_devs.lab, dl);
        memcpy(a.sun_path + dl, "/driver.sock", sizeof("/driver.sock"));
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
            char buf[32];
            ssize_t r = read(s, buf, sizeof(buf) - 1);
            if (r > 0) {
                buf[r] = 0;
                v = (uint32_t)strtoul(buf, NULL, 10);
            }
        }
        if (s >= 0)
            close(s);
    }
    if (!v) {
        const char *off = getenv("FAKE_NVML_PID_OFFSET");
        v = (uint32_t)getpid() + (off ? (uint32_t)atoi(off) : 0u);
    }
    hp = v;
    for_pid = getpid();
    return hp;
}

/* Whether slot t is this process's. */
static inline int fake_slot_is_self(const struct fake_slot *t)
{
    static uint64_t ns;
    if (!ns)
        ns = fake_pidns();
    return __atomic_load_n(&t->ns_pid, __ATOMIC_ACQUIRE) == getpid() && t->pidns == ns;
}

/* This process's slot on a GPU, or NULL. */
static inline struct fake_slot *fake_slot_self(int ord)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (!s)
        return NULL;
    if (s->self >= 0 && s->owner == getpid())
        return &s->m->slot[s->self];
    for (int i = 0; i < FAKE_STATE_SLOTS; i++)
        if (fake_slot_is_self(&s->m->slot[i]) && fake_slot_live(s->fd, i))
            return &s->m->slot[i];
    return NULL;
}

static inline int fake_live_count(struct fake_shared *s)
{
    int n = 0;
    for (int i = 0; i < FAKE_STATE_SLOTS; i++)
        n += (s->m->slot[i].ns_pid != 0 && fake_slot_live(s->fd, i)) || (s->self == i && s->owner == getpid());
    return n;
}

/* Called by the fake libcuda at each context creation on a GPU: take a slot
 * there (once per process), publishing `used` bytes already held. */
static inline void fake_state_register(int ord, uint64_t used)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (!s)
        return;
    if (s->self >= 0 && s->owner == getpid())
        return;
    if (s->self >= 0) {
        /* a forked child: its descriptor shares the parent's lock */
        char path[320];
        snprintf(path, sizeof(path), "/proc/self/fd/%d", s->fd);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return;
        close(s->fd);
        s->fd = fd;
        s->self = -1;
    }
    struct fake_state *m = s->m;
    int want = getenv("FAKE_CTX_RENDEZVOUS") ? atoi(getenv("FAKE_CTX_RENDEZVOUS")) : 0;
    if (want > 0) {
        __atomic_add_fetch(&m->arrived, 1, __ATOMIC_ACQ_REL);
        for (int i = 0; i < 1000 && __atomic_load_n(&m->arrived, __ATOMIC_ACQUIRE) < (uint32_t)want; i++)
            fake_sleep_ms(10);
    }
    for (int i = 0; i < FAKE_STATE_SLOTS; i++) {
        if (fake_lock(s->fd, F_OFD_SETLK, F_WRLCK, fake_slot_off(i), (off_t)sizeof(struct fake_slot)) != 0)
            continue; /* a live process holds it */
        struct fake_slot *t = &m->slot[i];
        __atomic_store_n(&t->ns_pid, 0, __ATOMIC_RELEASE);
        t->host_pid = fake_self_host_pid();
        t->pidns = fake_pidns();
        __atomic_store_n(&t->cg, fake_self_cg_hash(), __ATOMIC_RELAXED);
        __atomic_store_n(&t->used, used, __ATOMIC_RELAXED);
        t->busy_ns = 0;
        t->tail_ns = 0;
        t->start_ns = fake_mono_ns();
        __atomic_store_n(&t->ns_pid, (int32_t)getpid(), __ATOMIC_RELEASE);
        s->self = i;
        s->owner = getpid();
        break;
    }
    for (int i = 0; want > 0 && i < 1000 && fake_live_count(s) < want; i++)
        fake_sleep_ms(10);
}

/* The GPU's allocation lock: what the processes hold changes under it. */
static inline void fake_state_lock(int ord)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (s)
        fake_lock(s->fd, F_OFD_SETLKW, F_WRLCK, 0, 1);
}

static inline void fake_state_unlock(int ord)
{
    struct fake_shared *s = fake_shared_of(ord);
    if (s)
        fake_lock(s->fd, F_OFD_SETLK, F_UNLCK, 0, 1);
}

/* The processes other than this one on a GPU: live slots of its state
 * file, then (GPU 0 only) FAKE_NVML_NEIGHBOURS. `slot` is the slot index,
 * -1 for a neighbour. */
struct fake_other {
    uint32_t host_pid, util;
    uint64_t used, busy_ns, tail_ns, start_ns;
    uint32_t rate_ppm;
    int slot;
};

static inline int fake_others(int ord, struct fake_other *o, int max)
{
    int k = 0;
    struct fake_shared *s = fake_shared_of(ord);
    for (int i = 0; s && i < FAKE_STATE_SLOTS && k < max; i++) {
        struct fake_slot *t = &s->m->slot[i];
        if (__atomic_load_n(&t->ns_pid, __ATOMIC_ACQUIRE) == 0 || (s->self == i && s->owner == getpid()) ||
            fake_slot_is_self(t) || !fake_slot_live(s->fd, i))
            continue;
        o[k].host_pid = t->host_pid;
        o[k].util = 0;
        o[k].used = __atomic_load_n(&t->used, __ATOMIC_RELAXED);
        o[k].busy_ns = __atomic_load_n(&t->busy_ns, __ATOMIC_RELAXED);
        o[k].tail_ns = __atomic_load_n(&t->tail_ns, __ATOMIC_RELAXED);
        o[k].start_ns = t->start_ns;
        o[k].rate_ppm = __atomic_load_n(&t->rate_ppm, __ATOMIC_RELAXED);
        o[k++].slot = i;
    }
    const char *nb = ord == 0 ? getenv("FAKE_NVML_NEIGHBOURS") : NULL;
    while (nb && *nb && k < max) {
        unsigned hp = 0, util = 0, mib = 1024;
        if (sscanf(nb, "%u:%u:%u", &hp, &util, &mib) < 2)
            break;
        memset(&o[k], 0, sizeof(o[k]));
        o[k].host_pid = hp;
        o[k].util = util;
        o[k].used = (uint64_t)mib << 20;
        o[k++].slot = -1;
        nb = strchr(nb, ',');
        nb = nb ? nb + 1 : NULL;
    }
    return k;
}

#define FAKE_OTHERS_MAX (FAKE_STATE_SLOTS + 64)

/* Device memory the other processes hold on a GPU. */
static inline uint64_t fake_others_used(int ord)
{
    struct fake_other o[FAKE_OTHERS_MAX];
    int n = fake_others(ord, o, FAKE_OTHERS_MAX);
    uint64_t s = 0;
    for (int i = 0; i < n; i++)
        s += o[i].used;
    return s;
}

/* GPU time (run alone) of the work an other process has done by now_ns:
 * its queued work runs without a gap until its tail. */
static inline uint64_t fake_other_done(const struct fake_other *o, uint64_t now_ns)
{
    if (o->tail_ns <= now_ns)
        return o->busy_ns;
    uint64_t left = (uint64_t)((double)(o->tail_ns - now_ns) * (o->rate_ppm ? o->rate_ppm : 1000000u) / 1e6);
    return left < o->busy_ns ? o->busy_ns - left : 0;
}

/* Other processes with work queued on a GPU now (they share its time). */
static inline int fake_others_busy(int ord, uint64_t now_ns)
{
    struct fake_shared *s = fake_shared_of(ord);
    int n = 0;
    for (int i = 0; s && i < FAKE_STATE_SLOTS; i++) {
        struct fake_slot *t = &s->m->slot[i];
        if (__atomic_load_n(&t->ns_pid, __ATOMIC_ACQUIRE) == 0 || (s->self == i && s->owner == getpid()) ||
            __atomic_load_n(&t->tail_ns, __ATOMIC_RELAXED) <= now_ns || fake_slot_is_self(t) ||
            !fake_slot_live(s->fd, i))
            continue;
        n++;
    }
    return n;
}

#endif
