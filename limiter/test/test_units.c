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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include "../src/tl_config.h"
#include "../src/tl_driver.h"
#include "../src/tl_hostpid.h"
#include "tl_procaddr.h"
#include "../src/tl_size.h"
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

/* Names in the limiter's namespace that it does not know, an index with a
 * leading zero or none, a name given twice: fail closed (trust issue). */
static void test_config_strict(void)
{
    tl_config c;
    const char *bad[] = {"CUDA_DEVICE_MEMORY_LIMIT_=1m", "CUDA_DEVICE_SM_LIMIT_=30", "CUDA_DEVICE_MEMORY_LIMIT_00=1m",
                         "CUDA_DEVICE_MEMORY_LIMIT_01=1m", "CUDA_DEVICE_MEMORY_LIMITS=1m",
                         "CUDA_DEVICE_MEMORY_SHARED_CACHE_X=/a", "TESSERA_LIMITER_FOO=1", "TESSERA_SM_ELASTICITY=1",
                         "TESSERA_CONTEXT_RESERVED=1m", "TESSERA_LIMITER_DEBUG=2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[96];
        snprintf(name, sizeof(name), "config rejects %s", bad[i]);
        CHECK(parse(&c, bad[i], NULL, NULL) != 0 && strstr(c.errmsg, "fail closed"), name);
    }
    CHECK(parse(&c, "CUDA_DEVICE_MEMORY_LIMIT=1g", "CUDA_DEVICE_MEMORY_LIMIT=1t", NULL) != 0 &&
              strstr(c.errmsg, "set twice"),
          "config rejects a variable given twice");
    CHECK(parse(&c, "CUDA_DEVICE_MEMORY_LIMIT_15=1g", "PATH=/bin", "CUDA_VISIBLE_DEVICES=0") == 0 &&
              c.mem_limit[15] == 1ull << 30,
          "device 15 and unrelated variables accepted");
    CHECK(parse(&c, "CUDA_DISABLE_CONTROL=true", "CUDA_DEVICE_MEMORY_LIMIT=1g", NULL) == 0 &&
              strstr(c.notes, "CUDA_DISABLE_CONTROL") && c.mem_limit[0] == 1ull << 30,
          "HAMi's CUDA_DISABLE_CONTROL: noted, limits kept");
    CHECK(parse(&c, "TESSERA_LIMITER_TRACE=/tmp/tr", "CUDA_DEVICE_SM_LIMIT=30", NULL) == 0 &&
              !strcmp(c.trace_path, "/tmp/tr") && c.sm_limit[0] == 30,
          "TESSERA_LIMITER_TRACE: a path prefix, diagnostics only");
    CHECK(parse(&c, "TESSERA_LIMITER_TRACE=", "CUDA_DEVICE_SM_LIMIT=30", NULL) == 0 && !c.trace_path[0],
          "TESSERA_LIMITER_TRACE empty: off");
}

/* The diagnostics variables never change enforcement (a trace prefix too
 * long is ignored, said with TESSERA_LIMITER_DEBUG=1, in both modes), and a
 * program with more privilege than its caller (AT_SECURE) takes neither
 * from its environment: as root, the trace would be created or appended to
 * at a path the caller chose. */
