/*
 * fake_nvml.c - a stand-in libnvidia-ml.so.1 for the limiter's tests and
 * the emulated cluster, over the same fake GPUs as the fake libcuda
 * (fake_common.h: the lab's state files, or FAKE_GPUS or FAKE_GPU_COUNT x
 * FAKE_GPU_MEM; NVML enumeration order FAKE_NVML_ORDER). NVML names
 * processes by host pid (fake_self_host_pid).
 *
 * What it reports, per GPU:
 *   name         the model in the GPU's state file, else "Tessera Fake GPU N"
 *   memory       total = the GPU's size; used = what this process holds
 *                through the fake libcuda (when loaded) plus what the other
 *                processes of the GPU's state file and the neighbours hold
 *   processes    this process while it holds a context, the other live
 *                processes of the state file and (GPU 0)
 *                FAKE_NVML_NEIGHBOURS, each with its usedGpuMemory; the same
 *                list for graphics and MPS queries
 *   utilisation  per process: this process's share of GPU time since the
 *                last query, from the fake GPU's execution log (fake_gpu.c;
 *                simulated time when FAKE_SIM=1), the others' from the GPU
 *                time they publish in the state file, the neighbours'
 *                fixed; device: their sum, or 100 % with
 *                FAKE_GPU_NEIGHBOUR=1 (a saturating neighbour on GPU 0)
 *
 * What the node agent asks besides (discovery, health, node labels):
 *   driver      FAKE_DRIVER_VERSION, CUDA FAKE_CUDA_VERSION
 *   PCI         bus 00000000:<0x10 + NVML index>:00.0, NVIDIA's vendor ID
 *   compute     capability from the model (8.0 Ampere, 9.0 Hopper, 10.0
 *               Blackwell); no MIG mode, no NVLink, no NUMA node, no
 *               topology (NOT_SUPPORTED, as many drivers answer)
 *   events      an event set that never fires: a wait sleeps its timeout
 *   errors      nvmlErrorString's names
 *
 * Failure knobs: FAKE_NVML_FAIL=1 (nvmlInit fails), FAKE_NVML_MEM_FAIL=1
 * (memory info fails), FAKE_NVML_NO_PROCLIST=1 (process lists not
 * supported), FAKE_NVML_NO_V3=1 (only the _v2 and v1 lists) or =2 (only
 * v1), FAKE_NVML_V3_STRIDE=32 (the _v3 list has 32-byte entries, as in the
 * drivers that added usedGpuCcProtectedMemory), FAKE_NVML_SPARSE=1 (every
 * other utilisation query has no new sample), FAKE_NVML_UTIL_SCALE=f (the
 * process's own SM % reported f times its busy fraction), FAKE_NVML_LAG=1 (utilisation
 * is reported one query late), FAKE_NVML_SLICED=1 (the process's own SM %
 * reads 99 whenever it had work, as a real GPU time-sliced with a neighbour
 * reports it: run 2, H200; list the neighbour with FAKE_NVML_NEIGHBOURS).
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "fake_api.h"
#include "fake_common.h"
#include "fake_limits.h"

#define EXPORT __attribute__((visibility("default")))
#define FAKE_NVML_ERROR_TIMEOUT 10

static struct fake_nvdev {
    unsigned idx; /* NVML index */
    int ord;      /* CUDA ordinal (fake_common.h) */
} devs[FAKE_MAXDEV];
static int inited;

static struct fake_nvdev *dev_of(nvmlDevice_t d)
{
    struct fake_nvdev *f = d;
    return inited && f >= devs && f < devs + fake_ndev() ? f : NULL;
}

/* The fake libcuda's view of this process, when it is loaded. */
static void *cuda(const char *name)
{
    return dlsym(RTLD_DEFAULT, name);
}

static unsigned long long own_used(int ord)
{
    unsigned long long (*f)(int) = (unsigned long long (*)(int))cuda("fake_used_bytes");
    return f ? f(ord) : 0;
}

