/* tl_clock.c - see tl_clock.h: the real clock and a detached thread. */
#include "tl_compat.h"

#include "tl_clock.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static double ts_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double tl_clock_now(void) { return ts_s(CLOCK_MONOTONIC); }
double tl_clock_coarse(void) { return ts_s(CLOCK_MONOTONIC_COARSE); }

void tl_clock_sleep(double s)
{
    if (!(s > 0))
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static struct every {
    double period;
    void (*fn)(void);
} ev;

static void *loop(void *arg)
{
    (void)arg;
    for (;;) {
        tl_clock_sleep(ev.period);
        ev.fn();
    }
    return NULL;
}

int tl_clock_every(double period, void (*fn)(void))
{
    ev.period = period;
    ev.fn = fn;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int r = pthread_create(&t, &a, loop, NULL);
    pthread_attr_destroy(&a);
    return r == 0 ? 0 : -1;
}
