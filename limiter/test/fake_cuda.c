/*
 * fake_cuda.c - a stand-in libcuda.so.1 for CI: devices whose memory size
 * comes from FAKE_GPU_MEM (bytes, default 16 GiB; FAKE_GPU_COUNT devices,
 * default 2). It hands out fake addresses and keeps per-process usage so
 * cuMemGetInfo answers like a real driver. Nothing runs on any GPU.
 * Launches just count (fake_launch_count, read by the fake NVML).
 * FAKE_CTX_MEM bytes of device memory are taken by each context (created, or
 * primary while retained), like a real context's own footprint. Graphs
 * imitate the graph memory pool: alloc nodes get addresses at capture/add
 * time, physical memory is reserved in a per-device pool when an exec is
 * first launched or uploaded, and stays there until cuDeviceGraphMemTrim.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_api.h"
#include "fake_procs.h"

#define MAXDEV 16
#define MAXALLOC 65536

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited, ndev = 2;
static unsigned long long devmem = 16ull << 30, ctxmem;
static unsigned long long used[MAXDEV];
static unsigned long long next_addr = 0x700000000000ull;
static struct { unsigned long long key, size; int dev, kind; } allocs[MAXALLOC];
static struct fake_ctx { int dev; int magic; } ctxs[MAXDEV], created[256];
static int ncreated;
static int prim_refs[MAXDEV];
static __thread int cur_dev = -1;

/* exported for the fake NVML: total blocks launched by this process */
unsigned long long fake_launch_blocks;
/* exported for tests: the most device-0 memory ever allocated at once */
unsigned long long fake_peak_used;

static void setup(void)
{
    const char *m = getenv("FAKE_GPU_MEM"), *c = getenv("FAKE_GPU_COUNT");
    if (m)
        devmem = strtoull(m, NULL, 0);
    if (c)
        ndev = atoi(c);
    if (getenv("FAKE_CTX_MEM"))
        ctxmem = strtoull(getenv("FAKE_CTX_MEM"), NULL, 0);
    if (ndev < 1 || ndev > MAXDEV)
        ndev = 2;
    for (int i = 0; i < MAXDEV; i++)
        ctxs[i].dev = i;
}