static int own_ctx(void)
{
    int (*f)(void) = (int (*)(void))cuda("fake_ctx_live");
    return f ? f() : 0;
}

static double now_s(void)
{
    double (*f)(void) = (double (*)(void))cuda("fake_now");
    if (f)
        return f();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static nvmlReturn_t init(void)
{
    if (getenv("FAKE_NVML_FAIL"))
        return NVML_ERROR_UNKNOWN;
    fake_devs_init();
    for (int i = 0; i < fake_ndev(); i++) {
        devs[i].idx = (unsigned)i;
        devs[i].ord = fake_devs.nvml_order[i];
    }
    inited = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)fake_ndev();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if ((int)i >= fake_ndev() || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < fake_ndev(); i++)
        if (!strcasecmp(fake_gpu_of(devs[i].ord)->uuid, uuid)) {
            *d = &devs[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !i)
        return NVML_ERROR_INVALID_ARGUMENT;
    *i = f->idx;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int n)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !s)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *u = fake_gpu_of(f->ord)->uuid;
    if (strlen(u) >= n)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(s, n, "%s", u);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int n)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !s || !n)
        return NVML_ERROR_INVALID_ARGUMENT;
    const fake_gpu *g = fake_gpu_of(f->ord);
    if (g->name[0])
        snprintf(s, n, "%s", g->name);
    else
        snprintf(s, n, "Tessera Fake GPU %d", f->ord);
    return NVML_SUCCESS;
}

/* ---- memory ---- */

static void mem(struct fake_nvdev *f, unsigned long long *total, unsigned long long *used,
                unsigned long long *freep)
{
    unsigned long long t = fake_gpu_of(f->ord)->mem, u = own_used(f->ord) + fake_others_used(f->ord);
    *total = t;
    *used = u < t ? u : t;
    *freep = t - *used;
    uint64_t hard, cg;
    if (fake_limits_self(f->ord, &hard, &cg)) {
        /* the calling process's cgroup's share, as the driver reports it */
        uint64_t left = cg < hard ? hard - cg : 0;
        *total = hard < t ? hard : t;
        *used = cg < *total ? cg : *total;
        *freep = left < *freep ? left : *freep;
    }
}

/* ---- memory partitioning (fake_limits.h) ---- */

EXPORT nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t d, TL_NVML_SET_MEMORY_LIMITS_V1 *l)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !l)
        return NVML_ERROR_INVALID_ARGUMENT;
    return fake_limits_set(f->ord, l->nameSpace, l->softLimit, l->hardLimit);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t d, TL_NVML_GET_MEMORY_LIMITS_V1 *l)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !l)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t soft = 0, hard = 0, used = 0;
    nvmlReturn_t r = fake_limits_get(f->ord, l->nameSpace, &soft, &hard, &used);
    if (r == NVML_SUCCESS) {
        l->softLimit = soft;
        l->hardLimit = hard;
        l->currentUsed = used;
    }
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, TL_NVML_MEMORY *m)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (getenv("FAKE_NVML_MEM_FAIL"))
        return NVML_ERROR_UNKNOWN;
    mem(f, &m->total, &m->used, &m->free);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, TL_NVML_MEMORY_V2 *m)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (getenv("FAKE_NVML_MEM_FAIL"))
        return NVML_ERROR_UNKNOWN;
    m->reserved = 0;
    mem(f, &m->total, &m->used, &m->free);
    return NVML_SUCCESS;
}

/* ---- utilisation ---- */

static struct {
    double last_t;
    unsigned util, prev;
    unsigned calls;
} us[FAKE_MAXDEV];

/* This process's SM utilisation on f since the last query (an NVML
 * sample), published in the shared table for the other processes. */
