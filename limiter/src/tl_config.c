/* tl_config.c - see tl_config.h. Fails closed on anything malformed. */
#include "tl_compat.h"

#include "tl_config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

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

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int tl_uuid_parse(const char *s, unsigned char out[16])
{
    if (!s || (strncmp(s, "GPU-", 4) && strncmp(s, "MIG-", 4)))
        return -1;
    s += 4;
    /* 8-4-4-4-12 */
    static const int dash_after[] = {4, 6, 8, 10}; /* byte counts after which a '-' follows */
    int b = 0, d = 0;
    while (b < 16) {
        int hi = hexval(s[0]), lo = hi < 0 ? -1 : hexval(s[1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[b++] = (unsigned char)(hi << 4 | lo);
        s += 2;
        if (d < 4 && b == dash_after[d]) {
            if (*s != '-')
                return -1;
            s++;
            d++;
        }
    }
    return *s ? -1 : 0;
}

void tl_uuid_format(const unsigned char b[16], char *out, size_t n)
{
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int parse_uint(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    if (len == 0 || (len > 1 && s[0] == '0'))
        return -1; /* empty, or a leading zero */
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
        if (v > max)
            return -1;
    }
    *out = v;
    return 0;
}

static int parse_percent(const char *s, uint32_t *out)
{
    uint64_t v;
    if (!s || parse_uint(s, strlen(s), 100, &v) != 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* appends to a NUL-terminated buffer of size n, truncating */
static void vappend(char *buf, size_t n, const char *fmt, va_list ap)
{
    size_t used = strlen(buf);
    vsnprintf(buf + used, n - used, fmt, ap);
}

static void bad(tl_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(tl_config *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappend(c->errmsg, sizeof(c->errmsg), fmt, ap);
    va_end(ap);
    size_t used = strlen(c->errmsg);
    snprintf(c->errmsg + used, sizeof(c->errmsg) - used, "; refusing GPU allocations (fail closed)\n");
    c->error = 1;
}

static void reset(tl_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->state_path, sizeof(c->state_path), "%s", TL_DEFAULT_STATE_PATH);
}

static void finish(tl_config *c)
{
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        if (c->sm_limit[i] >= 100)
            c->sm_limit[i] = 0;
        if (c->mem_limit[i])
            c->mem_active = 1;
        if (c->sm_limit[i])
            c->sm_active = 1;
    }
}

static int is_debug_value(const char *v)
{
    return !*v || !strcmp(v, "0") || !strcmp(v, "1");
}

static void note(tl_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(tl_config *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappend(c->notes, sizeof(c->notes), fmt, ap);
    va_end(ap);
}

/* TESSERA_LIMITER_TRACE: a path prefix; each process appends to
 * "<prefix>.<pid>" (diagnostics, never limits). Empty: off. Too long: off
 * as well (a diagnostics variable never changes enforcement); said on
 * stderr with TESSERA_LIMITER_DEBUG=1 (trace_finish). */
static void set_trace(tl_config *c, const char *v, int *too_long)
{
    if (strlen(v) + 16 >= sizeof(c->trace_path)) {
        c->trace_path[0] = 0;
        *too_long = 1;
        return;
    }
    snprintf(c->trace_path, sizeof(c->trace_path), "%s", v);
    *too_long = 0;
}

static void trace_finish(tl_config *c, int too_long)
{
    if (too_long && c->debug)
        note(c, "tessera-limiter: TESSERA_LIMITER_TRACE longer than %d bytes; ignored (no trace)\n",
             (int)sizeof(c->trace_path) - 17);
}

/* The diagnostics variables (TESSERA_LIMITER_DEBUG, TESSERA_LIMITER_TRACE)
 * are not taken from the environment of a program run with more privilege
 * than its caller (setuid, setgid, file capabilities: AT_SECURE): the trace
 * file would be created or appended to, as root, at a path the caller
 * chose. */
static int is_diag(const char *kv)
{
    return !strncmp(kv, "TESSERA_LIMITER_DEBUG=", 22) || !strncmp(kv, "TESSERA_LIMITER_TRACE=", 22);
}

static void secure_note(tl_config *c, int ignored)
{
    if (ignored)
        note(c, "tessera-limiter: TESSERA_LIMITER_DEBUG/TESSERA_LIMITER_TRACE ignored in a setuid, setgid or "
                "file-capability program\n");
}

/* ---- environment ---- */

#define MEM "CUDA_DEVICE_MEMORY_LIMIT"
#define SM "CUDA_DEVICE_SM_LIMIT"
#define CACHE "CUDA_DEVICE_MEMORY_SHARED_CACHE"

/* Names the limiter owns: anything in them that it does not know is a
 * mistake (a typo, an index that does not parse) and fails closed. */
static const char *const owned_prefixes[] = {MEM, SM, CACHE, "TESSERA_SM_", "TESSERA_CONTEXT_", "TESSERA_LIMITER_"};

/* HAMi-core settings that loosen its limits; Tessera's limiter does not
 * implement them, keeps its limits and says so. */
static const char *const hami_loosening[] = {"CUDA_DISABLE_CONTROL", "CUDA_OVERSUBSCRIBE",
                                             "GPU_CORE_UTILIZATION_POLICY", "CUDA_TASK_PRIORITY"};

static int name_is(const char *kv, size_t nlen, const char *name)
{
    return nlen == strlen(name) && !strncmp(kv, name, nlen);
}

/* "NAME_<i>": i in 0..15, no leading zero; -1 if not. */
static int index_suffix(const char *kv, size_t nlen, const char *prefix)
{
    size_t pl = strlen(prefix);
    uint64_t v;
    if (nlen <= pl + 1 || strncmp(kv, prefix, pl) || kv[pl] != '_' ||
        parse_uint(kv + pl + 1, nlen - pl - 1, TL_MAX_DEVICES - 1, &v) != 0)
        return -1;
    return (int)v;
}

static int parse_env(tl_config *c, char *const *envp, int secure)
{
    reset(c);
    int trace_too_long = 0, diag_ignored = 0;
    uint64_t mem_all = 0, mem_dev[TL_MAX_DEVICES] = {0};
    uint32_t sm_all = 0, sm_dev[TL_MAX_DEVICES] = {0};
    int have_mem_dev[TL_MAX_DEVICES] = {0}, have_sm_dev[TL_MAX_DEVICES] = {0};

    for (char *const *e = envp; e && *e; e++) {
        const char *kv = *e, *eq = strchr(kv, '=');
        if (!eq)
            continue;
        size_t nlen = (size_t)(eq - kv);
        const char *val = eq + 1;
        int owned = 0;
        for (size_t k = 0; k < sizeof(owned_prefixes) / sizeof(owned_prefixes[0]); k++)
            owned |= !strncmp(kv, owned_prefixes[k], strlen(owned_prefixes[k])) && nlen >= strlen(owned_prefixes[k]);
        for (size_t k = 0; k < sizeof(hami_loosening) / sizeof(hami_loosening[0]); k++)
            if (name_is(kv, nlen, hami_loosening[k])) {
                size_t u = strlen(c->notes);
                snprintf(c->notes + u, sizeof(c->notes) - u,
                         "tessera-limiter: %.*s=\"%.100s\" is a HAMi-core setting this limiter does not implement; "
                         "the limits stay in force\n", (int)nlen, kv, val);
            }
        if (!owned)
            continue;
        if (secure && is_diag(kv)) {
            diag_ignored = 1;
            continue;
        }
        /* a second definition of the same name (execve allows it): which one
         * a program sees is unclear, so neither is trusted */
        for (char *const *f = envp; f != e; f++)
            if (!strncmp(*f, kv, nlen + 1)) {
                bad(c, "tessera-limiter: %.*s is set twice", (int)nlen, kv);
                break;
            }
        int i;
        if (name_is(kv, nlen, MEM)) {
            if (tl_parse_size(val, &mem_all) != 0)
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want bytes with optional k/m/g/t suffix, e.g. 4096m",
                    (int)nlen, kv, val);
        } else if ((i = index_suffix(kv, nlen, MEM)) >= 0) {
            if (tl_parse_size(val, &mem_dev[i]) != 0)
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want bytes with optional k/m/g/t suffix, e.g. 4096m",
                    (int)nlen, kv, val);
            else
                have_mem_dev[i] = 1;
        } else if (name_is(kv, nlen, SM)) {
            if (parse_percent(val, &sm_all) != 0)
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want an integer percentage 0..100", (int)nlen, kv,
                    val);
        } else if ((i = index_suffix(kv, nlen, SM)) >= 0) {
            if (parse_percent(val, &sm_dev[i]) != 0)
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want an integer percentage 0..100", (int)nlen, kv,
                    val);
            else
                have_sm_dev[i] = 1;
        } else if (name_is(kv, nlen, CACHE)) {
            if (!*val || strlen(val) >= sizeof(c->state_path))
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want a file path", (int)nlen, kv, val);
            else
                snprintf(c->state_path, sizeof(c->state_path), "%s", val);
        } else if (name_is(kv, nlen, "TESSERA_SM_ELASTIC")) {
            if (!strcmp(val, "1"))
                c->elastic = 1;
            else if (strcmp(val, "0") && *val)
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want 0 or 1", (int)nlen, kv, val);
        } else if (name_is(kv, nlen, "TESSERA_CONTEXT_RESERVE")) {
            if (tl_parse_size(val, &c->ctx_reserve) != 0)
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want bytes with optional k/m/g/t suffix",
                    (int)nlen, kv, val);
            else
                c->ctx_reserve_set = 1;
        } else if (name_is(kv, nlen, "TESSERA_LIMITER_DEBUG")) {
            if (!is_debug_value(val))
                bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": want 0 or 1", (int)nlen, kv, val);
            c->debug = !strcmp(val, "1");
        } else if (name_is(kv, nlen, "TESSERA_LIMITER_TRACE")) {
            set_trace(c, val, &trace_too_long);
        } else {
            bad(c, "tessera-limiter: invalid %.*s=\"%.200s\": not a variable of this limiter (bad device index "
                   "or unknown name; devices are _0 to _%d)", (int)nlen, kv, val, TL_MAX_DEVICES - 1);
        }
    }
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        c->mem_limit[i] = have_mem_dev[i] ? mem_dev[i] : mem_all;
        c->sm_limit[i] = have_sm_dev[i] ? sm_dev[i] : sm_all;
    }
    trace_finish(c, trace_too_long);
    secure_note(c, diag_ignored);
    finish(c);
    return c->error;
}

