/*
 * tl_graph.c - graph memory.
 *
 * Memory-alloc nodes (cuGraphAddMemAllocNode, cuGraphAddNode, stream
 * capture of cuMemAllocAsync) get physical memory from the driver's
 * per-device graph pool when an exec is first launched or uploaded (or
 * instantiated with the upload flag), and the pool keeps it until
 * cuDeviceGraphMemTrim. The process's charge on a device follows the
 * pool's reservation (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), re-read after
 * every call that can change it. Before an exec's first launch the growth
 * it can cause (its alloc nodes' bytes minus the pool's unused part) is
 * reserved, and the launch refused if that does not fit. An instantiation
 * whose alloc nodes could not fit now (the growth they can cause beside
 * what the container holds) is refused at once, with
 * CUDA_ERROR_OUT_OF_MEMORY and no exec: a framework that captured a graph
 * (PyTorch's cudaMallocAsync backend) gets the error where it can recover,
 * not at the first launch.
 *
 * Execs with alloc nodes are in the table (TL_K_GEXEC) with their bytes;
 * `dev` holds the limiter device in its low 8 bits and, once launched, the
 * device's trim generation + 1 above them: after a trim the driver may
 * remap on the next launch, so that launch re-reads the pool.
 */
#include "tl_compat.h"

#include <stdlib.h>

#include "tl_internal.h"

static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t graph_charged[TL_MAX_DEVICES]; /* charged for the driver's graph memory pool, per ld */
static unsigned trim_gen[TL_MAX_DEVICES];

static int gexec_tag(int ld)
{
    return ld | (int)(((__atomic_load_n(&trim_gen[ld], __ATOMIC_RELAXED) + 1) & 0x7fffff) << 8);
}

static int pool_attr(int ld, int attr, uint64_t *out)
{
    unsigned long long v = 0;
    int o = tl_ordinal_of_ld(ld);
    if (o < 0 || !real_cuDeviceGetGraphMemAttribute || real_cuDeviceGetGraphMemAttribute(o, attr, &v) != CUDA_SUCCESS)
        return -1;
    *out = v;
    return 0;
}

/* Bytes of the alloc nodes of g and its child graphs; *ord is set to the
 * CUDA ordinal of the first one found. */
static uint64_t graph_alloc_bytes(CUgraph g, int *ord, int depth)
{
    size_t n = 0;
    if (depth > 8 || !real_cuGraphGetNodes || !real_cuGraphNodeGetType || !real_cuGraphMemAllocNodeGetParams ||
        !real_cuGraphChildGraphNodeGetGraph || real_cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
        return 0;
    CUgraphNode *nodes = calloc(n, sizeof(*nodes));
    uint64_t total = 0;
    if (nodes && real_cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            int t;
            TL_MEM_ALLOC_NODE_PARAMS p;
            CUgraph child;
            uint64_t b = 0;
            if (real_cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS)
                continue;
            if (t == TL_GRAPH_NODE_TYPE_MEM_ALLOC && real_cuGraphMemAllocNodeGetParams(nodes[i], &p) == CUDA_SUCCESS) {
                if (*ord < 0)
                    *ord = p.poolProps.location.id;
                b = p.bytesize;
            } else if (t == TL_GRAPH_NODE_TYPE_GRAPH &&
                       real_cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS) {
                b = graph_alloc_bytes(child, ord, depth + 1);
            }
            total = total + b < total ? UINT64_MAX : total + b;
        }
    }
    free(nodes);
    return total;
}

/* With graph_mu held: reserve the growth of ld's pool that `bytes` of
 * not-yet-backed allocations can cause, into *pre. Returns 0, or -1 if it
 * does not fit. */
static int graph_prereserve(int ld, uint64_t bytes, uint64_t *pre)
{
    uint64_t res = 0, used = 0;
    if (pool_attr(ld, TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res) != 0 ||
        pool_attr(ld, TL_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) != 0)
        res = used = 0; /* unknown: assume nothing idle */
    uint64_t idle = res > used ? res - used : 0;
    *pre = bytes > idle ? bytes - idle : 0;
    return *pre && tl_reserve(ld, *pre) < 0 ? -1 : 0;
}

