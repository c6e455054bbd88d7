/*
 * sim_clock.c - tl_clock.h for the simulation build of the limiter
 * (build/sim/libtessera-limiter.so, tests only): time, sleeping and the
 * periodic control step come from the fake GPU's clock (fake_gpu.c,
 * FAKE_SIM=1), so the limiter's gate and its 100 ms step run on the same
 * simulated timeline as the GPU they pace. The shipped library links
 * src/tl_clock.c instead.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#include "../src/tl_clock.h"

static double (*now_fn)(void);
static void (*sleep_fn)(double);
static int (*every_fn)(double, void (*)(void));

static void resolve(void)
{
    if (now_fn)
        return;
    /* the fake libcuda is loaded globally by then (the test links it) */
    *(void **)&sleep_fn = dlsym(RTLD_DEFAULT, "fake_sleep");
    *(void **)&every_fn = dlsym(RTLD_DEFAULT, "fake_every");
    *(void **)&now_fn = dlsym(RTLD_DEFAULT, "fake_now");
}

double tl_clock_now(void)
{
    resolve();
    return now_fn ? now_fn() : 0;
}

double tl_clock_coarse(void) { return tl_clock_now(); }

void tl_clock_sleep(double s)
{
    resolve();
    if (sleep_fn)
        sleep_fn(s);
}

int tl_clock_every(double period, void (*fn)(void))
{
    resolve();
    return every_fn ? every_fn(period, fn) : -1;
}
