/*
 * fake_graph.c - graphs, stream capture and the per-device graph memory
 * pool. Memory-alloc nodes get their address when added (or captured) and
 * no memory; physical memory is reserved in the device's graph pool when an
 * exec is first launched or uploaded (or instantiated with the upload flag)
 * and stays there until cuDeviceGraphMemTrim, as in a real driver. The pool
 * grows in FAKE_GRAPH_GRANULE steps. A graph launch runs for its cost
 * (fake_graph_cost, else FAKE_GRAPH_US) on the fake GPU.
 */
#include "fake.h"

#define MAXG 64
struct fake_graph;
struct fake_node {
    int type;
    unsigned long long bytes;
    int dev;
    struct fake_graph *child;
};
struct fake_graph {
    int live;
    int n;
    struct fake_node nodes[16];
};
struct fake_exec {
    int live, mapped;
    unsigned long long bytes[FAKE_MAXDEV];
};
static struct fake_graph graphs[MAXG];
static struct fake_exec execs[MAXG];
static unsigned long long gp_res[FAKE_MAXDEV], gp_used[FAKE_MAXDEV]; /* graph pool: reserved, mapped */
static unsigned long long next_node_addr = 0x7c0000000000ull;

int fake_stream_capturing(CUstream s)
{
    CUgraph *c = fake_stream_capture(s);
    return c && *c;
}

static CUresult graph_create(CUgraph *g)
{
    pthread_mutex_lock(&fake_mu);
    for (int i = 0; i < MAXG; i++)
        if (!graphs[i].live) {
            memset(&graphs[i], 0, sizeof(graphs[i]));
            graphs[i].live = 1;
            *g = &graphs[i];
            pthread_mutex_unlock(&fake_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    (void)flags;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    return graph_create(g);
}

FAKE_EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    struct fake_graph *f = g;
    if (!f || f < graphs || f >= graphs + MAXG)
        return CUDA_ERROR_INVALID_VALUE;
    f->live = 0;
    return CUDA_SUCCESS;
}

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
        pthread_mutex_lock(&fake_mu);
        p->dptr = next_node_addr;
        next_node_addr += (p->bytesize + 511) & ~511ull;
        pthread_mutex_unlock(&fake_mu);
    }
    return r;
}

CUresult fake_capture_alloc(CUstream s, CUdeviceptr *p, size_t n)
{
    TL_MEM_ALLOC_NODE_PARAMS a;
    memset(&a, 0, sizeof(a));
    a.bytesize = n;
    a.poolProps.location.type = TL_MEM_LOCATION_DEVICE;
    a.poolProps.location.id = fake_stream_dev(s);
    CUresult r = alloc_node(NULL, *fake_stream_capture(s), &a);
    if (r == CUDA_SUCCESS && p)
        *p = a.dptr;
    return r;
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
    (void)mode;
    CUgraph *c = fake_stream_capture(s);
    CUgraph g;
    if (!c || *c || graph_create(&g) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    *c = g;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    CUgraph *c = fake_stream_capture(s);
    if (!c || !*c || !g)
        return CUDA_ERROR_INVALID_VALUE;
    *g = *c;
    *c = NULL;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = fake_stream_capturing(s);
    return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = fake_stream_capturing(s);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                                            TL_MEM_ALLOC_NODE_PARAMS *p)
{
    (void)deps; (void)nd;
    return alloc_node(n, g, p);
}

static CUresult add_generic(CUgraphNode *n, CUgraph g, void *params)
{
    FAKE_GRAPH_NODE_PARAMS *p = params;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == TL_GRAPH_NODE_TYPE_MEM_ALLOC)
        return alloc_node(n, g, &p->u.alloc);
    return add_node(n, g, p->type, 0, 0, NULL);
}

FAKE_EXPORT CUresult cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, void *params)
{
    (void)deps; (void)nd;
    return add_generic(n, g, params);
}

FAKE_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, const void *edges,
                                       size_t nd, void *params)
{
    (void)deps; (void)edges; (void)nd;
    return add_generic(n, g, params);
}

FAKE_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                                              CUgraph child)
{
    (void)deps; (void)nd;
    return add_node(n, g, TL_GRAPH_NODE_TYPE_GRAPH, 0, 0, child);
}

FAKE_EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num)
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