/* With graph_mu held: whether the growth of ld's pool that `bytes` of
 * alloc nodes can cause fits beside what the container holds now (what
 * graph_prereserve would reserve, without reserving it). */
static int graph_fits(int ld, uint64_t bytes)
{
    uint64_t res = 0, used = 0, lim = tl_alloc_limit(ld);
    if (pool_attr(ld, TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res) != 0 ||
        pool_attr(ld, TL_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) != 0)
        res = used = 0;
    uint64_t idle = res > used ? res - used : 0, grow = bytes > idle ? bytes - idle : 0;
    uint64_t held = tl_shared_used(&sh, ld);
    return held <= lim && grow <= lim - held;
}

/* With graph_mu held: set the charge on ld to the pool's reservation,
 * using the `pre` bytes reserved beforehand first. Growth that does not
 * fit is charged anyway (the driver already holds the memory); returns -1
 * then. If the pool cannot be read, `pre` stays charged. */
static int graph_sync(int ld, uint64_t pre)
{
    uint64_t r, c = graph_charged[ld];
    int over = 0;
    if (pool_attr(ld, TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &r) != 0) {
        graph_charged[ld] = c + pre;
        return 0;
    }
    if (r > c) {
        uint64_t d = r - c, use = d < pre ? d : pre;
        pre -= use;
        d -= use;
        if (d && tl_reserve_uncounted(ld, d) < 0) {
            tl_force_charge(ld, d);
            over = 1;
        }
    } else if (c > r) {
        tl_release(ld, c - r);
    }
    graph_charged[ld] = r;
    if (pre)
        tl_release(ld, pre);
    return over ? -1 : 0;
}

/* A launch or upload of exec e (table entry: bytes, tag). A launch cannot
 * be undone: growth over the limit stays charged. */
