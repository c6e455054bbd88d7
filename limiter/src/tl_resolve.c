/*
 * tl_resolve.c - configuration, initialisation, the real functions, fork,
 * and the three ways applications reach the driver:
 *   1. by symbol (the application links libcuda/libnvidia-ml and this
 *      library is preloaded ahead of them): the exported wrappers;
 *   2. dlsym(handle_of_libcuda, name): our dlsym() hands out the wrapper
 *      for the names we intercept;
 *   3. cuGetProcAddress[_v2]: the hook asks the real driver; if the answer
 *      is one of the driver's exported functions we intercept, the wrapper
 *      is handed back instead; if it is an address we do not know (a driver
 *      may hand out internal entry points), the variant the driver must have
 *      chosen for that name, version and flags (tl_procaddr.c) is looked up
 *      and its wrapper handed back. For a version newer than the table
 *      knows, an unknown address of an intercepted name is refused.
 * The real functions are found with the real dlsym on handles from
 * dlopen(RTLD_NOW|RTLD_LOCAL), never through our own dlsym.
 */
#include "tl_compat.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tl_clock.h"
#include "tl_driver.h"
#include "tl_internal.h"
#include "tl_procaddr.h"

extern char **environ;

#define DEF_CU(name, args) CUresult(*real_##name) args;
#define DEF_NVML(name, args) nvmlReturn_t(*real_##name) args;
CU_HOOK_LIST(DEF_CU)
CU_AUX_LIST(DEF_CU)
NVML_HOOK_LIST(DEF_NVML)
NVML_AUX_LIST(DEF_NVML)

tl_config cfg;
tl_shared sh;
int tl_cuda_ready, tl_nvml_ready;

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;
static pthread_once_t core_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static NO_SANITIZE void resolve_real_dlsym(void)
{
    static const char *const vers[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof(vers) / sizeof(vers[0]) && !real_dlsym; i++)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", vers[i]);
}

static void trace_after_fork(void);

static void after_fork_child(void)
{
    /* The child owns no GPU memory and no contexts, has no slot yet and no
     * pacing thread (threads do not survive fork). Locks that another
     * parent thread held at fork time are re-initialised, not taken. */
    tl_shared_after_fork(&sh);
    tl_account_after_fork();
    tl_nvml_after_fork();
    tl_alloc_after_fork();
    tl_ctx_after_fork();
    tl_graph_after_fork();
    tl_vmm_after_fork();
    tl_pace_after_fork();
    tl_table_reset_after_fork();
    trace_after_fork();
}

/* The configuration is read when the library is loaded, before the program
 * runs, so a program cannot change its own limits with setenv(). Nothing
 * is printed or opened for the shared state here: most processes never
 * touch the GPU. */
__attribute__((constructor)) static void tl_load(void)
{
    tl_config_load(&cfg, TL_CONF_PATH, environ);
    tl_driver_apply(&cfg, TL_DRIVER_PATH);
}

static void core_init(void)
{
    if (!real_dlsym)
        resolve_real_dlsym();
    if (cfg.error)
        fputs(cfg.errmsg, stderr);
    if (cfg.notes[0])
        fputs(cfg.notes, stderr);
    /* With only an SM limit the shared state is optional: it lets the
     * container's processes pace on their summed utilisation. */
    if (!cfg.error && (cfg.mem_active || cfg.sm_active) && tl_shared_open(&sh, cfg.state_path) != 0 &&
        cfg.mem_active)
        cfg.error = 1;
    pthread_atfork(NULL, NULL, after_fork_child);
}

static void cuda_init(void)
{
    pthread_once(&core_once, core_init);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "tessera-limiter: cannot load libcuda.so.1: %s\n", dlerror());
    } else if (real_dlsym) {
#define RESOLVE(name, args) *(void **)&real_##name = real_dlsym(h, #name);
        CU_HOOK_LIST(RESOLVE)
        CU_AUX_LIST(RESOLVE)
    }
    __atomic_store_n(&tl_cuda_ready, 1, __ATOMIC_RELEASE);
}

