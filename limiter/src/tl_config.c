/* tl_config.c - environment parsing. Fails closed on anything malformed. */
#include "tl_config.h"

#include <stdio.h>
#include <string.h>

int tl_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return -1;
    uint64_t v = 0;
    const char *p = s;
    while (*p >= '0' && *p <= '9') {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
        p++;
    }
    if (p == s)
        return -1;
    unsigned shift = 0;
    switch (*p) {
    case '\0': break;
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    case 't': case 'T': shift = 40; p++; break;
    default: return -1;
    }
    if (*p != '\0')
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

static int parse_percent(const char *s, uint32_t *out)
{
    if (!s || !*s)
        return -1;
    uint32_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (uint32_t)(*p - '0');
        if (v > 100)
            return -1;
    }
    *out = v;
    return 0;
}

/* "NAME_<i>" suffix -> device index, or -1 if not a valid index. */
static int parse_index(const char *s, size_t len)
{
    if (len == 0 || len > 2)
        return -1;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v < TL_MAX_DEVICES ? v : -1;
}

static void bad(tl_config *c, const char *name, size_t nlen, const char *val, const char *why)
{
    size_t used = strlen(c->errmsg);
    snprintf(c->errmsg + used, sizeof(c->errmsg) - used,
             "tessera-limiter: invalid %.*s=\"%.200s\": %s; refusing GPU allocations (fail closed)\n", (int)nlen,
             name, val, why);
    c->error = 1;
}

#define MEM "CUDA_DEVICE_MEMORY_LIMIT"
#define SM "CUDA_DEVICE_SM_LIMIT"

int tl_config_parse(tl_config *c, char *const *envp)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->state_path, sizeof(c->state_path), "%s", TL_DEFAULT_STATE_PATH);
    uint64_t mem_all = 0, mem_dev[TL_MAX_DEVICES] = {0};
    uint32_t sm_all = 0, sm_dev[TL_MAX_DEVICES] = {0};
    int have_mem_dev[TL_MAX_DEVICES] = {0}, have_sm_dev[TL_MAX_DEVICES] = {0};

    for (char *const *e = envp; e && *e; e++) {
        const char *kv = *e, *eq = strchr(kv, '=');
        if (!eq)
            continue;
        size_t nlen = (size_t)(eq - kv);
        const char *val = eq + 1;
        if (nlen == strlen(MEM) && !strncmp(kv, MEM, nlen)) {
            if (tl_parse_size(val, &mem_all) != 0)
                bad(c, kv, nlen, val, "want bytes with optional k/m/g/t suffix, e.g. 4096m");
        } else if (nlen > strlen(MEM) + 1 && !strncmp(kv, MEM "_", strlen(MEM) + 1)) {
            int i = parse_index(kv + strlen(MEM) + 1, nlen - strlen(MEM) - 1);
            if (i < 0)
                bad(c, kv, nlen, val, "bad device index");
            else if (tl_parse_size(val, &mem_dev[i]) != 0)
                bad(c, kv, nlen, val, "want bytes with optional k/m/g/t suffix, e.g. 4096m");
            else
                have_mem_dev[i] = 1;
        } else if (nlen == strlen(SM) && !strncmp(kv, SM, nlen)) {
            if (parse_percent(val, &sm_all) != 0)
                bad(c, kv, nlen, val, "want an integer percentage 0..100");
        } else if (nlen > strlen(SM) + 1 && !strncmp(kv, SM "_", strlen(SM) + 1)) {
            int i = parse_index(kv + strlen(SM) + 1, nlen - strlen(SM) - 1);
            if (i < 0)
                bad(c, kv, nlen, val, "bad device index");
            else if (parse_percent(val, &sm_dev[i]) != 0)
                bad(c, kv, nlen, val, "want an integer percentage 0..100");
            else
                have_sm_dev[i] = 1;
        } else if (nlen == strlen("CUDA_DEVICE_MEMORY_SHARED_CACHE") &&
                   !strncmp(kv, "CUDA_DEVICE_MEMORY_SHARED_CACHE", nlen)) {
            if (!*val || strlen(val) >= sizeof(c->state_path))
                bad(c, kv, nlen, val, "want a file path");
            else
                snprintf(c->state_path, sizeof(c->state_path), "%s", val);
        } else if (nlen == strlen("TESSERA_SM_ELASTIC") && !strncmp(kv, "TESSERA_SM_ELASTIC", nlen)) {
            if (!strcmp(val, "1"))
                c->elastic = 1;
            else if (strcmp(val, "0") && *val)
                bad(c, kv, nlen, val, "want 0 or 1");
        } else if (nlen == strlen("TESSERA_CONTEXT_RESERVE") &&
                   !strncmp(kv, "TESSERA_CONTEXT_RESERVE", nlen)) {
            if (tl_parse_size(val, &c->ctx_reserve) != 0)
                bad(c, kv, nlen, val, "want bytes with optional k/m/g/t suffix");
            else
                c->ctx_reserve_set = 1;
        }
    }
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        c->mem_limit[i] = have_mem_dev[i] ? mem_dev[i] : mem_all;
        uint32_t sm = have_sm_dev[i] ? sm_dev[i] : sm_all;
        c->sm_limit[i] = sm >= 100 ? 0 : sm;
        if (c->mem_limit[i])
            c->mem_active = 1;
        if (c->sm_limit[i])
            c->sm_active = 1;
    }
    return c->error;
}
