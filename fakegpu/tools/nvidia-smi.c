/*
 * nvidia-smi - the lab's nvidia-smi, over NVML (the fake NVML of the
 * emulated GPU, with the limiter's view of it where the limiter is
 * preloaded). The forms the GPU guides use:
 *
 *   nvidia-smi                      the GPUs and their processes
 *   nvidia-smi -L                   one line per GPU with its UUID
 *   nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits]
 *        F: index, name, uuid, memory.total, memory.used, memory.free,
 *           utilization.gpu, count
 *   nvidia-smi --query-compute-apps=F,... --format=csv[,noheader][,nounits]
 *        F: pid, gpu_uuid, used_memory (also used_gpu_memory)
 *   -i N / --id=N                   only GPU N (an index or a UUID)
 *   nvidia-smi memory-limits -n CGROUP [-i N]
 *        the cgroup's memory limits on the GPUs (where the driver
 *        partitions memory): soft, hard and used, in MiB
 *   nvidia-smi memory-limits --set -n CGROUP --soft-limit MiB --hard-limit MiB [-i N]
 *        sets them (root); soft 0 and no hard limit clear them
 *
 * Anything else is refused with a message naming it (exit 2), never
 * ignored.
 */
#include <time.h>

#include "tools.h"

static struct {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*count)(unsigned *);
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *);
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned);
    nvmlReturn_t (*index)(nvmlDevice_t, unsigned *);
    nvmlReturn_t (*mem)(nvmlDevice_t, TL_NVML_MEMORY *);
    nvmlReturn_t (*util)(nvmlDevice_t, TL_NVML_UTILIZATION *);
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, void *);
    nvmlReturn_t (*set_limits)(nvmlDevice_t, TL_NVML_SET_MEMORY_LIMITS_V1 *);
    nvmlReturn_t (*get_limits)(nvmlDevice_t, TL_NVML_GET_MEMORY_LIMITS_V1 *);
} nv;

/* a _v2 process list entry: pid at 0, usedGpuMemory at 8 */
typedef struct {
    unsigned pid;
    unsigned pad;
    unsigned long long used;
    unsigned gi, ci;
} proc_v2;

static int noheader, nounits;

static void usage_exit(const char *why)
{
    fprintf(stderr,
            "nvidia-smi (tessera-lab): %s\n"
            "supported: nvidia-smi [-i N] | -L | --query-gpu=index,name,uuid,memory.total,memory.used,"
            "memory.free,utilization.gpu,count | --query-compute-apps=pid,gpu_uuid,used_memory; "
            "with --format=csv[,noheader][,nounits] | memory-limits [--set] -n CGROUP "
            "[--soft-limit MiB --hard-limit MiB] [-i N]\n",
            why);
    exit(2);
}

static void check(nvmlReturn_t r, const char *what)
{
    if (r != NVML_SUCCESS) {
        fprintf(stderr, "nvidia-smi: %s failed: NVML error %d\n", what, r);
        exit(r == NVML_ERROR_NOT_SUPPORTED ? 3 : 15);
    }
}

/* the devices to show: all, or the one -i names */
static int devices(const char *only, nvmlDevice_t *out)
{
    unsigned n = 0;
    check(nv.count(&n), "nvmlDeviceGetCount");
    if (only) {
        char *end;
        unsigned long i = strtoul(only, &end, 10);
        nvmlDevice_t d;
        if (*end == 0 && i < n && nv.by_index((unsigned)i, &d) == NVML_SUCCESS) {
            out[0] = d;
            return 1;
        }
        if (nv.by_uuid(only, &d) == NVML_SUCCESS) {
            out[0] = d;
            return 1;
        }
        fprintf(stderr, "No devices were found matching %s\n", only);
        exit(6);
    }
    if (n == 0) {
        fprintf(stderr, "No devices were found\n");
        exit(6);
    }
    for (unsigned i = 0; i < n && i < 16; i++)
        check(nv.by_index(i, &out[i]), "nvmlDeviceGetHandleByIndex");
    return n < 16 ? (int)n : 16;
}

static void mib(unsigned long long bytes)
{
    printf(nounits ? "%llu" : "%llu MiB", bytes / MiB);
}