static void nvml_init(void)
{
    pthread_once(&core_once, core_init); /* config + shared state */
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h && real_dlsym) {
        NVML_HOOK_LIST(RESOLVE)
        NVML_AUX_LIST(RESOLVE)
    }
    __atomic_store_n(&tl_nvml_ready, 1, __ATOMIC_RELEASE);
}

void tl_cuda_init(void) { pthread_once(&cuda_once, cuda_init); }
void tl_nvml_init(void) { pthread_once(&nvml_once, nvml_init); }

__attribute__((destructor)) static void tl_fini(void)
{
    if (sh.st && sh.slot >= 0)
        tl_shared_unregister(&sh);
}

EXPORT CUresult cuInit(unsigned int flags)
{
    ensure_cuda();
    if (UNLIKELY(cfg.error))
        return CUDA_ERROR_NOT_INITIALIZED;
    return CALL_REAL(cuInit, flags);
}

/* ------------------------------------------------------------------ */
/* entry-point lookup                                                  */

typedef struct {
    const char *name;
    void *wrapper;
    void **real;
} hook;

#define HOOK_ENTRY(name, args) {#name, (void *)name, (void **)&real_##name},
static const hook hooks[] = {CU_HOOK_LIST(HOOK_ENTRY) NVML_HOOK_LIST(HOOK_ENTRY)};
#define NHOOKS (sizeof(hooks) / sizeof(hooks[0]))

static void *wrapper_by_name(const char *name)
{
    if (!name || (name[0] != 'c' && name[0] != 'n'))
        return NULL;
    for (size_t i = 0; i < NHOOKS; i++)
        if (!strcmp(hooks[i].name, name))
            return hooks[i].wrapper;
    return NULL;
}

/* Map a real driver address to our wrapper, if we intercept it. */
static void *wrapper_by_real(void *p)
{
    for (size_t i = 0; p && i < NHOOKS; i++)
        if (*hooks[i].real == p)
            return hooks[i].wrapper;
    return NULL;
}

static int is_ours(void *p)
{
    Dl_info self, got;
    return dladdr((void *)cuInit, &self) && dladdr(p, &got) && self.dli_fbase == got.dli_fbase;
}

/* What to hand out for (sym, ver, flags) when the driver answered p. NULL:
 * keep p. *refuse: the answer must not be handed out at all. */
static void *swap(const char *sym, void *p, int ver, unsigned long long flags, int *refuse)
{
    *refuse = 0;
    void *w = wrapper_by_real(p);
    if (w || is_ours(p))
        return w;
    char n[128];
    if (tl_pa_known(sym)) {
        int hooked = tl_pa_resolve(sym, TL_PA_NEWEST, flags, n, sizeof(n)) == 0 && wrapper_by_name(n);
        if (ver > TL_PA_NEWEST) {
            /* a variant we may not know: an unknown address of an
             * intercepted name could bypass the limits */
            *refuse = hooked;
            return NULL;
        }
        return tl_pa_resolve(sym, ver, flags, n, sizeof(n)) == 0 ? wrapper_by_name(n) : NULL;
    }
    return wrapper_by_name(sym); /* a versioned name asked for directly */
}

static CUresult gpa_result(const char *sym, void **pfn, int ver, unsigned long long flags, CUresult r)
{
    if (r != CUDA_SUCCESS || !pfn || !*pfn || !sym)
        return r;
    int refuse;
    void *w = swap(sym, *pfn, ver, flags, &refuse);
    if (refuse) {
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "tessera-limiter: cuGetProcAddress(\"%s\", %d): CUDA version newer than this limiter "
                            "knows and an entry point it cannot check; refused (fail closed)\n", sym, ver);
        *pfn = NULL;
        return CUDA_ERROR_NOT_FOUND;
    }
    int ours = w || is_ours(*pfn);
    if (w)
        *pfn = w;
    if (cfg.debug) {
        Dl_info di;
        fprintf(stderr, "tessera-limiter: cuGetProcAddress(%s, %d, %llu) -> %s %s\n", sym, ver, flags,
                dladdr(*pfn, &di) && di.dli_sname ? di.dli_sname : "?", ours ? "(intercepted)" : "(driver)");
    }
    return r;
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    ensure_cuda();
    return gpa_result(sym, pfn, ver, flags, CALL_REAL(cuGetProcAddress, sym, pfn, ver, flags));
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status)
{
    ensure_cuda();
    CUresult r = gpa_result(sym, pfn, ver, flags, CALL_REAL(cuGetProcAddress_v2, sym, pfn, ver, flags, status));
    if (r == CUDA_ERROR_NOT_FOUND && status)
        *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return r;
}

