/* conf_dump.c - parses a limits file with the limiter's own parser
 * (src/tl_config.c) and prints the result, for internal/limiterconf's
 * parity test (with several files, each result is followed by --end--):
 *   error
 *   <message lines>
 * or
 *   ok
 *   state=<path>
 *   elastic=<0|1>
 *   context_reserve=<bytes>|measured
 *   device <i> <uuid> <memory bytes> <sm percent, 0 = no limit>
 *   [ceiling <i> <bytes> <budget file>]   a device with a ceiling
 *   [borrower=<name>]                       when the file names one
 *   [reclaim=<need file>]                   when the file names one
 *   reclaim_wait=<milliseconds>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/tl_config.h"

static void dump(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("error\ncannot open %s\n", path);
        return;
    }
    static char buf[TL_CONF_MAX_BYTES * 2];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    static tl_config c;
    if (tl_config_parse_file(&c, buf, n, path, NULL) != 0) {
        printf("error\n%s", c.errmsg);
        return;
    }
    printf("ok\nstate=%s\nelastic=%d\n", c.state_path, c.elastic);
    if (c.ctx_reserve_set)
        printf("context_reserve=%llu\n", (unsigned long long)c.ctx_reserve);
    else
        printf("context_reserve=measured\n");
    for (int i = 0; i < c.ndev; i++) {
        printf("device %d %s %llu %u\n", i, c.uuid[i], (unsigned long long)c.mem_limit[i], c.sm_limit[i]);
        if (c.ceiling[i])
            printf("ceiling %d %llu %s\n", i, (unsigned long long)c.ceiling[i], c.budget_path[i]);
    }
    if (c.borrower[0])
        printf("borrower=%s\n", c.borrower);
    if (c.reclaim_path[0])
        printf("reclaim=%s\n", c.reclaim_path);
    printf("reclaim_wait=%u\n", c.reclaim_wait_ms);
}

/* conf_dump budget SELF FILE: what the limiter lends SELF from a budget file */
static int budget(const char *self, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 2;
    static char buf[TL_BUDGET_MAX_BYTES * 2];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    uint64_t avail;
    char err[160];
    if (tl_budget_parse(buf, n, self, &avail, err, sizeof(err)) != 0)
        printf("error\n%s\n", err);
    else
        printf("ok %llu\n", (unsigned long long)avail);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "budget"))
        return budget(argv[2], argv[3]);
    if (argc < 2) {
        fprintf(stderr, "usage: conf_dump FILE...\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        dump(argv[i]);
        if (argc > 2)
            printf("--end--\n");
    }
    return 0;
}