static void query_gpu(const char *fields, nvmlDevice_t *d, int n)
{
    char *f = strdup(fields);
    char *names[16];
    int nf = 0;
    for (char *t = strtok(f, ","); t && nf < 16; t = strtok(NULL, ","))
        names[nf++] = t;
    static const char *known[] = {"index", "name", "uuid", "memory.total", "memory.used", "memory.free", "utilization.gpu", "count"};
    for (int k = 0; k < nf; k++) {
        int ok = 0;
        for (size_t j = 0; j < sizeof(known) / sizeof(known[0]); j++)
            ok |= !strcmp(names[k], known[j]);
        if (!ok) {
            char msg[200];
            snprintf(msg, sizeof(msg), "field \"%s\" of --query-gpu is not supported", names[k]);
            usage_exit(msg);
        }
    }
    if (!noheader)
        for (int k = 0; k < nf; k++) {
            const char *unit = "";
            if (!nounits && !strncmp(names[k], "memory.", 7))
                unit = " [MiB]";
            if (!nounits && !strcmp(names[k], "utilization.gpu"))
                unit = " [%]";
            printf("%s%s%s", k ? ", " : "", names[k], unit);
        }
    if (!noheader)
        printf("\n");
    for (int i = 0; i < n; i++) {
        char s[128];
        TL_NVML_MEMORY m;
        TL_NVML_UTILIZATION u;
        for (int k = 0; k < nf; k++) {
            if (k)
                printf(", ");
            const char *x = names[k];
            if (!strcmp(x, "index")) {
                unsigned idx;
                check(nv.index(d[i], &idx), "nvmlDeviceGetIndex");
                printf("%u", idx);
            } else if (!strcmp(x, "name")) {
                check(nv.name(d[i], s, sizeof(s)), "nvmlDeviceGetName");
                printf("%s", s);
            } else if (!strcmp(x, "uuid")) {
                check(nv.uuid(d[i], s, sizeof(s)), "nvmlDeviceGetUUID");
                printf("%s", s);
            } else if (!strncmp(x, "memory.", 7)) {
                check(nv.mem(d[i], &m), "nvmlDeviceGetMemoryInfo");
                mib(!strcmp(x, "memory.total") ? m.total : !strcmp(x, "memory.used") ? m.used : m.free);
            } else if (!strcmp(x, "utilization.gpu")) {
                check(nv.util(d[i], &u), "nvmlDeviceGetUtilizationRates");
                printf(nounits ? "%u" : "%u %%", u.gpu);
            } else if (!strcmp(x, "count")) {
                printf("%d", n);
            }
        }
        printf("\n");
    }
    free(f);
}

static int processes(nvmlDevice_t d, proc_v2 *p, unsigned max)
{
    unsigned n = max;
    nvmlReturn_t r = nv.procs(d, &n, p);
    if (r == NVML_ERROR_INSUFFICIENT_SIZE)
        n = max;
    else
        check(r, "nvmlDeviceGetComputeRunningProcesses");
    return (int)(n < max ? n : max);
}

static void query_apps(const char *fields, nvmlDevice_t *d, int n)
{
    char *f = strdup(fields);
    char *names[8];
    int nf = 0;
    for (char *t = strtok(f, ","); t && nf < 8; t = strtok(NULL, ","))
        names[nf++] = t;
    for (int k = 0; k < nf; k++)
        if (strcmp(names[k], "pid") && strcmp(names[k], "gpu_uuid") && strcmp(names[k], "used_memory") &&
            strcmp(names[k], "used_gpu_memory")) {
            char msg[200];
            snprintf(msg, sizeof(msg), "field \"%s\" of --query-compute-apps is not supported", names[k]);
            usage_exit(msg);
        }
    if (!noheader) {
        for (int k = 0; k < nf; k++)
            printf("%s%s%s", k ? ", " : "", names[k], !nounits && strstr(names[k], "memory") ? " [MiB]" : "");
        printf("\n");
    }
    for (int i = 0; i < n; i++) {
        proc_v2 p[256];
        char uuid[96] = "";
        nv.uuid(d[i], uuid, sizeof(uuid));
        int np = processes(d[i], p, 256);
        for (int j = 0; j < np; j++) {
            for (int k = 0; k < nf; k++) {
                if (k)
                    printf(", ");
                if (!strcmp(names[k], "pid"))
                    printf("%u", p[j].pid);
                else if (!strcmp(names[k], "gpu_uuid"))
                    printf("%s", uuid);
                else
                    mib(p[j].used);
            }
            printf("\n");
        }
    }
    free(f);
}

