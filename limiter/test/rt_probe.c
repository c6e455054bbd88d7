/* rt_probe.c - drives the real CUDA runtime (libcudart.so.11.0 from
 * Debian's non-free component, loaded with dlopen so nothing CUDA is
 * needed to build this) and prints what each call returned:
 *   driver <rc> <version>
 *   count <rc> <n>
 *   malloc <rc>
 * Used by run_tests.sh over the fake driver and over the real driver
 * library without a GPU, with the limiter preloaded. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "libcudart.so.11.0";
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) {
        printf("load-failed %s\n", dlerror());
        return 2;
    }
    int (*drv)(int *) = (int (*)(int *))dlsym(h, "cudaDriverGetVersion");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
    int (*mal)(void **, size_t) = (int (*)(void **, size_t))dlsym(h, "cudaMalloc");
    if (!drv || !count || !mal) {
        printf("symbols-missing\n");
        return 2;
    }
    int v = 0, n = 0;
    void *p = NULL;
    int r = drv(&v);
    printf("driver %d %d\n", r, v);
    r = count(&n);
    printf("count %d %d\n", r, n);
    r = mal(&p, 1 << 20);
    printf("malloc %d\n", r);
    return 0;
}