static void test_config_diag(void)
{
    tl_config c;
    static char longv[400];
    snprintf(longv, sizeof(longv), "TESSERA_LIMITER_TRACE=/");
    memset(longv + 23, 'a', 300);
    CHECK(parse(&c, longv, "CUDA_DEVICE_SM_LIMIT=30", NULL) == 0 && !c.trace_path[0] && c.sm_limit[0] == 30 &&
              !c.notes[0],
          "env: TESSERA_LIMITER_TRACE too long: ignored, limits in force (no fail closed)");
    CHECK(parse(&c, longv, "CUDA_DEVICE_SM_LIMIT=30", "TESSERA_LIMITER_DEBUG=1") == 0 && !c.trace_path[0] &&
              strstr(c.notes, "TESSERA_LIMITER_TRACE longer than"),
          "env: TESSERA_LIMITER_TRACE too long: noted with TESSERA_LIMITER_DEBUG=1");
    const char *conf = "version=1\nstate=/s\ndevice.0.uuid=GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8\n"
                       "device.0.memory=1m\ndevice.0.sm=30\n";
    char *fenv[] = {"TESSERA_LIMITER_DEBUG=1", longv, NULL};
    CHECK(tl_config_parse_file(&c, conf, strlen(conf), "limiter.conf", fenv) == 0 && !c.trace_path[0] &&
              c.sm_limit[0] == 30 && strstr(c.notes, "TESSERA_LIMITER_TRACE longer than"),
          "file: TESSERA_LIMITER_TRACE too long: ignored, noted with TESSERA_LIMITER_DEBUG=1");
    char *env[] = {"TESSERA_LIMITER_TRACE=/tmp/tr", "TESSERA_LIMITER_DEBUG=1", "CUDA_DEVICE_SM_LIMIT=30", NULL};
    CHECK(tl_config_load_as(&c, "/nonexistent/limiter.conf", env, 0) == 0 && !strcmp(c.trace_path, "/tmp/tr") &&
              c.debug && c.sm_limit[0] == 30,
          "env: diagnostics taken from an ordinary program's environment");
    CHECK(tl_config_load_as(&c, "/nonexistent/limiter.conf", env, 1) == 0 && !c.trace_path[0] && !c.debug &&
              c.sm_limit[0] == 30 && strstr(c.notes, "setuid"),
          "env: AT_SECURE: TESSERA_LIMITER_TRACE and _DEBUG ignored, limits in force");
    char *benv[] = {"TESSERA_LIMITER_DEBUG=yes", "CUDA_DEVICE_SM_LIMIT=30", NULL};
    CHECK(tl_config_load_as(&c, "/nonexistent/limiter.conf", benv, 1) == 0 && !c.debug && c.sm_limit[0] == 30,
          "env: AT_SECURE: a diagnostics variable is not even parsed");
    char path[] = "/tmp/tl-units-conf.XXXXXX";
    int fd = mkstemp(path);
    int ok = fd >= 0 && write(fd, conf, strlen(conf)) == (ssize_t)strlen(conf);
    if (fd >= 0)
        close(fd);
    CHECK(ok && tl_config_load_as(&c, path, env, 0) == 0 && c.from_file && !strcmp(c.trace_path, "/tmp/tr") &&
              c.debug,
          "file: diagnostics taken from an ordinary program's environment");
    CHECK(ok && tl_config_load_as(&c, path, env, 1) == 0 && c.from_file && !c.trace_path[0] && !c.debug &&
              c.sm_limit[0] == 30 && strstr(c.notes, "setuid"),
          "file: AT_SECURE: TESSERA_LIMITER_TRACE and _DEBUG ignored");
    unlink(path);
}

static int file(tl_config *c, const char *text)
{
    return tl_config_parse_file(c, text, strlen(text), "limiter.conf", NULL);
}