static unsigned own_util(struct fake_nvdev *f)
{
    double (*busy)(int, double, double) = (double (*)(int, double, double))cuda("fake_busy");
    double t = now_s();
    int o = f->ord;
    if (us[o].last_t > 0 && t - us[o].last_t > 0.02) {
        double u = busy ? 100.0 * busy(o, us[o].last_t, t) / (t - us[o].last_t) : 0;
        us[o].prev = us[o].util;
        us[o].util = u > 100 ? 100 : (unsigned)(u + 0.5);
        us[o].last_t = t;
    } else if (us[o].last_t == 0) {
        us[o].last_t = t;
    }
    unsigned v = getenv("FAKE_NVML_LAG") ? us[o].prev : us[o].util;
    const char *sc = getenv("FAKE_NVML_UTIL_SCALE");
    if (sc && *sc) { /* NVML's per-process SM % as a fraction of busy time (a real GPU's may differ) */
        double x = v * atof(sc);
        v = x > 100 ? 100 : (unsigned)(x + 0.5);
    }
    const char *sl = getenv("FAKE_NVML_SLICED");
    if (sl && *sl == '1' && v > 0)
        v = 99; /* a GPU time-sliced between contexts: ~99 % for whichever one is sampled */
    return v;
}

/* The other processes of a GPU, with each one's utilisation since the
 * last query (from the GPU time it published). */
static struct {
    uint64_t start_ns, done_ns, t_ns;
    unsigned util;
} seen[FAKE_MAXDEV][FAKE_STATE_SLOTS];

static int others(int ord, struct fake_other *o, int max)
{
    int n = fake_others(ord, o, max);
    uint64_t now = fake_mono_ns();
    for (int i = 0; i < n; i++) {
        if (o[i].slot < 0)
            continue; /* a neighbour: fixed */
        __typeof__(&seen[0][0]) p = &seen[ord][o[i].slot];
        uint64_t done = fake_other_done(&o[i], now);
        if (p->start_ns != o[i].start_ns) { /* a process new to us: busy now or not */
            p->start_ns = o[i].start_ns;
            p->done_ns = done;
            p->t_ns = now;
            p->util = o[i].tail_ns > now ? (o[i].rate_ppm ? o[i].rate_ppm : 1000000u) / 10000u : 0;
        } else if (now - p->t_ns > 20000000ull) {
            double u = 100.0 * (double)(done - p->done_ns) / (double)(now - p->t_ns);
            p->util = u > 100 ? 100 : (unsigned)(u + 0.5);
            p->done_ns = done;
            p->t_ns = now;
        }
        o[i].util = p->util;
    }
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, TL_NVML_PROC_UTIL_SAMPLE *s,
                                                    unsigned int *n, unsigned long long last_seen)
{
    (void)last_seen;
    struct fake_nvdev *f = dev_of(d);
    if (!n || !f)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!s && getenv("FAKE_NVML_SPARSE") && (us[f->ord].calls++ & 1)) {
        *n = 0; /* no new sample, as when NVML samples less often than the limiter asks */
        return NVML_SUCCESS;
    }
    struct fake_other o[FAKE_OTHERS_MAX];
    int no = others(f->ord, o, FAKE_OTHERS_MAX);
    unsigned need = 1 + (unsigned)no;
    if (!s || *n < need) {
        *n = need;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long ts = (unsigned long long)(now_s() * 1e6);
    memset(s, 0, sizeof(*s) * need);
    s[0].pid = fake_self_host_pid();
    s[0].timeStamp = ts;
    s[0].smUtil = own_util(f);
    for (int i = 0; i < no; i++) {
        s[1 + i].pid = o[i].host_pid;
        s[1 + i].timeStamp = ts;
        s[1 + i].smUtil = o[i].util;
    }
    *n = need;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, TL_NVML_PROCS_UTIL_INFO *info)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_other o[FAKE_OTHERS_MAX];
    int no = others(f->ord, o, FAKE_OTHERS_MAX);
    unsigned need = 1 + (unsigned)no;
    if (!info->procUtilArray || info->processSamplesCount < need) {
        info->processSamplesCount = need;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long ts = (unsigned long long)(now_s() * 1e6);
    TL_NVML_PROC_UTIL_INFO *a = info->procUtilArray;
    memset(a, 0, sizeof(*a) * need);
    a[0].pid = fake_self_host_pid();
    a[0].timeStamp = ts;
    a[0].smUtil = own_util(f);
    for (int i = 0; i < no; i++) {
        a[1 + i].pid = o[i].host_pid;
        a[1 + i].timeStamp = ts;
        a[1 + i].smUtil = o[i].util;
    }
    info->processSamplesCount = need;
    info->lastSeenTimeStamp = ts;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, TL_NVML_UTILIZATION *u)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !u)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned sum = us[f->ord].util;
    struct fake_other o[FAKE_OTHERS_MAX];
    int no = others(f->ord, o, FAKE_OTHERS_MAX);
    for (int i = 0; i < no; i++)
        sum += o[i].util;
    const char *nb = getenv("FAKE_GPU_NEIGHBOUR");
    if (nb && *nb == '1' && f->ord == 0)
        sum = 100;
    u->gpu = sum > 100 ? 100 : sum;
    u->memory = 0;
    return NVML_SUCCESS;
}

