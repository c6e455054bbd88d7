/*
 * tl_config.h - the limiter's configuration, from the read-only limits file
 * the node agent mounts (TL_CONF_PATH) or, when there is none, from the
 * HAMi-compatible environment. Pure: the parsers take text and envp, and
 * report problems in errmsg; tl_config_load does the one read.
 *
 * Limits file, version 1 (docs/isolation.md has the full grammar; the Go
 * writer is internal/limiterconf):
 *
 *   # written by the Tessera node agent
 *   version=1
 *   state=/tessera/state/cache
 *   device.0.uuid=GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8
 *   device.0.memory=4096m
 *   device.0.sm=30
 *
 * When the file exists it is authoritative: the limit environment
 * (CUDA_DEVICE_MEMORY_LIMIT*, CUDA_DEVICE_SM_LIMIT*,
 * CUDA_DEVICE_MEMORY_SHARED_CACHE, TESSERA_SM_ELASTIC,
 * TESSERA_CONTEXT_RESERVE) is ignored, because a tenant controls its
 * environment but not a read-only mount. A file that exists but cannot be
 * read or does not parse fails closed. Devices are matched by UUID.
 */
#ifndef TL_CONFIG_H
#define TL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "tl_state.h"

/* Fixed at build time: no environment variable can move it. */
#define TL_CONF_PATH "/etc/tessera/limiter.conf"
#define TL_CONF_MAX_BYTES 65536
#define TL_DEFAULT_STATE_PATH "/tmp/tessera-limiter.state"
#define TL_UUID_STR 48 /* "GPU-" + 36, or "MIG-" + 36, and NUL */
#define TL_BUDGET_PATH_MAX 256  /* device.<i>.budget: an absolute path, at most 255 bytes */
#define TL_BORROWER_LEN 16      /* borrower=: 16 lower-case hex digits */
#define TL_BUDGET_MAX_BYTES 16384
#define TL_RECLAIM_PATH_MAX 256     /* reclaim=: an absolute path, at most 255 bytes */
#define TL_RECLAIM_WAIT_MS 2000     /* reclaim_wait= when not given */
#define TL_RECLAIM_WAIT_MAX_MS 60000

typedef struct tl_config {
    int error;                          /* nonzero: fail closed */
    int from_file;                      /* limits came from the limits file */
    int mem_active;                     /* any memory limit configured */
    int sm_active;                      /* any SM limit below 100 */
    int elastic;                        /* lend idle capacity (TESSERA_SM_ELASTIC / elastic=1) */
    int debug;                          /* TESSERA_LIMITER_DEBUG=1 */
    char trace_path[256];               /* TESSERA_LIMITER_TRACE=<prefix>: diagnostics to
                                         * <prefix>.<pid> (tl_trace); "" = off */
    /* Limits per limiter device index. Environment: the index is the CUDA
     * ordinal. File: the index of device.<i>, matched to CUDA ordinals and
     * NVML handles by UUID. */
    uint64_t mem_limit[TL_MAX_DEVICES]; /* bytes, 0 = unlimited */
    uint32_t sm_limit[TL_MAX_DEVICES];  /* percent, 0 = unlimited */
    int ndev;                           /* file: devices listed (0..ndev-1) */
    char uuid[TL_MAX_DEVICES][TL_UUID_STR];    /* file: as written (lower case) */
    unsigned char uuid_bin[TL_MAX_DEVICES][16]; /* file: the 16 bytes */
    /* Guaranteed plus burst (file only): a device with a ceiling above its
     * memory limit (the guarantee) may allocate past the guarantee, up to
     * the ceiling, from the GPU's unguaranteed memory that the node
     * agent's budget file (budget_path) says no other container borrows.
     * 0 = no ceiling: the memory limit is the limit. */
    uint64_t ceiling[TL_MAX_DEVICES];   /* bytes */
    char budget_path[TL_MAX_DEVICES][TL_BUDGET_PATH_MAX];
    char borrower[TL_BORROWER_LEN + 1]; /* this container's name in the budget files */
    int burst_active;                   /* any device with a ceiling */
    /* Reclaim on refusal (file only): when the driver refuses an
     * allocation within the guarantee, the limiter writes what it needs to
     * reclaim_path (the node agent's "need" file, in the container's
     * writable state directory) and retries for up to reclaim_wait_ms
     * while the agent stops a container bursting on the GPU. "" = off. */
    char reclaim_path[TL_RECLAIM_PATH_MAX];
    uint32_t reclaim_wait_ms;
    uint64_t ctx_reserve;               /* bytes charged per context */
    int ctx_reserve_set;                /* given (else measured) */
    char state_path[4096];
    char errmsg[2048];                  /* what was wrong, one line each, for stderr */
    char notes[1024];                   /* HAMi-core settings that are not implemented */
} tl_config;

/* Parse a size: decimal digits with an optional k/m/g/t suffix (any case,
 * powers of 1024). Returns 0 and sets *out, or -1 when malformed or
 * overflowing. */
int tl_parse_size(const char *s, uint64_t *out);

/* "GPU-01234567-89ab-cdef-0123-456789abcdef" (or MIG-) -> 16 bytes. 0 or -1. */
int tl_uuid_parse(const char *s, unsigned char out[16]);
/* 16 bytes -> "GPU-01234567-89ab-cdef-0123-456789abcdef" (out >= 41 bytes). */
void tl_uuid_format(const unsigned char b[16], char *out, size_t n);

/* Fill `c` from `envp` (NULL-terminated NAME=VALUE array): the
 * environment mode. Malformed values, unknown names in the limiter's
 * namespace (CUDA_DEVICE_MEMORY_LIMIT*, CUDA_DEVICE_SM_LIMIT*,
 * CUDA_DEVICE_MEMORY_SHARED_CACHE*, TESSERA_SM_*, TESSERA_CONTEXT_*,
 * TESSERA_LIMITER_*) and a name given twice set c->error. Returns c->error. */
int tl_config_parse(tl_config *c, char *const *envp);

/* Fill `c` from the text of a limits file (len bytes, not necessarily
 * NUL-terminated); `path` names it in messages. envp is read for
 * TESSERA_LIMITER_DEBUG and TESSERA_LIMITER_TRACE only. Returns c->error. */
int tl_config_parse_file(tl_config *c, const char *text, size_t len, const char *path, char *const *envp);

/* Parse a budget file of the node agent (one per GPU, read-only in the
 * container; docs/isolation.md, "Guaranteed plus burst"):
 *
 *   version=1
 *   unguaranteed=4096m             GPU memory minus every container's guarantee
 *   borrower.<16 hex>=1024m        what a container holds past its guarantee
 *
 * *avail = unguaranteed minus what the borrowers other than `self` hold,
 * never below 0. Returns 0, or -1 with a reason in err (the caller then
 * lends nothing). Strict like the limits file. */
int tl_budget_parse(const char *text, size_t len, const char *self, uint64_t *avail, char *err, size_t errlen);

/* The file at `path` when it exists (absent: ENOENT or ENOTDIR), else the
 * environment. Returns c->error. In a program run with more privilege than
 * its caller (getauxval(AT_SECURE): setuid, setgid, file capabilities) the
 * diagnostics variables TESSERA_LIMITER_DEBUG and TESSERA_LIMITER_TRACE are
 * ignored (a note says so). */
int tl_config_load(tl_config *c, const char *path, char *const *envp);
/* The same with AT_SECURE given: `secure` nonzero ignores the diagnostics
 * variables. */
int tl_config_load_as(tl_config *c, const char *path, char *const *envp, int secure);

#endif