#define U0 "GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8"
#define U1 "GPU-00000000-1111-2222-3333-444444444444"
static void test_config_file(void)
{
    tl_config c;
    char *env[] = {"CUDA_DEVICE_MEMORY_LIMIT=1t", "CUDA_DEVICE_SM_LIMIT=100", "TESSERA_LIMITER_DEBUG=1",
                   "TESSERA_LIMITER_TRACE=/tmp/t", NULL};
    const char *ok = "# agent\nversion=1\nstate=/tessera/state/cache\nelastic=1\ncontext_reserve=64m\n"
                     "device.0.uuid=GPU-6A1F2B3C-0D4E-5F60-7182-93A4B5C6D7E8\ndevice.0.memory=4096m\ndevice.0.sm=30\n"
                     "device.1.uuid=" U1 "\ndevice.1.memory=0m\ndevice.1.sm=100\n";
    CHECK(tl_config_parse_file(&c, ok, strlen(ok), "limiter.conf", env) == 0 && c.from_file && c.ndev == 2 &&
              c.mem_limit[0] == 4096ull << 20 && c.sm_limit[0] == 30 && c.mem_limit[1] == 0 && c.sm_limit[1] == 0 &&
              c.mem_limit[2] == 0 && c.elastic && c.ctx_reserve_set && c.ctx_reserve == 64ull << 20 && c.debug &&
              !strcmp(c.trace_path, "/tmp/t") &&
              !strcmp(c.state_path, "/tessera/state/cache") && !strcmp(c.uuid[0], U0) && c.uuid_bin[0][0] == 0x6a,
          "limits file: values, UUIDs lower-cased, the environment's limits ignored");
    struct {
        const char *text, *want;
    } bad[] = {
        {"", "empty"},
        {"state=/s\nversion=1\n", "line 1: the first setting must be version=1"},
        {"version=2\n", "unsupported version"},
        {"version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=1m\ndevice.0.sm=0\nfoo=1\n", "line 6: unknown key"},
        {"version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=1m\n", "device.0 needs uuid, memory and sm"},
        {"version=1\nstate=/s\ndevice.1.uuid=" U0 "\ndevice.1.memory=1m\ndevice.1.sm=0\n", "device.0 is missing"},
        {"version=1\ndevice.0.uuid=" U0 "\ndevice.0.memory=1m\ndevice.0.sm=0\n", "state= (the shared state file) is missing"},
        {"version=1\nstate=/s\n", "no device"},
        {"version=1\nstate=/s\ndevice.0.uuid=GPU-1\n", "not a GPU UUID"},
        {"version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=1g\n", "want MiB"},
        {"version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.sm=101\n", "percentage"},
        {"version=1\nstate=relative\n", "not an absolute path"},
        {"version=1\nstate=/s\nstate=/t\n", "state given twice"},
        {"version=1\nstate=/s x\n", "space"},
        {"version=1\r\n", "control character"},
        {"version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.1.uuid=" U0
         "\ndevice.1.memory=1m\ndevice.1.sm=0\n", "same uuid"},
        {"version=1\nstate=/s\ndevice.16.uuid=" U0 "\n", "device.<0..15>"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[160];
        snprintf(name, sizeof(name), "limits file rejects (%s)", bad[i].want);
        CHECK(file(&c, bad[i].text) != 0 && c.from_file && strstr(c.errmsg, bad[i].want) &&
                  strstr(c.errmsg, "limiter.conf"),
              name);
    }
    /* tl_config_load: absent -> environment; present -> the file; unreadable -> fail closed */
    char *env2[] = {"CUDA_DEVICE_MEMORY_LIMIT=2g", NULL};
    CHECK(tl_config_load(&c, "/nonexistent/limiter.conf", env2) == 0 && !c.from_file && c.mem_limit[0] == 2ull << 30,
          "no limits file: the environment");
    CHECK(tl_config_load(&c, "/etc/hostname/limiter.conf", env2) == 0 && !c.from_file, "ENOTDIR: the environment");
    char p[64];
    snprintf(p, sizeof(p), "/tmp/tl-units-conf-%d", (int)getpid());
    FILE *f = fopen(p, "w");
    fputs("version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=1m\ndevice.0.sm=0\n", f);
    fclose(f);
    CHECK(tl_config_load(&c, p, env2) == 0 && c.from_file && c.mem_limit[0] == 1ull << 20, "limits file read");
    unlink(p);
    mkdir(p, 0755);
    CHECK(tl_config_load(&c, p, env2) != 0 && strstr(c.errmsg, "cannot read"), "unreadable limits file fails closed");
    rmdir(p);
}

static void test_burst(void)
{
    tl_config c;
    const char *ok = "version=1\nstate=/s\nborrower=0123456789abcdef\n"
                     "device.0.uuid=" U0 "\ndevice.0.memory=1024m\ndevice.0.ceiling=4096m\n"
                     "device.0.budget=/etc/tessera/burst/" U0 "\ndevice.0.sm=0\n"
                     "device.1.uuid=" U1 "\ndevice.1.memory=512m\ndevice.1.sm=0\n";
    CHECK(file(&c, ok) == 0 && c.burst_active && c.mem_limit[0] == 1024ull << 20 && c.ceiling[0] == 4096ull << 20 &&
              !strcmp(c.budget_path[0], "/etc/tessera/burst/" U0) && !strcmp(c.borrower, "0123456789abcdef") &&
              c.ceiling[1] == 0 && !c.budget_path[1][0],
          "limits file: a ceiling, its budget file and the borrower's name");
    CHECK(file(&c, "version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=1m\ndevice.0.sm=0\n") == 0 &&
              !c.burst_active && !c.ceiling[0],
          "limits file without a ceiling: no burst");
    struct {
        const char *text, *want;
    } bad[] = {
        {"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" U0
         "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.ceiling=1m\ndevice.0.budget=/b\n",
         "ceiling 1m is not above its memory limit 1m"},
        {"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" U0
         "\ndevice.0.memory=0m\ndevice.0.sm=0\ndevice.0.ceiling=2m\ndevice.0.budget=/b\n",
         "not above its memory limit 0m"},
        {"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" U0
         "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.ceiling=2m\n",
         "ceiling and budget go together"},
        {"version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.ceiling=2m\n"
         "device.0.budget=/b\n",
         "no borrower="},
        {"version=1\nstate=/s\nborrower=0123456789ABCDEF\n", "lower-case hex"},
        {"version=1\nstate=/s\nborrower=01\n", "lower-case hex"},
        {"version=1\nstate=/s\nborrower=0123456789abcdef\nborrower=0123456789abcdef\n", "borrower given twice"},
        {"version=1\nstate=/s\ndevice.0.budget=relative\n", "want an absolute path"},
        {"version=1\nstate=/s\ndevice.0.ceiling=2g\n", "want MiB above the memory limit"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[160];
        snprintf(name, sizeof(name), "limits file rejects (%s)", bad[i].want);
        CHECK(file(&c, bad[i].text) != 0 && strstr(c.errmsg, bad[i].want), name);
    }
    /* the budget file */
    uint64_t a = 1;
    char err[160];
    const char *b = "# agent\nversion=1\nunguaranteed=4096m\nborrower.0123456789abcdef=1024m\n"
                    "borrower.00000000000000bb=512m\n";
    CHECK(tl_budget_parse(b, strlen(b), "0123456789abcdef", &a, err, sizeof(err)) == 0 && a == 3584ull << 20,
          "budget: unguaranteed minus the other borrowers");
    CHECK(tl_budget_parse(b, strlen(b), "00000000000000cc", &a, err, sizeof(err)) == 0 && a == 2560ull << 20,
          "budget: a container not listed borrows nothing yet");
    b = "version=1\nunguaranteed=1024m\nborrower.00000000000000bb=2048m\n";
    CHECK(tl_budget_parse(b, strlen(b), "0123456789abcdef", &a, err, sizeof(err)) == 0 && a == 0,
          "budget: overdrawn lends nothing (never below 0)");
    const char *badb[][2] = {
        {"", "want version=1"},
        {"unguaranteed=1m\n", "first setting"},
        {"version=1\n", "want version=1 and unguaranteed="},
        {"version=1\nunguaranteed=1m\nunguaranteed=1m\n", "given twice"},
        {"version=1\nunguaranteed=1\n", "not MiB"},
        {"version=1\nunguaranteed=1m\nborrower.0123=1m\n", "unknown key"},
        {"version=1\nunguaranteed=1m\nborrower.0123456789abcdef=x\n", "want MiB"},
        {"version=1\nunguaranteed=1m \n", "space"},
    };
    for (size_t i = 0; i < sizeof(badb) / sizeof(badb[0]); i++) {
        char name[160];
        a = 1;
        snprintf(name, sizeof(name), "budget file rejected, lends nothing (%s)", badb[i][1]);
        CHECK(tl_budget_parse(badb[i][0], strlen(badb[i][0]), "0123456789abcdef", &a, err, sizeof(err)) != 0 &&
                  a == 0 && strstr(err, badb[i][1]),
              name);
    }
}

/* the driver's confirmation (tl_driver.h): the named GPUs' memory limits
 * dropped, the others kept; anything unreadable changes nothing */
static void test_driver_confirm(void)
{
    const char *conf = "version=1\nstate=/s\ndevice.0.uuid=" U0 "\ndevice.0.memory=4096m\ndevice.0.sm=30\n"
                       "device.1.uuid=" U1 "\ndevice.1.memory=2048m\ndevice.1.sm=0\n";
    tl_config c;
    const char *one = "# written by tessera memory-limits\ncgroup=/sys/fs/cgroup/k/p\n"
                      "device=GPU-6A1F2B3C-0D4E-5F60-7182-93A4B5C6D7E8 soft=4096m hard=8192m\n";
    CHECK(file(&c, conf) == 0 && tl_driver_apply_text(&c, one, strlen(one)) == 1 && c.mem_limit[0] == 0 &&
              c.sm_limit[0] == 30 && c.mem_limit[1] == 2048ull << 20 && c.mem_active,
          "driver confirmation: its GPU's memory limit dropped, compute share and the other GPU kept");
    const char *both = "cgroup=/x\ndevice=" U0 " soft=1m hard=1m\ndevice=" U1 " soft=1m hard=1m\n";
    CHECK(file(&c, conf) == 0 && tl_driver_apply_text(&c, both, strlen(both)) == 2 && !c.mem_active,
          "driver confirmation of every GPU: no memory limit left");
    const char *keep[] = {"", "# not set: the driver refused\n", "cgroup=/x\ndevice=GPU-1 soft=1m\n",
                          "device=" U0 " soft=1m hard=1m\nbogus\n"};
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
        CHECK(file(&c, conf) == 0 && tl_driver_apply_text(&c, keep[i], strlen(keep[i])) <= 0 &&
                  c.mem_limit[0] == 4096ull << 20 && c.mem_limit[1] == 2048ull << 20,
              "driver confirmation empty, a note or malformed: the limits kept");
    char *env[] = {"CUDA_DEVICE_MEMORY_LIMIT=2g", NULL};
    CHECK(tl_config_parse(&c, env) == 0 && tl_driver_apply_text(&c, one, strlen(one)) == 0 &&
              c.mem_limit[0] == 2ull << 30,
          "driver confirmation ignored without a limits file");
    CHECK(file(&c, conf) == 0 && tl_driver_apply(&c, "/nonexistent/driver-memory") == 0 &&
              c.mem_limit[0] == 4096ull << 20,
          "no confirmation file: the limits kept");
}

static void test_uuid(void)
{
    unsigned char b[16];
    char s[64];
    CHECK(tl_uuid_parse(U0, b) == 0 && b[0] == 0x6a && b[15] == 0xe8, "uuid parse");
    tl_uuid_format(b, s, sizeof(s));
    CHECK(!strcmp(s, U0), "uuid format round trip");
    CHECK(tl_uuid_parse("MIG-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8", b) == 0, "MIG uuid parse");
    const char *bad[] = {"", "GPU-", "6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8", "GPU-6a1f2b3c0d4e-5f60-7182-93a4b5c6d7e8",
                         "GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e", "GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8a",
                         "GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7eg"};
    int ok = 1;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ok &= tl_uuid_parse(bad[i], b) != 0;
    CHECK(ok, "uuid parse rejects malformed");
}

/* The variants the real driver (535) hands out, and the CUDA 12.5+ one. */
static void test_procaddr(void)
{
    static const struct {
        const char *base;
        int ver;
        unsigned long long flags;
        const char *want;
    } spot[] = {
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"}, {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
        {"cuCtxCreate", 11030, 0, "cuCtxCreate_v2"}, {"cuCtxCreate", 11080, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"}, {"cuGraphInstantiate", 12000, 0, "cuGraphInstantiate_v2"},
        {"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
        {"cuDevicePrimaryCtxRelease", 11030, 0, "cuDevicePrimaryCtxRelease_v2"},
        {"cuLaunchKernel", 11030, 2, "cuLaunchKernel_ptsz"}, {"cuLaunchKernel", 11030, 0, "cuLaunchKernel"},
        {"cuMemAlloc", 13000, 2, "cuMemAlloc_v2"}, {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
        {"cuGraphInstantiateWithParams", 12000, 2, "cuGraphInstantiateWithParams_ptsz"},
    };
    char n[128], name[160];
    for (size_t i = 0; i < sizeof(spot) / sizeof(spot[0]); i++) {
        snprintf(name, sizeof(name), "procaddr %s@%d%s = %s", spot[i].base, spot[i].ver, spot[i].flags ? " ptsz" : "",
                 spot[i].want);
        CHECK(tl_pa_resolve(spot[i].base, spot[i].ver, spot[i].flags, n, sizeof(n)) == 0 && !strcmp(n, spot[i].want),
              name);
    }
    CHECK(tl_pa_resolve("cuMemAllocAsync", 11010, 0, n, sizeof(n)) != 0, "procaddr: before the first variant: none");
    CHECK(tl_pa_resolve("cuLaunchKernel", 4000, 2, n, sizeof(n)) != 0, "procaddr: ptsz before CUDA 7.0: none");
    CHECK(tl_pa_resolve("cuDeviceGet", 12000, 0, n, sizeof(n)) != 0 && !tl_pa_known("cuDeviceGet"),
          "procaddr: names outside the table are unknown");
    CHECK(tl_pa_resolve("cuCtxCreate", 12050, 0, n, 8) != 0, "procaddr: small buffer refused");
}

static void test_size(void)
{
    CHECK(tl_array_bytes(1024, 2, 0, 0x20, 2) == 1024 * 2 * 2 * 4, "array bytes: float2 1024x2");
    CHECK(tl_array_bytes(SIZE_MAX, SIZE_MAX, 2, 0x20, 4) == UINT64_MAX, "array bytes saturate");
    TL_ARRAY3D_DESCRIPTOR d = {8, 8, 0, 0x01, 1, 0};
    CHECK(tl_mipmap_bytes(&d, 4) == 64 + 16 + 4 + 1, "mipmap levels halve");
    CHECK(tl_sat_add(UINT64_MAX, 1) == UINT64_MAX && tl_sat_mul(1ull << 40, 1ull << 40) == UINT64_MAX, "saturation");
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
    uint64_t aux = 0;
    CHECK(tl_table_put_aux(TL_K_HANDLE, 77, 5, 2, (3ull << 32) | 1) == 0 &&
              tl_table_get_aux(TL_K_HANDLE, 77, &s, &d, &aux) == 1 && aux == ((3ull << 32) | 1) && s == 5 && d == 2,
          "aux stored");
    CHECK(tl_table_put_aux(TL_K_HANDLE, 77, 5, 2, 9) == 0 && tl_table_take_aux(TL_K_HANDLE, 77, NULL, NULL, &aux) == 1 &&
              aux == 9 && tl_table_count() == 0,
          "aux replaced, taken with NULL outputs");
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

    /* liveness across pid namespaces: a process of another namespace (its
     * slot records another pidns) that is gone is reclaimed through its
     * open-file-description lock; one that lives is not */
    for (int live = 0; live < 2; live++) {
        k = fork();
        if (k == 0) {
            tl_shared c;
            if (tl_shared_open(&c, path) || tl_shared_register(&c) || tl_shared_reserve(&c, 0, 600, 1000))
                _exit(1);
            c.st->slots[c.slot].pidns ^= 0x5a5a; /* as if from another pid namespace */
            if (write(p1[1], "z", 1) != 1)
                _exit(1);
            for (;;)
                pause();
        }
        CHECK(read(p1[0], &ch, 1) == 1, "child of another pid namespace reserved 600");
        if (!live) {
            kill(k, SIGKILL);
            waitpid(k, NULL, 0);
            CHECK(sh.ofd && tl_shared_reserve(&sh, 0, 1000, 1000) == 0,
                  "dead process of another pid namespace reclaimed (OFD lock)");
            tl_shared_release(&sh, 0, 1000);
        } else {
            CHECK(tl_shared_reserve(&sh, 0, 500, 1000) != 0, "live process of another pid namespace kept");
            kill(k, SIGKILL);
            waitpid(k, NULL, 0);
            tl_shared_reclaim(&sh);
        }
    }

    /* a stopped process holding the lock: reserve gives up after the
     * bounded wait; a release is kept and applied once the lock is free */
    CHECK(tl_shared_reserve(&sh, 0, 400, 1000) == 0, "reserve 400 before the stop");
    k = fork();
    if (k == 0) {
        tl_shared c;
        if (tl_shared_open(&c, path))
            _exit(1);
        pthread_mutex_lock(&c.st->lock.mutex);
        if (write(p1[1], "s", 1) != 1)
            _exit(1);
        raise(SIGSTOP);
        for (;;)
            pause();
    }
    CHECK(read(p1[0], &ch, 1) == 1, "child holds the lock and stops");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = tl_shared_reserve(&sh, 0, 1, 1000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK(r != 0 && waited >= TL_LOCK_WAIT_S - 0.1 && waited < TL_LOCK_WAIT_S + 2, "lock held by a stopped process: "
                                                                                  "refused after the bounded wait");
    tl_shared_release(&sh, 0, 400);
    CHECK(sh.pending[0] == 400 && tl_shared_used(&sh, 0) == 400, "release during the stop kept for later");
    kill(k, SIGKILL);
    waitpid(k, NULL, 0);
    CHECK(tl_shared_reserve(&sh, 0, 1000, 1000) == 0 && sh.pending[0] == 0,
          "holder killed: lock recovered, the kept release applied");
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

/* A file as a version-3 limiter leaves it: the header and slots of this
 * layout, version 3, no counters (its size ends before them). */
static void make_v3(const char *p, int32_t pid, uint64_t used)
{
    unlink(p);
    tl_shared w;
    tl_shared_open(&w, p);
    w.st->version = TL_STATE_VERSION_V3;
    w.st->slots[7].pid = pid;
    w.st->slots[7].used[0] = used;
    w.st->total_used[0] = used;
    w.st->counters.refused_allocs[0] = 12345; /* beyond a v3 file: must not survive */
    munmap(w.st, sizeof(tl_state));
    close(w.fd);
    CHECK(truncate(p, (off_t)TL_STATE_V3_SIZE) == 0, "v3 file: truncated to the version-3 size");
}

static off_t file_size(const char *p)
{
    int fd = open(p, O_RDONLY);
    off_t n = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    if (fd >= 0)
        close(fd);
    return n;
}

static void test_counters(void)
{
    char p[128];
    snprintf(p, sizeof(p), "/tmp/tl-units-%d.counters", (int)getpid());
    unlink(p);
    tl_shared sh;
    CHECK(tl_shared_open(&sh, p) == 0 && tl_shared_register(&sh) == 0, "counters: state create");
    CHECK(file_size(p) == (off_t)sizeof(tl_state) && sh.st->version == 4 && !sh.v3, "counters: new file is version 4");
    tl_shared_count_refused(&sh, 0);
    tl_shared_count_refused(&sh, 0);
    tl_shared_count_refused(&sh, 3);
    tl_shared_add_throttled(&sh, 3, 1500);
    tl_shared_count_refused(&sh, -1); /* out of range: ignored */
    tl_shared_count_refused(&sh, TL_MAX_DEVICES);
    tl_shared_add_throttled(&sh, TL_MAX_DEVICES, 7);
    CHECK(tl_shared_refused(&sh, 0) == 2 && tl_shared_refused(&sh, 3) == 1 && tl_shared_throttled_ns(&sh, 3) == 1500 &&
              tl_shared_throttled_ns(&sh, 0) == 0,
          "counters: per device");
    /* they outlive the process that counted (a fork child counts, exits) */
    pid_t k = fork();
    if (k == 0) {
        tl_shared_after_fork(&sh);
        tl_shared_register(&sh);
        tl_shared_count_refused(&sh, 0);
        tl_shared_add_throttled(&sh, 0, 40);
        _exit(0);
    }
    waitpid(k, NULL, 0);
    tl_shared_reclaim(&sh);
    CHECK(tl_shared_refused(&sh, 0) == 3 && tl_shared_throttled_ns(&sh, 0) == 40,
          "counters: what an exited process counted stays");
    tl_shared_unregister(&sh);
    munmap(sh.st, sizeof(tl_state));
    close(sh.fd);
    CHECK(tl_shared_open(&sh, p) == 0 && tl_shared_refused(&sh, 0) == 3, "counters: kept when the file is reopened");
    munmap(sh.st, sizeof(tl_state));
    close(sh.fd);

    /* a version-3 file nobody uses is upgraded in place; what its dead
     * processes held is reclaimed as usual */
    make_v3(p, 999999, 500);
    CHECK(tl_shared_open(&sh, p) == 0, "v3 file, nobody alive: opened");
    CHECK(sh.st->version == TL_STATE_VERSION && !sh.v3 && file_size(p) == (off_t)sizeof(tl_state),
          "v3 file, nobody alive: upgraded to version 4");
    CHECK(tl_shared_refused(&sh, 0) == 0, "v3 file, upgraded: counters start at 0");
    CHECK(tl_shared_register(&sh) == 0 && tl_shared_reserve(&sh, 0, 1000, 1000) == 0,
          "v3 file, upgraded: the dead process's 500 reclaimed");
    tl_shared_count_refused(&sh, 0);
    CHECK(tl_shared_refused(&sh, 0) == 1, "v3 file, upgraded: counts");
    tl_shared_unregister(&sh);
    munmap(sh.st, sizeof(tl_state));
    close(sh.fd);

    /* a version-3 file with a live process (it holds its slot's byte, as a
     * version-3 limiter does): shared as version 3, nothing counted */
    make_v3(p, 999999, 500);
    int hold = open(p, O_RDWR);
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = TL_SLOT_LOCK_BASE + 7;
    fl.l_len = 1;
    CHECK(hold >= 0 && fcntl(hold, F_OFD_SETLK, &fl) == 0, "v3 file: a live holder's slot byte locked");
    CHECK(tl_shared_open(&sh, p) == 0 && sh.v3, "v3 file, a live holder: shared as version 3");
    CHECK(sh.st->version == TL_STATE_VERSION_V3 && file_size(p) == (off_t)TL_STATE_V3_SIZE,
          "v3 file, a live holder: left as version 3 (size and version)");
    CHECK(tl_shared_register(&sh) == 0 && tl_shared_reserve(&sh, 0, 500, 1000) == 0 &&
              tl_shared_reserve(&sh, 0, 1, 1000) != 0,
          "v3 file, a live holder: its 500 kept, the budget shared");
    tl_shared_count_refused(&sh, 0);
    tl_shared_add_throttled(&sh, 0, 5);
    CHECK(tl_shared_refused(&sh, 0) == 0 && tl_shared_throttled_ns(&sh, 0) == 0 && file_size(p) == (off_t)TL_STATE_V3_SIZE,
          "v3 file, a live holder: nothing counted, nothing written past its end");
    tl_shared_unregister(&sh);
    munmap(sh.st, sizeof(tl_state));
    close(sh.fd);
    close(hold);

    /* a version-4 header on a file too short for the counters is refused */
    unlink(p);
    CHECK(tl_shared_open(&sh, p) == 0, "short v4: create");
    munmap(sh.st, sizeof(tl_state));
    close(sh.fd);
    CHECK(truncate(p, (off_t)TL_STATE_V3_SIZE) == 0 && tl_shared_open(&sh, p) != 0, "v4 header, v3 size: refused");
    unlink(p);
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

/* holdlock PATH: take the shared-state lock of PATH, create PATH.locked,
 * and stop (SIGSTOP) while holding it: a frozen process of the container. */
static int holdlock(const char *p)
{
    tl_shared sh;
    if (tl_shared_open(&sh, p) != 0 || tl_shared_register(&sh) != 0)
        return 1;
    pthread_mutex_lock(&sh.st->lock.mutex);
    char done[300];
    snprintf(done, sizeof(done), "%s.locked", p);
    close(open(done, O_CREAT | O_WRONLY, 0644));
    raise(SIGSTOP);
    pause();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "holdlock"))
        return holdlock(argv[2]);
    test_sizes();
    test_config();
    test_config_strict();
    test_config_diag();
    test_config_file();
    test_burst();
    test_driver_confirm();
    test_uuid();
    test_procaddr();
    test_size();
    test_table();
    test_state();
    test_counters();
    test_hostpid();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