/* ---- process lists ---- */

struct entry {
    uint32_t pid;
    uint64_t used;
};

/* This process while it holds a context, then the others. */
static int procs(struct fake_nvdev *f, struct entry *e, int max)
{
    int n = 0;
    struct fake_slot *me = fake_slot_self(f->ord);
    if (me || own_ctx() > 0) {
        e[n].pid = fake_self_host_pid();
        e[n++].used = own_used(f->ord);
    }
    struct fake_other o[FAKE_OTHERS_MAX];
    int no = fake_others(f->ord, o, FAKE_OTHERS_MAX);
    for (int i = 0; i < no && n < max; i++) {
        e[n].pid = o[i].host_pid;
        e[n++].used = o[i].used;
    }
    return n;
}

/* `stride`: the size of the caller's entries: pid at 0, usedGpuMemory at
 * 8, the rest (instance ids 0xFFFFFFFF: no MIG) zero. */
static nvmlReturn_t running(nvmlDevice_t d, unsigned int *n, void *infos, size_t stride)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !n)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (getenv("FAKE_NVML_NO_PROCLIST"))
        return NVML_ERROR_NOT_SUPPORTED;
    struct entry e[FAKE_OTHERS_MAX + 1];
    int ne = procs(f, e, FAKE_OTHERS_MAX + 1);
    if (*n < (unsigned)ne || (ne && !infos)) {
        *n = (unsigned)ne;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < ne; i++) {
        unsigned char *p = (unsigned char *)infos + (size_t)i * stride;
        memset(p, 0, stride);
        memcpy(p, &e[i].pid, 4);
        memcpy(p + 8, &e[i].used, 8);
        if (stride >= 24)
            memset(p + 16, 0xff, 8);
    }
    *n = (unsigned)ne;
    return NVML_SUCCESS;
}

static size_t v3_stride(void)
{
    const char *s = getenv("FAKE_NVML_V3_STRIDE");
    return s && atoi(s) == 32 ? 32 : 24;
}

static int no_v3(void) { return getenv("FAKE_NVML_NO_V3") != NULL; }
static int only_v1(void)
{
    const char *no = getenv("FAKE_NVML_NO_V3");
    return no && *no == '2';
}

#define LISTS(kind)                                                                                 \
    EXPORT nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses_v3(nvmlDevice_t d, unsigned int *n, void *i) \
    {                                                                                               \
        return no_v3() ? NVML_ERROR_FUNCTION_NOT_FOUND : running(d, n, i, v3_stride());            \
    }                                                                                               \
    EXPORT nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses_v2(nvmlDevice_t d, unsigned int *n, void *i) \
    {                                                                                               \
        return only_v1() ? NVML_ERROR_FUNCTION_NOT_FOUND : running(d, n, i, TL_PROCINFO_V2);       \
    }                                                                                               \
    EXPORT nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses(nvmlDevice_t d, unsigned int *n, void *i) \
    {                                                                                               \
        return running(d, n, i, TL_PROCINFO_V1);                                                    \
    }
