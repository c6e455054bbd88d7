/*
 * gpu-fill - the lab's demo workload, a CUDA driver-API program: it prints
 * what cuMemGetInfo says about its GPU, then allocates device memory in
 * steps (1 GiB by default) until the driver refuses, then what cuMemGetInfo
 * says is left, then one MiB more (refused: the limit is where
 * cuMemGetInfo says). It can then keep the GPU busy and hold what it got,
 * so that a neighbour, nvidia-smi or the node see it. With --devices it
 * fills the first N GPUs the driver lists (0: all of them), one after the
 * other, and holds them all: the lab's stand-in for a workload of N GPUs.
 *
 *   gpu-fill [--device N | --devices N] [--step MiB] [--max MiB] [--busy SECONDS] [--hold SECONDS|forever]
 *
 * Exit status: 0 when it stopped at a refusal or at --max, 1 when the
 * driver failed otherwise, 2 for a bad argument, 9 with no driver.
 */
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "tools.h"

static volatile sig_atomic_t stop;
static void on_stop(int sig)
{
    (void)sig;
    stop = 1;
}

static void usage(void)
{
    fprintf(stderr, "usage: gpu-fill [--device N | --devices N] [--step MiB] [--max MiB] [--busy SECONDS] [--hold SECONDS|forever]\n");
    exit(2);
}

static long number(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || n < lo || n > hi) {
        fprintf(stderr, "gpu-fill: %s %s: want an integer from %ld to %ld\n", flag, v ? v : "(missing)", lo, hi);
        exit(2);
    }
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The driver's entry points gpu-fill uses. */
static CUresult (*init)(unsigned);
static CUresult (*count)(int *);
static CUresult (*get)(CUdevice *, int);
static CUresult (*name)(char *, int, CUdevice);
static CUresult (*uuid)(unsigned char *, CUdevice);
static CUresult (*retain)(CUcontext *, CUdevice);
static CUresult (*setcur)(CUcontext);
static CUresult (*info)(size_t *, size_t *);
static CUresult (*alloc)(CUdeviceptr *, size_t);

/* fill allocates on GPU dev in steps until the driver refuses or max, then
 * what is left and one MiB more; it adds what it got to *got and returns
 * 0, or 1 when the driver failed otherwise. */
static int fill(int dev, long step, long max, unsigned long long *got)
{
    CUdevice d;
    CUresult r = get(&d, dev);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "gpu-fill: no GPU %d: %s (%d)\n", dev, cu_error_name(r), r);
        return 1;
    }
    char nm[128] = "", us[41] = "";
    unsigned char u[16];
    name(nm, sizeof(nm), d);
    if (uuid(u, d) == CUDA_SUCCESS)
        uuid_string(u, strstr(nm, " MIG ") ? "MIG" : "GPU", us); /* NVML's names of MIG devices */
    CUcontext ctx;
    if ((r = retain(&ctx, d)) != CUDA_SUCCESS || (r = setcur(ctx)) != CUDA_SUCCESS) {
        fprintf(stderr, "gpu-fill: no context on GPU %d: %s (%d)\n", dev, cu_error_name(r), r);
        return 1;
    }
    size_t freeb = 0, total = 0;
    if ((r = info(&freeb, &total)) != CUDA_SUCCESS) {
        fprintf(stderr, "gpu-fill: cuMemGetInfo: %s (%d)\n", cu_error_name(r), r);
        return 1;
    }
    printf("gpu-fill: GPU %d %s (%s)\n", dev, nm, us);
    printf("cuMemGetInfo: total %llu MiB, free %llu MiB\n", (unsigned long long)total / MiB, (unsigned long long)freeb / MiB);

    unsigned long long mine = 0;
    int refused = 0;
    while (!stop && (!max || mine + (unsigned long long)step <= (unsigned long long)max)) {
        CUdeviceptr p;
        r = alloc(&p, (size_t)step * MiB);
        if (r != CUDA_SUCCESS) {
            printf("refused at %llu MiB: %ld MiB more gave %s (%d)\n", mine, step, cu_error_name(r), r);
            refused = 1;
            break;
        }
        mine += (unsigned long long)step;
        printf("allocated %ld MiB (%llu MiB in total)\n", step, mine);
    }
    if (!refused && !stop)
        printf("stopped at --max: %llu MiB allocated\n", mine);
    if (info(&freeb, &total) == CUDA_SUCCESS)
        printf("cuMemGetInfo: total %llu MiB, free %llu MiB\n", (unsigned long long)total / MiB, (unsigned long long)freeb / MiB);
    if (refused && !stop) {
        /* what is left, then one MiB more: the refusal is at the limit */
        unsigned long long left = (unsigned long long)freeb / MiB;
        CUdeviceptr p;
        if (left > 0) {
            r = alloc(&p, (size_t)(left * MiB));
            if (r == CUDA_SUCCESS) {
                mine += left;
                printf("allocated the %llu MiB left (%llu MiB in total)\n", left, mine);
            } else {
                printf("the %llu MiB cuMemGetInfo calls free: %s (%d)\n", left, cu_error_name(r), r);
            }
        }
        r = alloc(&p, (size_t)MiB);
        if (r == CUDA_SUCCESS) {
            mine += 1;
            printf("1 MiB more: allocated, though cuMemGetInfo said %llu MiB were free\n", left);
        } else {
            printf("1 MiB more: %s (%d)\n", cu_error_name(r), r);
        }
    }
    *got += mine;
    return 0;
}