FAKE_EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, int *t)
{
    if (!n || !t)
        return CUDA_ERROR_INVALID_VALUE;
    *t = ((struct fake_node *)n)->type;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode n, TL_MEM_ALLOC_NODE_PARAMS *p)
{
    struct fake_node *fn = n;
    if (!fn || !p || fn->type != TL_GRAPH_NODE_TYPE_MEM_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof(*p));
    p->bytesize = fn->bytes;
    p->poolProps.location.type = TL_MEM_LOCATION_DEVICE;
    p->poolProps.location.id = fn->dev;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *g)
{
    struct fake_node *fn = n;
    if (!fn || !g || fn->type != TL_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *g = fn->child;
    return CUDA_SUCCESS;
}

static void footprint(struct fake_graph *g, unsigned long long *bytes, int depth)
{
    for (int i = 0; g && depth < 8 && i < g->n; i++) {
        if (g->nodes[i].type == TL_GRAPH_NODE_TYPE_MEM_ALLOC && g->nodes[i].dev >= 0 &&
            g->nodes[i].dev < FAKE_MAXDEV)
            bytes[g->nodes[i].dev] += g->nodes[i].bytes;
        else if (g->nodes[i].type == TL_GRAPH_NODE_TYPE_GRAPH)
            footprint(g->nodes[i].child, bytes, depth + 1);
    }
}

/* First launch or upload: back the exec's allocations from the pool,
 * growing it (device memory) when what it holds is not enough. */
static CUresult map_exec(struct fake_exec *e)
{
    pthread_mutex_lock(&fake_mu);
    if (!e->mapped) {
        const char *gr = getenv("FAKE_GRAPH_GRANULE");
        unsigned long long g = gr ? strtoull(gr, NULL, 0) : 0;
        for (int d = 0; d < FAKE_MAXDEV; d++) {
            unsigned long long need = gp_used[d] + e->bytes[d];
            unsigned long long grow = need > gp_res[d] ? need - gp_res[d] : 0;
            if (g && grow % g)
                grow += g - grow % g;
            if (grow && fake_mem_take(d, grow) != 0) {
                for (int k = 0; k < d; k++)
                    gp_used[k] -= e->bytes[k];
                pthread_mutex_unlock(&fake_mu);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            gp_res[d] += grow;
            gp_used[d] = need;
        }
        e->mapped = 1;
    }
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

static struct fake_exec *exec_of(CUgraphExec e)
{
    struct fake_exec *f = e;
    return f >= execs && f < execs + MAXG && f->live ? f : NULL;
}

static CUresult instantiate(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    struct fake_graph *fg = g;
    if (!pe || !fg || !fg->live)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    struct fake_exec *e = NULL;
    for (int i = 0; i < MAXG && !e; i++)
        if (!execs[i].live)
            e = &execs[i];
    if (e) {
        memset(e, 0, sizeof(*e));
        e->live = 1;
        footprint(fg, e->bytes, 0);
    }
    pthread_mutex_unlock(&fake_mu);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((flags & TL_GRAPH_INSTANTIATE_FLAG_UPLOAD) && map_exec(e) != CUDA_SUCCESS) {
        e->live = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pe = e;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    return instantiate(pe, g, flags);
}
FAKE_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g, TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    return instantiate(pe, g, p ? p->flags : 0);
}
FAKE_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g,
                                                       TL_GRAPH_INSTANTIATE_PARAMS *p)
{
    return instantiate(pe, g, p ? p->flags : 0);
}
FAKE_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    (void)err; (void)log; (void)n;
    return instantiate(pe, g, 0);
}
FAKE_EXPORT CUresult cuGraphInstantiate(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    (void)err; (void)log; (void)n;
    return instantiate(pe, g, 0);
}

FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec ge)
{
    struct fake_exec *e = exec_of(ge);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    for (int d = 0; e->mapped && d < FAKE_MAXDEV; d++)
        gp_used[d] -= e->bytes[d];
    e->live = 0;
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

static CUresult upload(CUgraphExec e)
{
    struct fake_exec *f = exec_of(e);
    return f ? map_exec(f) : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s) { (void)s; return upload(e); }
FAKE_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) { (void)s; return upload(e); }

/* The tests launch NULL execs to count launches without a graph. */
static CUresult graph_launch(CUgraphExec g, CUstream s)
{
    NEED_INIT();
    struct fake_exec *e = exec_of(g);
    if (g && !e)
        return CUDA_ERROR_INVALID_VALUE;
    if (e && map_exec(e) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_cpu();
    fake_ctx_on_launch(fake_current());
    fake_gpu_enqueue(fake_stream_dev(s), fake_graph_launch_cost(g));
    return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return graph_launch(g, s); }
FAKE_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return graph_launch(g, s); }

FAKE_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *v)
{
    if (dev < 0 || dev >= fake_ndev() || !v)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    *(unsigned long long *)v = attr == TL_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT ? gp_res[dev] : gp_used[dev];
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}

/* give back what the pool holds beyond what mapped execs use */
FAKE_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    if (dev < 0 || dev >= fake_ndev())
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_mu);
    fake_mem_give(dev, gp_res[dev] - gp_used[dev]);
    gp_res[dev] = gp_used[dev];
    pthread_mutex_unlock(&fake_mu);
    return CUDA_SUCCESS;
}