LISTS(Compute)
LISTS(Graphics)
LISTS(MPSCompute)

EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, TL_NVML_PROC_DETAIL_LIST *l)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !l)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct entry e[FAKE_OTHERS_MAX + 1];
    int ne = procs(f, e, FAKE_OTHERS_MAX + 1);
    if (!l->procArray || l->numProcArrayEntries < (unsigned)ne) {
        l->numProcArrayEntries = (unsigned)ne;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < ne; i++) {
        memset(&l->procArray[i], 0, sizeof(l->procArray[i]));
        l->procArray[i].pid = e[i].pid;
        l->procArray[i].usedGpuMemory = e[i].used;
        l->procArray[i].gpuInstanceId = l->procArray[i].computeInstanceId = 0xffffffffu;
    }
    l->numProcArrayEntries = (unsigned)ne;
    return NVML_SUCCESS;
}

/* ---- the system ---- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n)
{
    if (!v || n <= strlen(FAKE_DRIVER_VERSION))
        return v ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_ERROR_INVALID_ARGUMENT;
    snprintf(v, n, "%s", FAKE_DRIVER_VERSION);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = FAKE_CUDA_VERSION;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case FAKE_NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    }
    return "Unknown Error";
}

/* ---- what the node agent reads of a GPU ---- */

/* nvmlPciInfo_t, as NVML documents it. */
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} fake_pci_info;

#define FAKE_PCI_VENDOR_NVIDIA 0x10deu

static nvmlReturn_t pci(nvmlDevice_t d, fake_pci_info *p)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !p)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(p, 0, sizeof(*p));
    p->bus = 0x10 + f->idx;
    p->pciDeviceId = FAKE_PCI_VENDOR_NVIDIA;
    snprintf(p->busId, sizeof(p->busId), "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "0000:%02X:00.0", p->bus);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, fake_pci_info *p) { return pci(d, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, fake_pci_info *p) { return pci(d, p); }

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    *m = f->idx;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    struct fake_nvdev *f = dev_of(d);
    if (!f || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *name = fake_gpu_of(f->ord)->name;
    *minor = 0;
    if (strstr(name, "B200") || strstr(name, "GB200"))
        *major = 10;
    else if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H20"))
        *major = 9;
    else
        *major = 8;
    return NVML_SUCCESS;
}

static nvmlReturn_t not_supported(nvmlDevice_t d)
{
    return dev_of(d) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *n)
{
    (void)n;
    return not_supported(d);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending)
{
    (void)cur, (void)pending;
    return not_supported(d);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, void *a)
{
    (void)a;
    return not_supported(d);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active)
{
    (void)link, (void)active;
    return not_supported(d);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, fake_pci_info *p)
{
    (void)link, (void)p;
    return not_supported(d);
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level)
{
    (void)b, (void)level;
    return not_supported(a);
}

/* ---- events: a set that never fires ---- */

static int event_set; /* the one set's address is the handle */

EXPORT nvmlReturn_t nvmlEventSetCreate(void **set)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    *set = &event_set;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(void *set) { return set == &event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT; }

#define FAKE_EVENT_XID 0x8ull /* nvmlEventTypeXidCriticalError */

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
    if (!dev_of(d) || !types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = FAKE_EVENT_XID;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, void *set)
{
    (void)types;
    return dev_of(d) && set == &event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(void *set, void *data, unsigned int timeout_ms)
{
    if (set != &event_set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec ts = {(time_t)(timeout_ms / 1000), (long)(timeout_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return FAKE_NVML_ERROR_TIMEOUT;
}
