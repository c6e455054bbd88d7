/*
 * fake_gpa.c - cuGetProcAddress[_v2] of the fake driver. Like the real
 * driver it answers a base name with the variant for the version asked
 * (cuda-abi/tl_procaddr.c, checked against the real libcuda), and only
 * from its own entry points: it never calls dlsym, which the limiter
 * intercepts.
 *
 * FAKE_GPA_THUNKS=1: hand out internal trampolines instead of the exported
 * functions, as a driver may. FAKE_GPA_STUBS=1: answer names the fake does
 * not implement with a stub returning CUDA_ERROR_NOT_SUPPORTED (the real
 * CUDA runtime insists on having all ~380 it asks for). FAKE_GPA_LOG=FILE:
 * append every request ("name version flags") to FILE.
 */
#include "fake.h"

#include "tl_procaddr.h"

#define ENTRY(ret, name, args) {#name, (void *)name},
static const struct {
    const char *name;
    void *fn;
} entries[] = {FAKE_API_LIST(ENTRY)};

void *fake_entry(const char *name)
{
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
        if (!strcmp(entries[i].name, name))
            return entries[i].fn;
    return NULL;
}

/* Trampolines: every entry point takes at most 11 integer or pointer
 * arguments, which these forward unchanged. */
typedef long (*fn11)(long, long, long, long, long, long, long, long, long, long, long);
#define NTHUNK 128
static void *thunk_target[NTHUNK];
#define THUNK(n, i)                                                                                \
    static long thunk_##n(long a, long b, long c, long d, long e, long f, long g, long h, long j,  \
                          long k, long l)                                                          \
    {                                                                                              \
        return ((fn11)thunk_target[i])(a, b, c, d, e, f, g, h, j, k, l);                           \
    }
#define T8(a)                                                                                      \
    THUNK(a##0, a * 8 + 0) THUNK(a##1, a * 8 + 1) THUNK(a##2, a * 8 + 2) THUNK(a##3, a * 8 + 3)   \
    THUNK(a##4, a * 8 + 4) THUNK(a##5, a * 8 + 5) THUNK(a##6, a * 8 + 6) THUNK(a##7, a * 8 + 7)
T8(0) T8(1) T8(2) T8(3) T8(4) T8(5) T8(6) T8(7) T8(8) T8(9) T8(10) T8(11) T8(12) T8(13) T8(14) T8(15)
#define R8(a) (void *)thunk_##a##0, (void *)thunk_##a##1, (void *)thunk_##a##2, (void *)thunk_##a##3, \
              (void *)thunk_##a##4, (void *)thunk_##a##5, (void *)thunk_##a##6, (void *)thunk_##a##7,
static void *const thunks[NTHUNK] = {R8(0) R8(1) R8(2) R8(3) R8(4) R8(5) R8(6) R8(7) R8(8) R8(9) R8(10) R8(11)
                                         R8(12) R8(13) R8(14) R8(15)};
static pthread_mutex_t tmu = PTHREAD_MUTEX_INITIALIZER;
static int nthunk;

static void *thunk_for(void *fn)
{
    pthread_mutex_lock(&tmu);
    void *t = NULL;
    for (int i = 0; i < nthunk && !t; i++)
        if (thunk_target[i] == fn)
            t = thunks[i];
    if (!t && nthunk < NTHUNK) {
        thunk_target[nthunk] = fn;
        t = thunks[nthunk++];
    }
    pthread_mutex_unlock(&tmu);
    return t;
}

static void log_request(const char *sym, int ver, unsigned long long flags)
{
    const char *path = getenv("FAKE_GPA_LOG");
    if (!path)
        return;
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%s %d %llu\n", sym, ver, flags);
        fclose(f);
    }
}

static CUresult not_supported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

/* cuGetExportTable hands out the driver's internal function tables by UUID
 * (undocumented); the CUDA runtime needs them. The fake has none: it logs
 * the request and refuses. */
static CUresult no_export_table(const void **table, const unsigned char *id)
{
    const char *path = getenv("FAKE_GPA_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "#export-table ");
        for (int i = 0; id && i < 16; i++)
            fprintf(f, "%02x", id[i]);
        fprintf(f, "\n");
        fclose(f);
    }
    if (table)
        *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags,
                                         int *status)
{
    if (!sym || !pfn || strlen(sym) > 200)
        return CUDA_ERROR_INVALID_VALUE;
    log_request(sym, ver, flags);
    char name[256];
    void *p = NULL;
    if (tl_pa_known(sym)) {
        if (tl_pa_resolve(sym, ver, flags, name, sizeof(name)) == 0)
            p = fake_entry(name);
    } else {
        if (flags & TL_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
            snprintf(name, sizeof(name), "%s_ptsz", sym);
            p = fake_entry(name);
        }
        if (!p)
            p = fake_entry(sym);
    }
    if (!p && getenv("FAKE_GPA_STUBS") && !strcmp(sym, "cuGetExportTable"))
        p = (void *)no_export_table;
    if (!p && getenv("FAKE_GPA_STUBS") && !strncmp(sym, "cu", 2))
        p = (void *)not_supported;
    if (p && getenv("FAKE_GPA_THUNKS"))
        p = thunk_for(p);
    *pfn = p;
    if (status)
        *status = p ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FAKE_EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
