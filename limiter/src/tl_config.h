/* tl_config.h - limiter configuration parsed from the environment. */
#ifndef TL_CONFIG_H
#define TL_CONFIG_H

#include <stdint.h>
#include "tl_state.h"

#define TL_DEFAULT_STATE_PATH "/tmp/tessera-limiter.state"

typedef struct tl_config {
    int error;                          /* nonzero: fail closed */
    int mem_active;                     /* any memory limit configured */
    int sm_active;                      /* any SM limit below 100 */
    int elastic;                        /* TESSERA_SM_ELASTIC=1 */
    uint64_t mem_limit[TL_MAX_DEVICES]; /* bytes, 0 = unlimited */
    uint32_t sm_limit[TL_MAX_DEVICES];  /* percent, 0 = unlimited */
    uint64_t ctx_reserve;               /* bytes charged per context */
    int ctx_reserve_set;                /* TESSERA_CONTEXT_RESERVE given (else measured) */
    char state_path[4096];
    char errmsg[1024];                  /* what was wrong, for stderr */
} tl_config;

/* Parse a size: decimal digits with an optional k/m/g/t suffix (any case,
 * powers of 1024). Returns 0 and sets *out, or -1 when malformed or
 * overflowing. */
int tl_parse_size(const char *s, uint64_t *out);

/* Fill `c` from `envp` (NULL-terminated NAME=VALUE array). Malformed
 * values set c->error and are described in c->errmsg (one line each);
 * nothing is printed here. Returns c->error. */
int tl_config_parse(tl_config *c, char *const *envp);

#endif
