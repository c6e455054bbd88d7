/* test_units.c - unit tests for configuration parsing, the allocation
 * table, the shared-state file (including crash recovery) and host pid
 * discovery. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/tl_config.h"
#include "../src/tl_hostpid.h"
#include "../src/tl_state.h"
#include "../src/tl_table.h"

static int passed, failed;
#define CHECK(cond, name)                                           \
    do {                                                            \
        if (cond) {                                                 \
            printf("PASS %s\n", name);                              \
            passed++;                                               \
        } else {                                                    \
            printf("FAIL %s (%s:%d: %s)\n", name, __FILE__, __LINE__, #cond); \
            failed++;                                               \
        }                                                           \
    } while (0)

static void test_sizes(void)
{
    uint64_t v;
    CHECK(tl_parse_size("4096m", &v) == 0 && v == 4096ull << 20, "size 4096m");
    CHECK(tl_parse_size("4g", &v) == 0 && v == 4ull << 30, "size 4g");
    CHECK(tl_parse_size("4G", &v) == 0 && v == 4ull << 30, "size 4G");
    CHECK(tl_parse_size("1024k", &v) == 0 && v == 1024ull << 10, "size 1024k");
    CHECK(tl_parse_size("123456789", &v) == 0 && v == 123456789ull, "size plain bytes");
    CHECK(tl_parse_size("2t", &v) == 0 && v == 2ull << 40, "size 2t");
    const char *bad[] = {"", "abc", "12x", "-5", "4 g", "4gb", " 4g", "4g ", "m", "0x10",
                         "99999999999999999999", "17179869184g", "1.5g"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[64];
        snprintf(name, sizeof(name), "size rejects \"%s\"", bad[i]);
        CHECK(tl_parse_size(bad[i], &v) != 0, name);
    }
}

static int parse(tl_config *c, const char *a, const char *b, const char *d)
{
    char *env[4] = {(char *)a, (char *)b, (char *)d, NULL};
    return tl_config_parse(c, env);
}

static void test_config(void)
{
    tl_config c;
    CHECK(parse(&c, NULL, NULL, NULL) == 0 && !c.mem_active && !c.sm_active, "no env: no limits");
    CHECK(!strcmp(c.state_path, TL_DEFAULT_STATE_PATH), "default state path");
    CHECK(parse(&c, "CUDA_DEVICE_MEMORY_LIMIT=1g", "CUDA_DEVICE_MEMORY_LIMIT_1=2g", NULL) == 0 &&
              c.mem_limit[0] == 1ull << 30 && c.mem_limit[1] == 2ull << 30 && c.mem_limit[5] == 1ull << 30 &&
              c.mem_active,
          "per-device limit overrides the all-device one");
    CHECK(parse(&c, "CUDA_DEVICE_MEMORY_LIMIT_0=512m", NULL, NULL) == 0 && c.mem_limit[0] == 512ull << 20 &&
              c.mem_limit[1] == 0,
          "only device 0 limited");
    CHECK(parse(&c, "CUDA_DEVICE_SM_LIMIT=30", NULL, NULL) == 0 && c.sm_limit[0] == 30 && c.sm_limit[3] == 30 &&
              c.sm_active,
          "sm limit 30");
    CHECK(parse(&c, "CUDA_DEVICE_SM_LIMIT=100", NULL, NULL) == 0 && !c.sm_active, "sm limit 100 = unlimited");
    CHECK(parse(&c, "CUDA_DEVICE_SM_LIMIT=0", NULL, NULL) == 0 && !c.sm_active, "sm limit 0 = unlimited");
    CHECK(parse(&c, "CUDA_DEVICE_MEMORY_SHARED_CACHE=/x/y", "TESSERA_SM_ELASTIC=1",
                "TESSERA_CONTEXT_RESERVE=300m") == 0 &&
              !strcmp(c.state_path, "/x/y") && c.elastic && c.ctx_reserve == 300ull << 20 && c.ctx_reserve_set,
          "shared cache path, elastic, context reserve");
    CHECK(parse(&c, "TESSERA_CONTEXT_RESERVE=0", NULL, NULL) == 0 && c.ctx_reserve == 0 && c.ctx_reserve_set,
          "context reserve 0 = explicitly off");
    CHECK(parse(&c, NULL, NULL, NULL) == 0 && !c.ctx_reserve_set, "context reserve unset = measured");
    const char *bad[] = {"CUDA_DEVICE_MEMORY_LIMIT=12x", "CUDA_DEVICE_MEMORY_LIMIT=", "CUDA_DEVICE_MEMORY_LIMIT_0=-1",
                         "CUDA_DEVICE_MEMORY_LIMIT_x=1g", "CUDA_DEVICE_MEMORY_LIMIT_16=1g",
                         "CUDA_DEVICE_SM_LIMIT=101", "CUDA_DEVICE_SM_LIMIT=abc", "CUDA_DEVICE_SM_LIMIT=",
                         "CUDA_DEVICE_SM_LIMIT_2=3.5", "TESSERA_SM_ELASTIC=yes", "TESSERA_CONTEXT_RESERVE=lots",
                         "CUDA_DEVICE_MEMORY_SHARED_CACHE="};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[96];
        snprintf(name, sizeof(name), "config rejects %s", bad[i]);
        CHECK(parse(&c, bad[i], NULL, NULL) != 0 && c.error, name);
        char want[96];
        snprintf(want, sizeof(want), "invalid %.*s=\"", (int)(strchr(bad[i], '=') - bad[i]), bad[i]);
        snprintf(name, sizeof(name), "message names %s", bad[i]);
        CHECK(strstr(c.errmsg, want) != NULL, name);
    }
}

static void test_table(void)
{
    enum { N = 20000 };
    int ok = 1;
    for (uint64_t i = 1; i <= N; i++)
        ok &= tl_table_put(TL_K_PTR, 0x7000000000ull + i * 512, i, (int)(i % 4)) == 0;
    CHECK(ok && tl_table_count() == N, "table holds 20000 entries");
    CHECK(tl_table_put(TL_K_HANDLE, 0x7000000000ull + 512, 99, 1) == 0, "same key, other kind");
    uint64_t s;
    int d;
    for (uint64_t i = 1; i <= N; i += 2)
        ok &= tl_table_take(TL_K_PTR, 0x7000000000ull + i * 512, &s, &d) == 1 && s == i && d == (int)(i % 4);
    CHECK(ok, "take returns size and device");
    CHECK(tl_table_take(TL_K_PTR, 0x7000000000ull + 512, &s, &d) == 0, "taken key is gone");
    for (uint64_t i = 2; i <= N; i += 2)
        ok &= tl_table_take(TL_K_PTR, 0x7000000000ull + i * 512, &s, &d) == 1 && s == i;
    CHECK(ok, "remaining entries intact after deletions");
    CHECK(tl_table_get(TL_K_HANDLE, 0x7000000000ull + 512, &s, &d) == 1 && s == 99 && d == 1 &&
              tl_table_get(TL_K_PTR, 0x7000000000ull + 512, &s, &d) == 0,
          "get finds by kind and key without removing");
    CHECK(tl_table_take(TL_K_HANDLE, 0x7000000000ull + 512, &s, &d) == 1 && s == 99, "other kind kept");
    CHECK(tl_table_count() == 0, "table empty");
    CHECK(tl_table_put(TL_K_PTR, 0, 1, 0) != 0, "NULL key rejected");
    tl_table_reset();
}

static char path[256];

static void test_state(void)
{
    snprintf(path, sizeof(path), "/tmp/tl-units-%d.state", (int)getpid());
    unlink(path);
    tl_shared sh;
    CHECK(tl_shared_open(&sh, path) == 0, "state create");
    CHECK(tl_shared_register(&sh) == 0 && sh.slot >= 0, "state register");
    CHECK(tl_shared_reserve(&sh, 0, 1000, 1000) == 0, "reserve exactly the limit");
    CHECK(tl_shared_reserve(&sh, 0, 1, 1000) != 0, "one byte over refused");
    CHECK(tl_shared_reserve(&sh, 1, 1000, 1000) == 0, "other device independent");
    tl_shared_release(&sh, 0, 1000);
    tl_shared_release(&sh, 1, 1000);
    CHECK(tl_shared_used(&sh, 0) == 0 && tl_shared_used(&sh, 1) == 0, "release restores");
    CHECK(tl_shared_reserve(&sh, 0, UINT64_MAX, 1000) != 0, "huge request refused");
    CHECK(sh.st->seq % 2 == 0 && sh.st->seq > 0, "seq even when idle");

    /* a process killed while holding memory: its share comes back */
    int p1[2];
    if (pipe(p1))
        exit(1);
    pid_t k = fork();
    if (k == 0) {
        tl_shared c;
        if (tl_shared_open(&c, path) || tl_shared_register(&c) || tl_shared_reserve(&c, 0, 800, 1000))
            _exit(1);
        if (write(p1[1], "x", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char ch;
    CHECK(read(p1[0], &ch, 1) == 1, "child reserved 800");
    CHECK(tl_shared_reserve(&sh, 0, 300, 1000) != 0, "live child's 800 counts");
    kill(k, SIGKILL);
    waitpid(k, NULL, 0);
    uint64_t before = sh.st->reclaimed_procs;
    CHECK(tl_shared_reserve(&sh, 0, 300, 1000) == 0, "SIGKILLed child's share reclaimed");
    CHECK(sh.st->reclaimed_procs == before + 1, "reclaim counted");
    tl_shared_release(&sh, 0, 300);

    /* a process killed while holding the lock: EOWNERDEAD is recovered */
    k = fork();
    if (k == 0) {
        tl_shared c;
        if (tl_shared_open(&c, path) || tl_shared_register(&c) || tl_shared_reserve(&c, 0, 500, 1000))
            _exit(1);
        pthread_mutex_lock(&c.st->lock.mutex);
        __atomic_add_fetch(&c.st->seq, 1, __ATOMIC_SEQ_CST); /* die mid-update */
        c.st->total_used[0] = 12345;                         /* ...with garbage */
        if (write(p1[1], "y", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    CHECK(read(p1[0], &ch, 1) == 1, "child holds the lock");
    kill(k, SIGKILL);
    waitpid(k, NULL, 0);
    CHECK(tl_shared_reserve(&sh, 0, 1000, 1000) == 0, "lock recovered after owner died; totals rebuilt");
    CHECK(sh.st->seq % 2 == 0, "seq consistent after recovery");
    tl_shared_release(&sh, 0, 1000);

    /* a stale slot carrying our own pid (pid reuse) is cleared on register */
    int other = (sh.slot + 1) % TL_MAX_PROCS;
    sh.st->slots[other].pidns = sh.pidns;
    sh.st->slots[other].used[0] = 700;
    sh.st->total_used[0] += 700;
    sh.st->slots[other].pid = sh.pid;
    tl_shared_unregister(&sh);
    CHECK(tl_shared_register(&sh) == 0 && tl_shared_used(&sh, 0) == 0, "stale slot with our pid reclaimed");
    tl_shared_unregister(&sh);
    munmap(sh.st, sizeof(tl_state));

    /* incompatible files are refused, not reused */
    int fd = open(path, O_RDWR);
    uint32_t v = 99;
    CHECK(pwrite(fd, &v, 4, 8) == 4, "corrupt version");
    close(fd);
    CHECK(tl_shared_open(&sh, path) != 0, "wrong version refused");
    fd = open(path, O_RDWR | O_TRUNC);
    CHECK(write(fd, "short", 5) == 5, "write short file");
    close(fd);
    CHECK(tl_shared_open(&sh, path) != 0, "too-small file refused");
    unlink(path);
}

#define MB (1ull << 20)
static void test_hostpid(void)
{
    CHECK(tl_hp_parse_nspid("Name:\tx\nNSpid:\t4242\t17\nNSpgid:\t1\n") == 4242, "nspid two levels: outermost");
    CHECK(tl_hp_parse_nspid("Name:\tx\nNSpid:\t17\nNSpgid:\t1\n") == 0, "nspid one level: unknown");
    CHECK(tl_hp_parse_nspid("Name:\tx\nPid:\t17\n") == 0, "nspid missing: unknown");
    CHECK(tl_hp_parse_nspid("NSpid:\t99\t5\t1") == 99, "nspid three levels, first line, no newline");

    tl_hostpid h;
    tl_gpu_proc before[] = {{500, 1 * MB}, {600, 2 * MB}};
    tl_gpu_proc after1[] = {{500, 1 * MB}, {600, 2 * MB}, {700, 3 * MB}};
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, after1, 3, NULL, 0, 0, 0) == 700, "hostpid: the one pid that appeared");

    /* NSpid wins when listed, ignored when not */
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, after1, 3, NULL, 0, 600, 0) == 600, "hostpid: NSpid in the list");
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, after1, 3, NULL, 0, 999, 0) == 700, "hostpid: NSpid not listed is ignored");

    /* two appeared (concurrent start): a sibling's published pid is not ours */
    tl_gpu_proc after2[] = {{500, 1 * MB}, {700, 3 * MB}, {800, 4 * MB}};
    uint32_t sib[] = {800};
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, after2, 3, sib, 1, 0, 0) == 700, "hostpid: sibling's host pid excluded");

    /* two appeared, nothing to tell them apart: wait; the other exits */
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, after2, 3, NULL, 0, 0, 0) == 0 && h.ncand == 2, "hostpid: ambiguous, unresolved");
    CHECK(tl_hp_observe(&h, after2, 3, NULL, 0, 0, 0) == 0, "hostpid: still ambiguous");
    tl_gpu_proc later[] = {{500, 1 * MB}, {800, 4 * MB}, {900, 5 * MB}};
    CHECK(tl_hp_observe(&h, later, 3, NULL, 0, 0, 0) == 800, "hostpid: intersection over time (new pids not candidates)");

    /* two appeared: usedGpuMemory matches what we accounted */
    tl_gpu_proc mem[] = {{500, 1 * MB}, {700, 64 * MB}, {800, 512 * MB}};
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, mem, 3, NULL, 0, 0, 0) == 0, "hostpid: memory unknown, ambiguous");
    CHECK(tl_hp_observe(&h, mem, 3, NULL, 0, 0, 512 * MB) == 800, "hostpid: usedGpuMemory match");
    tl_gpu_proc close2[] = {{700, 500 * MB}, {800, 512 * MB}};
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, close2, 2, NULL, 0, 0, 512 * MB) == 0, "hostpid: two close memory sizes: no guess");
    tl_gpu_proc na[] = {{700, UINT64_MAX}, {800, 512 * MB}};
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, na, 2, NULL, 0, 0, 512 * MB) == 0, "hostpid: memory not available: no guess");

    /* not listed right after creation: retried at the next lists */
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    CHECK(tl_hp_observe(&h, before, 2, NULL, 0, 0, 0) == 0 && h.have_before, "hostpid: not listed yet, retry");
    CHECK(tl_hp_observe(&h, after1, 3, NULL, 0, 0, 0) == 700, "hostpid: listed one period later");
    /* candidates run out (context gone): only a new creation starts over */
    tl_hp_init(&h);
    tl_hp_before(&h, before, 2);
    tl_hp_observe(&h, after2, 3, NULL, 0, 0, 0);
    CHECK(tl_hp_observe(&h, before, 2, NULL, 0, 0, 0) == 0 && !h.have_before, "hostpid: candidates gone: stop");
    CHECK(tl_hp_observe(&h, after1, 3, NULL, 0, 0, 0) == 0, "hostpid: no guess without a new before list");
    /* no before list at all */
    tl_hp_init(&h);
    CHECK(tl_hp_observe(&h, after1, 3, NULL, 0, 0, 0) == 0, "hostpid: no context creation seen: no guess");
}

int main(void)
{
    test_sizes();
    test_config();
    test_table();
    test_state();
    test_hostpid();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
