/*
 * tl_clock.h - time, for pacing. The shipped library uses CLOCK_MONOTONIC,
 * nanosleep and a thread (tl_clock.c); the simulation build of the tests
 * links test/sim_clock.c instead, which takes time and the periodic step
 * from the fake GPU, so the pacing tests run in simulated time.
 */
#ifndef TL_CLOCK_H
#define TL_CLOCK_H

/* Seconds, monotonic, precise. */
double tl_clock_now(void);
/* Seconds, monotonic, cheap: a few milliseconds of resolution. */
double tl_clock_coarse(void);
void tl_clock_sleep(double seconds);
/* Run fn every `period` seconds from now on. Returns 0 or -1. */
int tl_clock_every(double period, void (*fn)(void));

#endif