int tl_config_parse(tl_config *c, char *const *envp)
{
    return parse_env(c, envp, 0);
}

/* ---- limits file ---- */

/* a value of "<decimal>m" (MiB) */
static int parse_mib(const char *v, size_t len, uint64_t *bytes)
{
    uint64_t mib;
    if (len < 2 || v[len - 1] != 'm' || parse_uint(v, len - 1, (UINT64_MAX >> 20), &mib) != 0)
        return -1;
    *bytes = mib << 20;
    return 0;
}

/* The next setting of a key=value file from *pos: empty lines and
 * comments skipped, *line counted; *ll is its length, *clean 0 when it
 * holds a control character, a space or a non-ASCII byte. NULL at the end. */
static const char *next_setting(const char *text, size_t len, size_t *pos, int *line, size_t *ll, int *clean)
{
    while (*pos < len) {
        const char *l = text + *pos, *nl = memchr(l, '\n', len - *pos);
        *ll = nl ? (size_t)(nl - l) : len - *pos;
        *pos += *ll + 1;
        (*line)++;
        if (*ll == 0 || l[0] == '#')
            continue;
        *clean = 1;
        for (size_t i = 0; i < *ll; i++)
            if ((unsigned char)l[i] <= 0x20 || (unsigned char)l[i] >= 0x7f)
                *clean = 0;
        return l;
    }
    return NULL;
}