CUresult cuInit(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    if (!inited) {
        setup();
        inited = 1;
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

#define NEED_INIT() do { if (!inited) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }

CUresult cuDeviceGet(CUdevice *d, int ord)
{
    NEED_INIT();
    if (ord < 0 || ord >= ndev)
        return CUDA_ERROR_INVALID_VALUE;
    *d = ord;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *d)
{
    NEED_INIT();
    if (cur_dev < 0)
        cur_dev = 0; /* behave as if the primary context of device 0 were current */
    *d = cur_dev;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c)
{
    NEED_INIT();
    cur_dev = c ? ((struct fake_ctx *)c)->dev : -1;
    return CUDA_SUCCESS;
}

/* Take (or give back) a context's footprint on dev. */
static int ctx_mem(int dev, int take)
{
    if (!take) {
        used[dev] -= ctxmem;
        return 0;
    }
    if (ctxmem > devmem - used[dev])
        return -1;
    used[dev] += ctxmem;
    return 0;
}

/* Exported functions do not call each other: with the limiter preloaded
 * such a call would go through its wrapper a second time. */
static CUresult ctx_create(CUcontext *pc, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (ncreated >= 256 || ctx_mem(dev, 1) != 0) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fake_ctx *c = &created[ncreated++];
    c->dev = dev;
    c->magic = 1;
    pthread_mutex_unlock(&mu);
    fake_proc_register();
    cur_dev = dev;
    *pc = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pc, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return ctx_create(pc, dev);
}

CUresult cuCtxDestroy_v2(CUcontext c)
{
    NEED_INIT();
    struct fake_ctx *f = c;
    if (!f || f->magic != 1)
        return CUDA_ERROR_INVALID_VALUE;
    f->magic = 0;
    pthread_mutex_lock(&mu);
    ctx_mem(f->dev, 0);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v3(CUcontext *pc, void *aff, int naff, unsigned int flags, CUdevice dev)
{
    (void)aff; (void)naff; (void)flags;
    return ctx_create(pc, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pc, void *params, unsigned int flags, CUdevice dev)
{
    (void)params; (void)flags;
    return ctx_create(pc, dev);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pc, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (prim_refs[dev] == 0 && ctx_mem(dev, 1) != 0) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    prim_refs[dev]++;
    pthread_mutex_unlock(&mu);
    fake_proc_register();
    *pc = &ctxs[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= ndev || prim_refs[dev] == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (--prim_refs[dev] == 0)
        ctx_mem(dev, 0);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (prim_refs[dev] > 0)
        ctx_mem(dev, 0);
    prim_refs[dev] = 0;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* kind: 1 pointer, 2 handle, 3 array, 4 mipmap */
static CUresult fake_alloc(unsigned long long *out, size_t size, int kind)
{
    NEED_INIT();
    int dev = cur_dev < 0 ? 0 : cur_dev;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (size > devmem - used[dev]) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < MAXALLOC; i++) {
        if (allocs[i].key == 0) {
            allocs[i].key = next_addr;
            allocs[i].size = size;
            allocs[i].dev = dev;
            allocs[i].kind = kind;
            *out = next_addr;
            next_addr += (size + 511) & ~511ull;
            used[dev] += size;
            if (dev == 0 && used[0] > fake_peak_used)
                fake_peak_used = used[0];
            pthread_mutex_unlock(&mu);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_free(unsigned long long key, int kind)
{
    NEED_INIT();
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXALLOC; i++) {
        if (allocs[i].key == key && allocs[i].kind == kind && key) {
            used[allocs[i].dev] -= allocs[i].size;
            allocs[i].key = 0;
            pthread_mutex_unlock(&mu);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return fake_alloc(p, n, 1); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e)
{
    (void)e;
    /* FAKE_PITCH_ALIGN pads rows like a real driver would (default: none). */
    const char *a = getenv("FAKE_PITCH_ALIGN");
    size_t al = a ? strtoull(a, NULL, 0) : 1;
    if (al == 0)
        al = 1;
    size_t pw = (w + al - 1) / al * al;
    CUresult r = fake_alloc(p, pw * h, 1);
    if (r == CUDA_SUCCESS)
        *pitch = pw;
    return r;
}
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int f) { (void)f; return fake_alloc(p, n, 1); }
static CUresult capture_alloc(CUstream s, CUdeviceptr *p, size_t n);
static int capturing(CUstream s);
static CUresult async_alloc(CUdeviceptr *p, size_t n, CUstream s)
{
    return capturing(s) ? capture_alloc(s, p, n) : fake_alloc(p, n, 1);
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return async_alloc(p, n, s); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return async_alloc(p, n, s); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pl, CUstream s)
{
    (void)pl;
    return async_alloc(p, n, s);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pl, CUstream s)
{
    (void)pl;
    return async_alloc(p, n, s);
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const TL_MEM_ALLOCATION_PROP *prop,
                     unsigned long long f)
{
    (void)f;
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    int save = cur_dev;
    cur_dev = prop->location.id;
    CUresult r = fake_alloc(h, n, 2);
    cur_dev = save;
    return r;
}

static size_t fmt_bytes(int f)
{
    switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    default: return 4;
    }
}

static size_t arr_bytes(size_t w, size_t h, size_t d, int f, unsigned ch)
{
    return (w ? w : 1) * (h ? h : 1) * (d ? d : 1) * (ch ? ch : 1) * fmt_bytes(f);
}

CUresult cuArrayCreate_v2(CUarray *a, const TL_ARRAY_DESCRIPTOR *d)
{
    unsigned long long k;
    CUresult r = fake_alloc(&k, arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), 3);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

CUresult cuArray3DCreate_v2(CUarray *a, const TL_ARRAY3D_DESCRIPTOR *d)
{
    unsigned long long k;
    CUresult r = fake_alloc(&k, arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), 3);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const TL_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    size_t total = 0, w = d->Width, h = d->Height, dd = d->Depth;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        total += arr_bytes(w, h, dd, d->Format, d->NumChannels);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        dd = dd > 1 ? dd / 2 : dd;
    }
    unsigned long long k;
    CUresult r = fake_alloc(&k, total, 4);
    if (r == CUDA_SUCCESS)
        *a = (CUmipmappedArray)(uintptr_t)k;
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr p) { return fake_free(p, 1); }
/* during capture a free only records a node */
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return capturing(s) ? CUDA_SUCCESS : fake_free(p, 1); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return capturing(s) ? CUDA_SUCCESS : fake_free(p, 1); }
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return fake_free(h, 2); }
CUresult cuArrayDestroy(CUarray a) { return fake_free((uintptr_t)a, 3); }
CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return fake_free((uintptr_t)a, 4); }

CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
    NEED_INIT();
    int dev = cur_dev < 0 ? 0 : cur_dev;
    *t = devmem;
    *f = devmem - used[dev];
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_VALUE;
    *b = devmem;
    return CUDA_SUCCESS;
}

static CUresult launch(unsigned gx, unsigned gy, unsigned gz)
{
    __atomic_add_fetch(&fake_launch_blocks, (unsigned long long)gx * gy * gz, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shm, CUstream s, void **p, void **e)
{
    (void)f; (void)bx; (void)by; (void)bz; (void)shm; (void)s; (void)p; (void)e;
    return launch(gx, gy, gz);
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shm, CUstream s, void **p, void **e)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}
CUresult cuLaunchKernelEx(const TL_LAUNCH_CONFIG *c, CUfunction f, void **p, void **e)
{
    (void)f; (void)p; (void)e;
    return launch(c->gridDimX, c->gridDimY, c->gridDimZ);
}
CUresult cuLaunchKernelEx_ptsz(const TL_LAUNCH_CONFIG *c, CUfunction f, void **p, void **e)
{
    return cuLaunchKernelEx(c, f, p, e);
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shm, CUstream s, void **p)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, NULL);
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned shm, CUstream s, void **p)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, NULL);
}
/* ---- streams, capture and graphs ---- */
#define MAXG 64
struct fake_graph;
struct fake_node { int type; unsigned long long bytes; int dev; struct fake_graph *child; };
struct fake_graph { int live; int n; struct fake_node nodes[16]; };
struct fake_exec { int live, mapped; unsigned long long bytes[MAXDEV]; };
struct fake_stream { int live; struct fake_graph *cap; };
static struct fake_graph graphs[MAXG];
static struct fake_exec execs[MAXG];
static struct fake_stream streams[MAXG];
static unsigned long long gp_res[MAXDEV], gp_used[MAXDEV]; /* graph pool: reserved, mapped */

