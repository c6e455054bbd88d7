/* client.h - what the test client's files share (client.c: loading the
 * driver and the original checks; client_holes.c: the isolation holes of
 * issue 11; client_pace.c: pacing in simulated time). */
#ifndef CLIENT_H
#define CLIENT_H
#include "fake_api.h"

#define PTR(ret, name, args) ret(*name) args;
struct client_api {
    FAKE_API_LIST(PTR)
    FAKE_NVML_LIST(PTR)
};
extern struct client_api api;
extern const char *mode;
extern int failures;

void check(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void init_cuda(void);
size_t mem_free(void);
unsigned long long fake_used(int dev);
double now_s(void);
/* The shared state's counters of device `dev` (version 4), read from the
 * file CUDA_DEVICE_MEMORY_SHARED_CACHE names. 0 or -1 (no such file, not
 * version 4). */
int state_counters(int dev, unsigned long long *throttled_ns, unsigned long long *refused);
/* A helper the fake libcuda exports (NULL if not loaded). */
void *fake_fn(const char *name);

/* Each returns 1 if it ran the test named `t`. */
int holes_main(const char *t, int argc, char **argv);
int pace_main(const char *t, int argc, char **argv);
#endif