enum { F_UUID = 1, F_MEM = 2, F_SM = 4, F_CEIL = 8, F_BUDGET = 16 };

static int is_borrower(const char *v, size_t len)
{
    if (len != TL_BORROWER_LEN)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f')))
            return 0;
    return 1;
}

static int parse_file(tl_config *c, const char *text, size_t len, const char *path, char *const *envp, int secure)
{
    reset(c);
    c->from_file = 1;
    int trace_too_long = 0, diag_ignored = 0;
    for (char *const *e = envp; e && *e; e++)
        if (secure && is_diag(*e))
            diag_ignored = 1;
        else if (!strncmp(*e, "TESSERA_LIMITER_DEBUG=", 22))
            c->debug = !strcmp(*e + 22, "1");
        else if (!strncmp(*e, "TESSERA_LIMITER_TRACE=", 22))
            set_trace(c, *e + 22, &trace_too_long); /* diagnostics only: a bad one is ignored */
    trace_finish(c, trace_too_long);
    secure_note(c, diag_ignored);
    int have[TL_MAX_DEVICES] = {0}, seen_version = 0, seen_state = 0, seen_elastic = 0, seen_borrower = 0,
        seen_reclaim = 0, seen_reclaim_wait = 0;
    c->reclaim_wait_ms = TL_RECLAIM_WAIT_MS;
    if (len > TL_CONF_MAX_BYTES) {
        bad(c, "tessera-limiter: %s: larger than %d bytes", path, TL_CONF_MAX_BYTES);
        return c->error;
    }
    size_t pos = 0, ll;
    int line = 0, clean;
    const char *l;
    while (!c->error && (l = next_setting(text, len, &pos, &line, &ll, &clean))) {
        if (!clean) {
            bad(c, "tessera-limiter: %s line %d: control character, space or non-ASCII byte", path, line);
            break;
        }
        const char *eq = memchr(l, '=', ll);
        if (!eq) {
            bad(c, "tessera-limiter: %s line %d: want key=value", path, line);
            break;
        }
        size_t kl = (size_t)(eq - l), vl = ll - kl - 1;
        const char *v = eq + 1;
        char val[4096];
        if (vl >= sizeof(val)) {
            bad(c, "tessera-limiter: %s line %d: value longer than %zu bytes", path, line, sizeof(val) - 1);
            break;
        }
        memcpy(val, v, vl);
        val[vl] = 0;
#define KEY(k) (kl == strlen(k) && !strncmp(l, k, kl))
        if (!seen_version) {
            if (!KEY("version"))
                bad(c, "tessera-limiter: %s line %d: the first setting must be version=1", path, line);
            else if (strcmp(val, "1"))
                bad(c, "tessera-limiter: %s line %d: unsupported version \"%.40s\" (this limiter reads version 1)",
                    path, line, val);
            seen_version = 1;
            continue;
        }
        if (KEY("version")) {
            bad(c, "tessera-limiter: %s line %d: version given twice", path, line);
        } else if (KEY("state")) {
            if (seen_state++)
                bad(c, "tessera-limiter: %s line %d: state given twice", path, line);
            else if (val[0] != '/')
                bad(c, "tessera-limiter: %s line %d: state=\"%.200s\" is not an absolute path", path, line, val);
            else
                snprintf(c->state_path, sizeof(c->state_path), "%s", val);
        } else if (KEY("elastic")) {
            if (seen_elastic++)
                bad(c, "tessera-limiter: %s line %d: elastic given twice", path, line);
            else if (strcmp(val, "0") && strcmp(val, "1"))
                bad(c, "tessera-limiter: %s line %d: elastic=\"%.40s\": want 0 or 1", path, line, val);
            else
                c->elastic = val[0] == '1';
        } else if (KEY("context_reserve")) {
            if (c->ctx_reserve_set++)
                bad(c, "tessera-limiter: %s line %d: context_reserve given twice", path, line);
            else if (parse_mib(val, vl, &c->ctx_reserve) != 0)
                bad(c, "tessera-limiter: %s line %d: context_reserve=\"%.40s\": want MiB, e.g. 256m", path, line, val);
        } else if (KEY("borrower")) {
            if (seen_borrower++)
                bad(c, "tessera-limiter: %s line %d: borrower given twice", path, line);
            else if (!is_borrower(val, vl))
                bad(c, "tessera-limiter: %s line %d: borrower=\"%.40s\": want %d lower-case hex digits", path, line,
                    val, TL_BORROWER_LEN);
            else
                memcpy(c->borrower, val, vl + 1);
        } else if (KEY("reclaim")) {
            if (seen_reclaim++)
                bad(c, "tessera-limiter: %s line %d: reclaim given twice", path, line);
            else if (val[0] != '/' || vl >= TL_RECLAIM_PATH_MAX)
                bad(c, "tessera-limiter: %s line %d: reclaim=\"%.200s\": want an absolute path of at most %d bytes",
                    path, line, val, TL_RECLAIM_PATH_MAX - 1);
            else
                memcpy(c->reclaim_path, val, vl + 1);
        } else if (KEY("reclaim_wait")) {
            uint64_t ms;
            if (seen_reclaim_wait++)
                bad(c, "tessera-limiter: %s line %d: reclaim_wait given twice", path, line);
            else if (vl < 3 || strcmp(val + vl - 2, "ms") || parse_uint(val, vl - 2, TL_RECLAIM_WAIT_MAX_MS, &ms) != 0)
                bad(c, "tessera-limiter: %s line %d: reclaim_wait=\"%.40s\": want milliseconds from 0ms to %dms, e.g. "
                       "2000ms", path, line, val, TL_RECLAIM_WAIT_MAX_MS);
            else
                c->reclaim_wait_ms = (uint32_t)ms;
        } else if (kl > 7 && !strncmp(l, "device.", 7)) {
            const char *ip = l + 7, *dot = memchr(ip, '.', kl - 7);
            uint64_t i;
            if (!dot || parse_uint(ip, (size_t)(dot - ip), TL_MAX_DEVICES - 1, &i) != 0) {
                bad(c, "tessera-limiter: %s line %d: \"%.*s\": want device.<0..%d>.<uuid|memory|sm|ceiling|budget>", path, line,
                    (int)kl, l, TL_MAX_DEVICES - 1);
                break;
            }
            const char *f = dot + 1;
            size_t fl = kl - (size_t)(f - l);
            int bit = fl == 4 && !strncmp(f, "uuid", 4) ? F_UUID : fl == 6 && !strncmp(f, "memory", 6) ? F_MEM
                      : fl == 2 && !strncmp(f, "sm", 2)  ? F_SM
                      : fl == 7 && !strncmp(f, "ceiling", 7) ? F_CEIL
                      : fl == 6 && !strncmp(f, "budget", 6) ? F_BUDGET : 0;
            if (!bit) {
                bad(c, "tessera-limiter: %s line %d: unknown key \"%.*s\"", path, line, (int)kl, l);
            } else if (have[i] & bit) {
                bad(c, "tessera-limiter: %s line %d: %.*s given twice", path, line, (int)kl, l);
            } else if (bit == F_UUID) {
                if (tl_uuid_parse(val, c->uuid_bin[i]) != 0)
                    bad(c, "tessera-limiter: %s line %d: %.*s=\"%.60s\" is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-"
                           "xxxx-xxxxxxxxxxxx)", path, line, (int)kl, l, val);
                for (size_t k = 0; k < 4; k++)
                    c->uuid[i][k] = val[k];
                for (size_t k = 4; k < vl && k < TL_UUID_STR - 1; k++)
                    c->uuid[i][k] = (char)(val[k] >= 'A' && val[k] <= 'F' ? val[k] - 'A' + 'a' : val[k]);
            } else if (bit == F_MEM) {
                if (parse_mib(val, vl, &c->mem_limit[i]) != 0)
                    bad(c, "tessera-limiter: %s line %d: %.*s=\"%.40s\": want MiB, e.g. 4096m (0m: no memory limit)",
                        path, line, (int)kl, l, val);
            } else if (bit == F_CEIL) {
                if (parse_mib(val, vl, &c->ceiling[i]) != 0 || !c->ceiling[i])
                    bad(c, "tessera-limiter: %s line %d: %.*s=\"%.40s\": want MiB above the memory limit, e.g. 8192m",
                        path, line, (int)kl, l, val);
            } else if (bit == F_BUDGET) {
                if (val[0] != '/' || vl >= TL_BUDGET_PATH_MAX)
                    bad(c, "tessera-limiter: %s line %d: %.*s=\"%.200s\": want an absolute path of at most %d bytes",
                        path, line, (int)kl, l, val, TL_BUDGET_PATH_MAX - 1);
                else
                    memcpy(c->budget_path[i], val, vl + 1);
            } else if (parse_percent(val, &c->sm_limit[i]) != 0) {
                bad(c, "tessera-limiter: %s line %d: %.*s=\"%.40s\": want an integer percentage 0..100", path, line,
                    (int)kl, l, val);
            }
            have[i] |= bit;
        } else {
            bad(c, "tessera-limiter: %s line %d: unknown key \"%.*s\"", path, line, (int)kl, l);
        }
#undef KEY
    }
    if (c->error)
        return c->error;
    if (!seen_version) {
        bad(c, "tessera-limiter: %s: empty (want version=1 and the devices)", path);
        return c->error;
    }
    int n = 0;
    while (n < TL_MAX_DEVICES && have[n])
        n++;
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        if (i >= n && have[i])
            bad(c, "tessera-limiter: %s: device.%d given but device.%d is missing (devices are numbered from 0)",
                path, i, n);
        else if (i < n && (have[i] & (F_UUID | F_MEM | F_SM)) != (F_UUID | F_MEM | F_SM))
            bad(c, "tessera-limiter: %s: device.%d needs uuid, memory and sm", path, i);
        else if (i < n && !(have[i] & F_CEIL) != !(have[i] & F_BUDGET))
            bad(c, "tessera-limiter: %s: device.%d: ceiling and budget go together", path, i);
        else if (i < n && (have[i] & F_CEIL) && (!c->mem_limit[i] || c->ceiling[i] <= c->mem_limit[i]))
            bad(c, "tessera-limiter: %s: device.%d.ceiling %llum is not above its memory limit %llum", path, i,
                (unsigned long long)(c->ceiling[i] >> 20), (unsigned long long)(c->mem_limit[i] >> 20));
        else if (i < n && (have[i] & F_CEIL) && !seen_borrower)
            bad(c, "tessera-limiter: %s: device.%d has a ceiling but the file has no borrower=", path, i);
        if (i < n && (have[i] & F_CEIL))
            c->burst_active = 1;
        for (int j = 0; j < i && i < n; j++)
            if (!memcmp(c->uuid_bin[i], c->uuid_bin[j], 16))
                bad(c, "tessera-limiter: %s: device.%d and device.%d have the same uuid", path, j, i);
    }
    if (n == 0)
        bad(c, "tessera-limiter: %s: no device", path);
    if (!seen_state)
        bad(c, "tessera-limiter: %s: state= (the shared state file) is missing", path);
    c->ndev = n;
    finish(c);
    return c->error;
}