int main(int argc, char **argv)
{
    int dev = 0, devices = -1;
    long step = 1024, max = 0, busy = 0, hold = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device"))
            dev = (int)number(a, v, 0, 15), i++;
        else if (!strcmp(a, "--devices"))
            devices = (int)number(a, v, 0, 16), i++;
        else if (!strcmp(a, "--step"))
            step = number(a, v, 1, 1L << 24), i++;
        else if (!strcmp(a, "--max"))
            max = number(a, v, 1, 1L << 30), i++;
        else if (!strcmp(a, "--busy"))
            busy = number(a, v, 0, 1L << 30), i++;
        else if (!strcmp(a, "--hold")) {
            hold = v && !strcmp(v, "forever") ? -1 : number(a, v, 0, 1L << 30);
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            usage();
        else {
            fprintf(stderr, "gpu-fill: unknown argument %s\n", a);
            usage();
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);

    void *cu = tool_lib("libcuda.so.1", "gpu-fill: no CUDA driver");
    init = tool_sym(cu, "cuInit");
    count = tool_sym(cu, "cuDeviceGetCount");
    get = tool_sym(cu, "cuDeviceGet");
    name = tool_sym(cu, "cuDeviceGetName");
    uuid = tool_sym(cu, "cuDeviceGetUuid");
    retain = tool_sym(cu, "cuDevicePrimaryCtxRetain");
    setcur = tool_sym(cu, "cuCtxSetCurrent");
    info = tool_sym(cu, "cuMemGetInfo_v2");
    alloc = tool_sym(cu, "cuMemAlloc_v2");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **) = tool_sym(cu, "cuLaunchKernel");
    CUresult (*sync)(void) = tool_sym(cu, "cuCtxSynchronize");

    CUresult r = init(0);
    int n = 0;
    if (r == CUDA_SUCCESS)
        r = count(&n);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "gpu-fill: no GPU: %s (%d)\n", cu_error_name(r), r);
        return 1;
    }
    int first = dev, last = dev;
    if (devices >= 0) {
        first = 0;
        last = (devices == 0 || devices > n ? n : devices) - 1;
        printf("gpu-fill: GPUs 0 to %d of the %d the driver lists\n", last, n);
    }
    unsigned long long got = 0;
    for (int i = first; i <= last && !stop; i++)
        if (fill(i, step, max, &got))
            return 1;
    if (busy > 0) {
        printf("keeping the GPU busy for %ld s\n", busy);
        double end = now_s() + (double)busy;
        while (!stop && now_s() < end) {
            /* the fake driver runs 1000 blocks in 10 ms of GPU time */
            if ((r = launch((CUfunction)0, 1000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL)) != CUDA_SUCCESS) {
                fprintf(stderr, "gpu-fill: cuLaunchKernel: %s (%d)\n", cu_error_name(r), r);
                return 1;
            }
            sync();
        }
    }
    if (hold) {
        if (hold < 0)
            printf("holding %llu MiB until stopped\n", got);
        else
            printf("holding %llu MiB for %ld s\n", got, hold);
        double end = now_s() + (double)hold;
        while (!stop && (hold < 0 || now_s() < end))
            usleep(100000);
    }
    return 0;
}