CUresult tl_graph_run(CUgraphExec e, CUstream s, int ptsz, int upload)
{
    CUresult (*call)(CUgraphExec, CUstream) = upload ? (ptsz ? real_cuGraphUpload_ptsz : real_cuGraphUpload)
                                                     : (ptsz ? real_cuGraphLaunch_ptsz : real_cuGraphLaunch);
    if (!call)
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes, pre = 0;
    int tag;
    if (!cfg.mem_active || !tl_table_get(TL_K_GEXEC, (uintptr_t)e, &bytes, &tag))
        return call(e, s);
    int ld = tag & 0xff;
    if (tag == gexec_tag(ld))
        return call(e, s); /* backed, no trim since: nothing changes */
    tl_account_prepare(ld, bytes);
    pthread_mutex_lock(&graph_mu);
    if ((tag >> 8) == 0 && graph_prereserve(ld, bytes, &pre) < 0) {
        pthread_mutex_unlock(&graph_mu);
        tl_trace("graph %s of exec %p (%llu bytes of alloc nodes) refused: over the limit",
                 upload ? "upload" : "launch", (void *)e, (unsigned long long)bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = call(e, s);
    graph_sync(ld, pre);
    if (r == CUDA_SUCCESS)
        tl_table_put(TL_K_GEXEC, (uintptr_t)e, bytes, gexec_tag(ld));
    pthread_mutex_unlock(&graph_mu);
    return r;
}

/* After the real instantiate, with graph_mu held (released here): record
 * the exec; with the upload flag the pool was filled already, so re-read it
 * and undo the instantiation if that went over the limit. */
static CUresult graph_instantiated(CUgraphExec *pe, int ld, uint64_t bytes, int upload, uint64_t pre, CUresult r)
{
    if (r == CUDA_SUCCESS && tl_table_put(TL_K_GEXEC, (uintptr_t)*pe, bytes, upload ? gexec_tag(ld) : ld) != 0) {
        (void)CALL_REAL(cuGraphExecDestroy, *pe);
        *pe = NULL; /* never hand back a destroyed exec: a caller's cleanup would destroy it twice */
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (graph_sync(ld, pre) != 0 && r == CUDA_SUCCESS && upload) {
        tl_count_refused(ld);
        tl_table_take(TL_K_GEXEC, (uintptr_t)*pe, NULL, NULL);
        (void)CALL_REAL(cuGraphExecDestroy, *pe);
        *pe = NULL;
        (void)CALL_REAL(cuDeviceGraphMemTrim, tl_ordinal_of_ld(ld));
        graph_sync(ld, 0);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&graph_mu);
    return r;
}

/* Instantiation: execs whose graph has alloc nodes are recorded; with the
 * upload flag the pool grows now, so the growth is reserved first. */
#define INSTANTIATE_BODY(pe, g, flags, call)                                       \
    ensure_cuda();                                                                  \
    if (UNLIKELY(cfg.error))                                                        \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    int ord_ = -1, up_ = ((flags) & TL_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0;         \
    uint64_t pre_ = 0, bytes_ = cfg.mem_active && (pe) ? graph_alloc_bytes(g, &ord_, 0) : 0; \
    int ld_ = bytes_ ? tl_ld_of_ordinal(ord_) : -1;                                 \
    if (!bytes_ || !tl_limit_of(ld_))                                               \
        return call;                                                                \
    if (ld_ < 0)                                                                    \
        return CUDA_ERROR_OUT_OF_MEMORY; /* a device not in the limits file */      \
    tl_account_prepare(ld_, bytes_);                                                \
    pthread_mutex_lock(&graph_mu);                                                  \
    if (up_ ? graph_prereserve(ld_, bytes_, &pre_) < 0 : !graph_fits(ld_, bytes_)) { \
        pthread_mutex_unlock(&graph_mu);                                            \
        if (!up_)                                                                   \
            tl_count_refused(ld_);                                                  \
        tl_trace("graph instantiation (%llu bytes of alloc nodes) refused: over the limit", \
                 (unsigned long long)bytes_);                                       \
        return CUDA_ERROR_OUT_OF_MEMORY;                                            \
    }                                                                               \
    return graph_instantiated(pe, ld_, bytes_, up_, pre_, call);

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    INSTANTIATE_BODY(pe, g, flags, CALL_REAL(cuGraphInstantiateWithFlags, pe, g, flags))
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g, TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    INSTANTIATE_BODY(pe, g, p ? p->flags : 0, CALL_REAL(cuGraphInstantiateWithParams, pe, g, p))
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g, TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    INSTANTIATE_BODY(pe, g, p ? p->flags : 0, CALL_REAL(cuGraphInstantiateWithParams_ptsz, pe, g, p))
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    INSTANTIATE_BODY(pe, g, 0, CALL_REAL(cuGraphInstantiate_v2, pe, g, err, log, n))
}

/* the CUDA 10 entry point: same arguments */
EXPORT CUresult cuGraphInstantiate(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    INSTANTIATE_BODY(pe, g, 0, CALL_REAL(cuGraphInstantiate, pe, g, err, log, n))
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
    ensure_cuda();
    return tl_graph_run(e, s, 0, 1);
}

EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s)
{
    ensure_cuda();
    return tl_graph_run(e, s, 1, 1);
}

/* The pool keeps a destroyed exec's memory (until a trim): nothing to
 * re-read, only forget the exec. */
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    ensure_cuda();
    if (!cfg.mem_active)
        return CALL_REAL(cuGraphExecDestroy, e);
    uint64_t b;
    int t;
    int had = tl_table_take(TL_K_GEXEC, (uintptr_t)e, &b, &t);
    CUresult r = CALL_REAL(cuGraphExecDestroy, e);
    if (had && r != CUDA_SUCCESS)
        tl_table_put(TL_K_GEXEC, (uintptr_t)e, b, t);
    return r;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    ensure_cuda();
    CUresult r = CALL_REAL(cuDeviceGraphMemTrim, dev);
    int ld = tl_ld_of_ordinal(dev);
    if (r == CUDA_SUCCESS && cfg.mem_active && ld >= 0 && tl_limit_of(ld)) {
        pthread_mutex_lock(&graph_mu);
        __atomic_add_fetch(&trim_gen[ld], 1, __ATOMIC_RELAXED);
        graph_sync(ld, 0);
        pthread_mutex_unlock(&graph_mu);
    }
    return r;
}

void tl_graph_after_fork(void)
{
    pthread_mutex_init(&graph_mu, NULL);
    for (int i = 0; i < TL_MAX_DEVICES; i++)
        graph_charged[i] = 0;
}