int tl_budget_parse(const char *text, size_t len, const char *self, uint64_t *avail, char *err, size_t errlen)
{
    uint64_t ung = 0, others = 0;
    int line = 0, seen_version = 0, seen_ung = 0;
    size_t pos = 0;
    *avail = 0;
    err[0] = 0;
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (len > TL_BUDGET_MAX_BYTES)
        BAD("larger than %d bytes", TL_BUDGET_MAX_BYTES);
    size_t ll;
    int clean;
    const char *l;
    while ((l = next_setting(text, len, &pos, &line, &ll, &clean))) {
        if (!clean)
            BAD("line %d: control character, space or non-ASCII byte", line);
        const char *eq = memchr(l, '=', ll);
        if (!eq)
            BAD("line %d: want key=value", line);
        size_t kl = (size_t)(eq - l), vl = ll - kl - 1;
        uint64_t b;
        if (!seen_version) {
            if (kl != 7 || strncmp(l, "version", 7) || vl != 1 || eq[1] != '1')
                BAD("line %d: the first setting must be version=1", line);
            seen_version = 1;
        } else if (kl == 12 && !strncmp(l, "unguaranteed", 12)) {
            if (seen_ung++ || parse_mib(eq + 1, vl, &b) != 0)
                BAD("line %d: unguaranteed given twice or not MiB", line);
            ung = b;
        } else if (kl == 9 + TL_BORROWER_LEN && !strncmp(l, "borrower.", 9) && is_borrower(l + 9, TL_BORROWER_LEN)) {
            if (parse_mib(eq + 1, vl, &b) != 0)
                BAD("line %d: %.*s: want MiB", line, (int)kl, l);
            if (!self || strncmp(l + 9, self, TL_BORROWER_LEN))
                others = others + b < others ? UINT64_MAX : others + b;
        } else {
            BAD("line %d: unknown key \"%.*s\"", line, (int)(kl < 60 ? kl : 60), l);
        }
    }
    if (!seen_version || !seen_ung)
        BAD("want version=1 and unguaranteed=");
#undef BAD
    *avail = ung > others ? ung - others : 0;
    return 0;
}

int tl_config_parse_file(tl_config *c, const char *text, size_t len, const char *path, char *const *envp)
{
    return parse_file(c, text, len, path, envp, 0);
}

int tl_config_load(tl_config *c, const char *path, char *const *envp)
{
    return tl_config_load_as(c, path, envp, getauxval(AT_SECURE) != 0);
}

int tl_config_load_as(tl_config *c, const char *path, char *const *envp, int secure)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR))
        return parse_env(c, envp, secure);
    if (fd < 0) {
        int e = errno;
        reset(c);
        c->from_file = 1;
        bad(c, "tessera-limiter: cannot read %s: %s", path, strerror(e));
        return c->error;
    }
    static char buf[TL_CONF_MAX_BYTES + 1];
    size_t n = 0;
    int err = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            err = errno;
            break;
        }
        if (r == 0 || (n += (size_t)r) == sizeof(buf))
            break;
    }
    close(fd);
    if (err) {
        reset(c);
        c->from_file = 1;
        bad(c, "tessera-limiter: cannot read %s: %s", path, strerror(err));
        return c->error;
    }
    return parse_file(c, buf, n, path, envp, secure);
}