static void table(nvmlDevice_t *d, int n)
{
    time_t t = time(NULL);
    char when[64];
    strftime(when, sizeof(when), "%a %b %e %H:%M:%S %Y", localtime(&t));
    printf("%s\n", when);
    const char *line = "+-----------------------------------------------------------------------------------------+";
    printf("%s\n| %-87s |\n", line, "NVIDIA-SMI (tessera-lab)                   Driver: tessera-lab fake GPU");
    printf("|---------------------------------------------+------------------------+------------------|\n");
    printf("| %-43s | %22s | %16s |\n", "GPU  Name", "Memory-Usage", "GPU-Util");
    printf("|=============================================+========================+==================|\n");
    for (int i = 0; i < n; i++) {
        char name[128] = "";
        unsigned idx = (unsigned)i;
        TL_NVML_MEMORY m;
        TL_NVML_UTILIZATION u = {0, 0};
        nv.index(d[i], &idx);
        nv.name(d[i], name, sizeof(name));
        check(nv.mem(d[i], &m), "nvmlDeviceGetMemoryInfo");
        nv.util(d[i], &u);
        char usage[64];
        snprintf(usage, sizeof(usage), "%lluMiB / %lluMiB", m.used / MiB, m.total / MiB);
        printf("| %3u  %-38.38s | %22s | %15u%% |\n", idx, name, usage, u.gpu);
    }
    printf("%s\n\n%s\n", line, line);
    printf("| %-87s |\n", "Processes:");
    printf("| %4s  %10s  %4s  %63s |\n", "GPU", "PID", "Type", "GPU Memory Usage");
    printf("|=========================================================================================|\n");
    int any = 0;
    for (int i = 0; i < n; i++) {
        proc_v2 p[256];
        unsigned idx = (unsigned)i;
        nv.index(d[i], &idx);
        int np = processes(d[i], p, 256);
        for (int j = 0; j < np; j++, any = 1)
            printf("| %4u  %10u  %4s  %60lluMiB |\n", idx, p[j].pid, "C", p[j].used / MiB);
    }
    if (!any)
        printf("| %-87s |\n", " No running processes found");
    printf("%s\n", line);
}