/* Applications (and cudart) often dlopen libcuda / libnvidia-ml and look
 * functions up by handle, which would bypass a preloaded library. For the
 * names we intercept, hand out our wrapper when the library behind the
 * handle really defines the name. RTLD_DEFAULT/RTLD_NEXT are passed through
 * untouched; the tail call keeps the caller's return address so glibc
 * resolves RTLD_NEXT relative to the real caller. */
EXPORT NO_SANITIZE void *dlsym(void *handle, const char *name)
{
    if (UNLIKELY(!real_dlsym))
        resolve_real_dlsym();
    if (handle != RTLD_DEFAULT && handle != RTLD_NEXT) {
        void *w = wrapper_by_name(name);
        if (w && real_dlsym(handle, name))
            return w;
    }
    return real_dlsym(handle, name);
}

/* ------------------------------------------------------------------ */
/* diagnostics: TESSERA_LIMITER_TRACE                                  */

static int trace_fd = -1;
static pid_t trace_pid;
static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;

/* In the child (atfork, before the program runs again): the parent's
 * trace file is closed here, while trace_fd surely still is that file, and
 * the child opens its own at its first line. Closing it later, from
 * tl_trace, could close a descriptor of the program's that has reused the
 * number in between. */
static void trace_after_fork(void)
{
    pthread_mutex_init(&trace_mu, NULL);
    int fd = trace_fd;
    trace_fd = -1;
    if (fd >= 0)
        close(fd);
}

void tl_trace(const char *fmt, ...)
{
    if (!TL_TRACING)
        return;
    pid_t me = getpid();
    if (__atomic_load_n(&trace_pid, __ATOMIC_ACQUIRE) != me) {
        /* first line of this process (or of a forked child): its own file */
        pthread_mutex_lock(&trace_mu);
        if (trace_pid != me) {
            char path[sizeof(cfg.trace_path) + 24];
            snprintf(path, sizeof(path), "%s.%d", cfg.trace_path, (int)me);
            /* never close trace_fd here: after a fork without the atfork
             * handler (a raw clone) the number may be the program's by now.
             * O_NOFOLLOW: a symbolic link planted at the path is not
             * followed. */
            __atomic_store_n(&trace_fd, open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644),
                             __ATOMIC_RELEASE);
            __atomic_store_n(&trace_pid, me, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&trace_mu);
    }
    int fd = __atomic_load_n(&trace_fd, __ATOMIC_ACQUIRE);
    if (fd < 0)
        return;
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int n = snprintf(line, sizeof(line), "%.6f %ld.%06ld ", tl_clock_now(), (long)ts.tv_sec, ts.tv_nsec / 1000);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof(line))
        n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(line))
        n = (int)sizeof(line) - 1;
    if (n <= 0)
        return;
    if (line[n - 1] != '\n')
        line[n++] = '\n';
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
}

/* NVML's private function tables (nvidia-smi reads its process lists
 * through one of them, not through the exported entry points the limiter
 * filters). Passed through; which tables a program asks for is traced. */
EXPORT nvmlReturn_t nvmlInternalGetExportTable(const void **table, const void *id)
{
    ensure_nvml();
    if (!real_nvmlInternalGetExportTable)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real_nvmlInternalGetExportTable(table, id);
    if (TL_TRACING || cfg.debug) {
        char hex[40] = "?";
        if (id)
            for (int i = 0; i < 16; i++)
                snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)id)[i]);
        size_t size = r == NVML_SUCCESS && table && *table ? *(const size_t *)*table : 0;
        tl_trace("nvml-export-table id=%s r=%d size=%zu (process lists read through it are not filtered)", hex,
                 (int)r, size);
        if (cfg.debug)
            fprintf(stderr, "tessera-limiter: nvmlInternalGetExportTable(%s) = %d, table of %zu bytes: not "
                            "filtered\n", hex, (int)r, size);
    }
    return r;
}