/* exported for the fake NVML: contexts this process holds (created and
 * not destroyed, primary while retained) */
int fake_ctx_live(void)
{
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ncreated; i++)
        n += created[i].magic == 1;
    for (int i = 0; i < MAXDEV; i++)
        n += prim_refs[i] > 0;
    pthread_mutex_unlock(&mu);
    return n;
}

unsigned long long fake_used_bytes(int dev) { return dev >= 0 && dev < MAXDEV ? used[dev] : 0; }

static struct fake_stream *stream_of(CUstream s)
{
    struct fake_stream *f = s;
    return f >= streams && f < streams + MAXG ? f : NULL; /* NULL, legacy, per-thread: no capture */
}

static int capturing(CUstream s) { return stream_of(s) && stream_of(s)->cap; }

CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXG; i++)
        if (!streams[i].live) {
            streams[i].live = 1;
            *s = &streams[i];
            pthread_mutex_unlock(&mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXG; i++)
        if (!graphs[i].live) {
            memset(&graphs[i], 0, sizeof(graphs[i]));
            graphs[i].live = 1;
            *g = &graphs[i];
            pthread_mutex_unlock(&mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuGraphDestroy(CUgraph g) { ((struct fake_graph *)g)->live = 0; return CUDA_SUCCESS; }

static CUresult add_node(CUgraphNode *out, CUgraph g, int type, unsigned long long bytes, int dev, CUgraph child)
{
    struct fake_graph *fg = g;
    if (!fg || !fg->live || fg->n >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_node *n = &fg->nodes[fg->n++];
    n->type = type;
    n->bytes = bytes;
    n->dev = dev;
    n->child = child;
    if (out)
        *out = n;
    return CUDA_SUCCESS;
}

/* an alloc node gets its address now; no memory until launch */
static CUresult alloc_node(CUgraphNode *out, CUgraph g, TL_MEM_ALLOC_NODE_PARAMS *p)
{
    if (!p || !p->bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = add_node(out, g, TL_GRAPH_NODE_TYPE_MEM_ALLOC, p->bytesize, p->poolProps.location.id, NULL);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&mu);
        p->dptr = next_addr;
        next_addr += (p->bytesize + 511) & ~511ull;
        pthread_mutex_unlock(&mu);
    }
    return r;
}

static CUresult capture_alloc(CUstream s, CUdeviceptr *p, size_t n)
{
    TL_MEM_ALLOC_NODE_PARAMS a;
    memset(&a, 0, sizeof(a));
    a.bytesize = n;
    a.poolProps.location.id = cur_dev < 0 ? 0 : cur_dev;
    CUresult r = alloc_node(NULL, stream_of(s)->cap, &a);
    if (r == CUDA_SUCCESS)
        *p = a.dptr;
    return r;
}

CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
    (void)mode;
    struct fake_stream *f = stream_of(s);
    CUgraph g;
    if (!f || f->cap || cuGraphCreate(&g, 0) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    f->cap = g;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    struct fake_stream *f = stream_of(s);
    if (!f || !f->cap)
        return CUDA_ERROR_INVALID_VALUE;
    *g = f->cap;
    f->cap = NULL;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream s, int *status) { *status = capturing(s); return CUDA_SUCCESS; }
CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) { return cuStreamIsCapturing(s, status); }

CUresult cuGraphAddMemAllocNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                                TL_MEM_ALLOC_NODE_PARAMS *p)
{
    (void)deps; (void)nd;
    return alloc_node(n, g, p);
}

CUresult cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, const void *edges, size_t nd,
                           void *params)
{
    (void)deps; (void)edges; (void)nd;
    FAKE_GRAPH_NODE_PARAMS *p = params;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == TL_GRAPH_NODE_TYPE_MEM_ALLOC)
        return alloc_node(n, g, &p->u.alloc);
    return add_node(n, g, p->type, 0, 0, NULL);
}

CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraph child)
{
    (void)deps; (void)nd;
    return add_node(n, g, TL_GRAPH_NODE_TYPE_GRAPH, 0, 0, child);
}

CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num)
{
    struct fake_graph *fg = g;
    if (!fg || !num)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes) {
        size_t k = *num < (size_t)fg->n ? *num : (size_t)fg->n;
        for (size_t i = 0; i < k; i++)
            nodes[i] = &fg->nodes[i];
        *num = k;
    } else {
        *num = (size_t)fg->n;
    }
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode n, int *t) { *t = ((struct fake_node *)n)->type; return CUDA_SUCCESS; }

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode n, TL_MEM_ALLOC_NODE_PARAMS *p)
{
    struct fake_node *fn = n;
    if (fn->type != TL_GRAPH_NODE_TYPE_MEM_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof(*p));
    p->bytesize = fn->bytes;
    p->poolProps.location.type = 1;
    p->poolProps.location.id = fn->dev;
    return CUDA_SUCCESS;
}

CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *g)
{
    struct fake_node *fn = n;
    if (fn->type != TL_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *g = fn->child;
    return CUDA_SUCCESS;
}

static void footprint(struct fake_graph *g, unsigned long long *bytes, int depth)
{
    for (int i = 0; g && depth < 8 && i < g->n; i++) {
        if (g->nodes[i].type == TL_GRAPH_NODE_TYPE_MEM_ALLOC)
            bytes[g->nodes[i].dev] += g->nodes[i].bytes;
        else if (g->nodes[i].type == TL_GRAPH_NODE_TYPE_GRAPH)
            footprint(g->nodes[i].child, bytes, depth + 1);
    }
}

/* First launch or upload: back the exec's allocations from the pool,
 * growing it (device memory) when what it holds is not enough. */
static CUresult map_exec(struct fake_exec *e)
{
    pthread_mutex_lock(&mu);
    if (!e->mapped) {
        for (int d = 0; d < MAXDEV; d++) {
            unsigned long long need = gp_used[d] + e->bytes[d];
            unsigned long long grow = need > gp_res[d] ? need - gp_res[d] : 0;
            /* FAKE_GRAPH_GRANULE: the pool grows in steps, as a real one does */
            const char *gr = getenv("FAKE_GRAPH_GRANULE");
            unsigned long long g = gr ? strtoull(gr, NULL, 0) : 0;
            if (g && grow % g)
                grow += g - grow % g;
            if (grow > devmem - used[d]) {
                for (int k = 0; k < d; k++)
                    gp_used[k] -= e->bytes[k];
                pthread_mutex_unlock(&mu);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            used[d] += grow;
            gp_res[d] += grow;
            gp_used[d] = need;
        }
        e->mapped = 1;
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    struct fake_graph *fg = g;
    if (!pe || !fg || !fg->live)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct fake_exec *e = NULL;
    for (int i = 0; i < MAXG && !e; i++)
        if (!execs[i].live)
            e = &execs[i];
    if (e) {
        memset(e, 0, sizeof(*e));
        e->live = 1;
        footprint(fg, e->bytes, 0);
    }
    pthread_mutex_unlock(&mu);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((flags & TL_GRAPH_INSTANTIATE_FLAG_UPLOAD) && map_exec(e) != CUDA_SUCCESS) {
        e->live = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pe = e;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    return instantiate(pe, g, flags);
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g, TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    return instantiate(pe, g, p ? p->flags : 0);
}
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g, TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    return instantiate(pe, g, p ? p->flags : 0);
}
CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    (void)err; (void)log; (void)n;
    return instantiate(pe, g, 0);
}

CUresult cuGraphExecDestroy(CUgraphExec ge)
{
    struct fake_exec *e = ge;
    if (!e || !e->live)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (int d = 0; e->mapped && d < MAXDEV; d++)
        gp_used[d] -= e->bytes[d];
    e->live = 0;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

CUresult cuGraphUpload(CUgraphExec e, CUstream s) { (void)s; return map_exec(e); }
CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) { (void)s; return map_exec(e); }

static CUresult graph_launch(CUgraphExec g)
{
    if (g && map_exec(g) != CUDA_SUCCESS) /* the tests launch NULL execs to count tokens */
        return CUDA_ERROR_OUT_OF_MEMORY;
    return launch(1, 1, 1);
}
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { (void)s; return graph_launch(g); }
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { (void)s; return graph_launch(g); }

CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *v)
{
    if (dev < 0 || dev >= ndev || !v)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *(unsigned long long *)v = attr == TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT ? gp_res[dev] : gp_used[dev];
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* give back what the pool holds beyond what mapped execs use */
CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    used[dev] -= gp_res[dev] - gp_used[dev];
    gp_res[dev] = gp_used[dev];
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* Entry-point table for cuGetProcAddress: like the real driver, a base name
 * ("cuMemAlloc") resolves to the current versioned function. */
#define ENTRY(ret, name, args) {#name, (void *)name},
static const struct { const char *name; void *fn; } table[] = {FAKE_API_LIST(ENTRY)};

/* FAKE_GPA_THUNKS=1: cuGetProcAddress hands out internal functions instead
 * of the exported ones for a few entry points, as a driver may. */
static CUresult thunk_alloc(CUdeviceptr *p, size_t n) { return fake_alloc(p, n, 1); }
static CUresult thunk_free(CUdeviceptr p) { return fake_free(p, 1); }
static CUresult thunk_getinfo(size_t *f, size_t *t) { return cuMemGetInfo_v2(f, t); }
static CUresult thunk_launch_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **p, void **e)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}

static void *find(const char *n)
{
    if (getenv("FAKE_GPA_THUNKS")) {
        if (!strcmp(n, "cuMemAlloc_v2"))
            return (void *)thunk_alloc;
        if (!strcmp(n, "cuMemFree_v2"))
            return (void *)thunk_free;
        if (!strcmp(n, "cuMemGetInfo_v2"))
            return (void *)thunk_getinfo;
        if (!strcmp(n, "cuLaunchKernel_ptsz"))
            return (void *)thunk_launch_ptsz;
    }
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (!strcmp(table[i].name, n))
            return table[i].fn;
    return NULL;
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status)
{
    char buf[256];
    void *p = NULL;
    if (!sym || !pfn || strlen(sym) > 200)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & TL_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(buf, sizeof(buf), "%s_ptsz", sym);
        p = find(buf);
    }
    if (!p && ver >= 3020) {
        snprintf(buf, sizeof(buf), "%s_v2", sym);
        p = find(buf);
    }
    if (!p)
        p = find(sym);
    *pfn = p;
    if (status)
        *status = p ? 0 : 1;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