/* nvidia-smi memory-limits: a cgroup's limits on each GPU, or --set. */
static int memory_limits(int argc, char **argv)
{
    const char *only = NULL, *cg = NULL;
    int set = 0;
    long long soft = -1, hard = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set"))
            set = 1;
        else if ((!strcmp(a, "-n") || !strcmp(a, "--cgroup")) && i + 1 < argc)
            cg = argv[++i];
        else if (!strcmp(a, "--soft-limit") && i + 1 < argc)
            soft = atoll(argv[++i]);
        else if (!strcmp(a, "--hard-limit") && i + 1 < argc)
            hard = atoll(argv[++i]);
        else if ((!strcmp(a, "-i") || !strcmp(a, "--id")) && i + 1 < argc)
            only = argv[++i];
        else {
            char msg[200];
            snprintf(msg, sizeof(msg), "memory-limits: option \"%s\" is not supported", a);
            usage_exit(msg);
        }
    }
    if (!cg)
        usage_exit("memory-limits needs -n CGROUP (the cgroup's directory)");
    if (set && (soft < 0 || hard < 0))
        usage_exit("memory-limits --set needs --soft-limit and --hard-limit (MiB; a hard limit of 0 means none)");
    nvmlDevice_t d[16];
    int n = devices(only, d);
    for (int i = 0; i < n; i++) {
        unsigned idx = (unsigned)i;
        nv.index(d[i], &idx);
        if (set) {
            TL_NVML_SET_MEMORY_LIMITS_V1 l = {cg, (unsigned long long)soft * MiB,
                                              hard ? (unsigned long long)hard * MiB : TL_NVML_MEMORY_LIMIT_MAX};
            check(nv.set_limits(d[i], &l), "nvmlDeviceSetMemoryLimits_v1");
            printf("GPU %u: memory limits of %s set\n", idx, cg);
            continue;
        }
        TL_NVML_GET_MEMORY_LIMITS_V1 l = {cg, 0, 0, 0};
        nvmlReturn_t r = nv.get_limits(d[i], &l);
        if (r == NVML_ERROR_NOT_FOUND) {
            printf("GPU %u: %s: no limits\n", idx, cg);
            continue;
        }
        check(r, "nvmlDeviceGetMemoryLimits_v1");
        if (l.hardLimit == TL_NVML_MEMORY_LIMIT_MAX)
            printf("GPU %u: %s: soft %llu MiB, hard none, used %llu MiB\n", idx, cg, l.softLimit / MiB, l.currentUsed / MiB);
        else
            printf("GPU %u: %s: soft %llu MiB, hard %llu MiB, used %llu MiB\n", idx, cg, l.softLimit / MiB,
                   l.hardLimit / MiB, l.currentUsed / MiB);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *only = NULL, *qgpu = NULL, *qapps = NULL, *format = NULL;
    int list = 0, limits = argc > 1 && !strcmp(argv[1], "memory-limits");
    for (int i = 1; i < argc && !limits; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-L") || !strcmp(a, "--list-gpus"))
            list = 1;
        else if (!strcmp(a, "-i") || !strcmp(a, "--id")) {
            if (i + 1 >= argc)
                usage_exit("-i needs a GPU index or UUID");
            only = argv[++i];
        } else if (!strncmp(a, "--id=", 5))
            only = a + 5;
        else if (!strncmp(a, "--query-gpu=", 12))
            qgpu = a + 12;
        else if (!strncmp(a, "--query-compute-apps=", 21))
            qapps = a + 21;
        else if (!strncmp(a, "--format=", 9))
            format = a + 9;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            usage_exit("the lab's nvidia-smi");
        else {
            char msg[200];
            snprintf(msg, sizeof(msg), "option \"%s\" is not supported", a);
            usage_exit(msg);
        }
    }
    if (format) {
        char *f = strdup(format);
        for (char *t = strtok(f, ","); t; t = strtok(NULL, ",")) {
            if (!strcmp(t, "noheader"))
                noheader = 1;
            else if (!strcmp(t, "nounits"))
                nounits = 1;
            else if (strcmp(t, "csv")) {
                char msg[200];
                snprintf(msg, sizeof(msg), "--format value \"%s\" is not supported", t);
                usage_exit(msg);
            }
        }
        free(f);
        if (!strstr(format, "csv"))
            usage_exit("--format must be csv");
    }
    if ((qgpu || qapps) && !format)
        usage_exit("--query-gpu and --query-compute-apps need --format=csv");

    void *h = tool_lib("libnvidia-ml.so.1", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver");
    nv.init = tool_sym(h, "nvmlInit_v2");
    nv.count = tool_sym(h, "nvmlDeviceGetCount_v2");
    nv.by_index = tool_sym(h, "nvmlDeviceGetHandleByIndex_v2");
    nv.by_uuid = tool_sym(h, "nvmlDeviceGetHandleByUUID");
    nv.name = tool_sym(h, "nvmlDeviceGetName");
    nv.uuid = tool_sym(h, "nvmlDeviceGetUUID");
    nv.index = tool_sym(h, "nvmlDeviceGetIndex");
    nv.mem = tool_sym(h, "nvmlDeviceGetMemoryInfo");
    nv.util = tool_sym(h, "nvmlDeviceGetUtilizationRates");
    nv.procs = tool_sym(h, "nvmlDeviceGetComputeRunningProcesses_v2");
    check(nv.init(), "nvmlInit");
    if (limits) {
        nv.set_limits = tool_sym(h, "nvmlDeviceSetMemoryLimits_v1");
        nv.get_limits = tool_sym(h, "nvmlDeviceGetMemoryLimits_v1");
        return memory_limits(argc, argv);
    }

    nvmlDevice_t d[16];
    int n = devices(only, d);
    if (list) {
        for (int i = 0; i < n; i++) {
            char name[128] = "", uuid[96] = "";
            unsigned idx = (unsigned)i;
            nv.index(d[i], &idx);
            check(nv.name(d[i], name, sizeof(name)), "nvmlDeviceGetName");
            check(nv.uuid(d[i], uuid, sizeof(uuid)), "nvmlDeviceGetUUID");
            printf("GPU %u: %s (UUID: %s)\n", idx, name, uuid);
        }
    } else if (qgpu)
        query_gpu(qgpu, d, n);
    else if (qapps)
        query_apps(qapps, d, n);
    else
        table(d, n);
    return 0;
}
