/* The ZeRO engine (lib/parallel/zero_engine.h): per-unit reduce-scatter and all-gather over the
 * blocks lib/parallel/zero.c lays out, the model's hooks, export and import. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/ops.h"
#include "parallel/zero_engine.h"

void dl_zero_engine_init(dl_zero_engine *z, int stage, dl_dtype dt, dl_comm *comm)
{
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->dt = dt;
    z->dsize = (int)dl_dtype_size(dt);
    z->bf16 = dt == DL_BF16;
    z->comm = comm;
}

/* The engine's buffers: bf16's master weights of the shard (stage 0: everything), the reduced
 * gradient shard (stages 2-3), the parameter shard (stage 3); the staging of one padded unit for
 * stages 1-2 when a unit is padded, and for stages 2-3 in bf16 (the rounded gradient handed to
 * the reduce-scatter). */
static int alloc_buffers(dl_zero_engine *z)
{
    dl_arena *a = z->arena;
    size_t Sh = z->zu.shard, ss = (size_t)z->dsize;
    int padded = dl_zero_units_padded(&z->zu), rc = DL_OK;
    if ((z->bf16 && (rc = dl_arena_alloc(a, DL_MEM_OPTIMIZER, Sh * 4, (void **)&z->master))) ||
        (z->stage >= 2 && (rc = dl_arena_alloc(a, DL_MEM_GRADS, Sh * ss, (void **)&z->gshard))) ||
        (z->stage == 3 && (rc = dl_arena_alloc(a, DL_MEM_PARAMS, Sh * ss, (void **)&z->pshard))) ||
        ((((z->stage == 1 || z->stage == 2) && padded) || (z->bf16 && z->stage >= 2) ||
          (z->first && z->stage >= 1)) &&
         (rc = dl_arena_alloc(a, DL_MEM_COMM, z->zu.max_padded * ss, (void **)&z->stg))))
        return rc;
    return DL_OK;
}

int dl_zero_engine_setup(dl_zero_engine *z, const size_t *bounds, int n, int dp, int dp_rank,
                         void *params, void *grads, dl_arena *arena)
{
    return dl_zero_engine_setup_ep(z, bounds, n, dp, dp_rank, NULL, params, grads, arena);
}

int dl_zero_engine_setup_ep(dl_zero_engine *z, const size_t *bounds, int n, int dp, int dp_rank,
                            const dl_zero_experts *x, void *params, void *grads, dl_arena *arena)
{
    z->numel = n > 0 ? bounds[n] : 0;
    z->params = params;
    z->grads = grads;
    z->arena = arena;
    int on = z->stage > 0, rc;
    x = on ? x : NULL;
    if (x) {
        size_t bytes = sizeof(int) * (size_t)(x->nmodel + 1);
        if (!(z->first = malloc(bytes)))
            return dl_error(DL_ENOMEM, "zero: out of memory");
        memcpy(z->first, x->first, bytes);
        z->nmodel = x->nmodel;
        z->xcomm = x->comm;
    }
    rc = dl_zero_units_init2(&z->zu, bounds, n, on ? dp : 1, on ? dp_rank : 0, x ? x->expert : NULL,
                             x ? x->edp : 1, x ? x->edp_rank : 0);
    if (rc == DL_OK)
        rc = alloc_buffers(z);
    z->next_unit = z->zu.n;
    return rc;
}

void dl_zero_engine_free(dl_zero_engine *z)
{
    dl_zero_units_free(&z->zu);
    free(z->first);
    z->first = NULL;
    if (!z->arena) /* never set up */
        return;
    dl_arena_free(z->arena, z->master);
    dl_arena_free(z->arena, z->gshard);
    dl_arena_free(z->arena, z->pshard);
    dl_arena_free(z->arena, z->stg);
    z->master = z->gshard = z->pshard = z->stg = NULL;
}

void dl_zero_begin_step(dl_zero_engine *z)
{
    if (z->gshard)
        memset(z->gshard, 0, z->zu.shard * (size_t)z->dsize);
    z->next_unit = z->zu.n;
}

char *dl_zero_grad_block(dl_zero_engine *z, int u)
{
    const dl_zero_unit *b = &z->zu.u[u];
    if (z->stage >= 2)
        return z->gshard + b->sbase * (size_t)z->dsize;
    return (char *)z->grads + b->begin * (size_t)z->dsize;
}

char *dl_zero_param_block(dl_zero_engine *z, int u)
{
    const dl_zero_unit *b = &z->zu.u[u];
    if (z->stage == 3)
        return z->pshard + b->sbase * (size_t)z->dsize;
    return (char *)z->params + b->begin * (size_t)z->dsize;
}

int dl_zero_unit_reduce(const dl_zero_units *zu, int u, dl_comm *comm, dl_dtype dt, void *grads,
                        char *stg, int whole)
{
    const dl_zero_unit *b = &zu->u[u];
    size_t ss = dl_dtype_size(dt), n = (size_t)b->d * b->shard, r = (size_t)b->r;
    char *full = (char *)grads + b->lo * ss;
    char *buf = dl_zero_unit_staged(zu, u, grads, stg, (int)ss), *mine = buf + r * b->shard * ss;
    int rc = dl_reduce_scatter(comm, buf, mine, n, dt, DL_SUM, DL_PURPOSE_GRADS);
    if (rc == DL_OK && whole)
        rc = dl_allgather(comm, mine, buf, n, dt, DL_PURPOSE_GRADS);
    if (rc == DL_OK && buf != full) {
        if (whole)
            memcpy(full, buf, b->numel * ss);
        else
            memcpy(full + r * b->shard * ss, mine, b->owned * ss);
    }
    return rc;
}

/* the group engine unit u is sharded over */
static dl_comm *unit_comm(const dl_zero_engine *z, int u)
{
    return z->zu.u[u].grp ? z->xcomm : z->comm;
}

/* the engine units of the model's unit m: [*lo, *hi) */
static void model_unit(const dl_zero_engine *z, int m, int *lo, int *hi)
{
    *lo = z->first ? z->first[m] : m;
    *hi = z->first ? z->first[m + 1] : m + 1;
}

/* Stage 1: reduce-scatter unit u of the model's gradient buffer over its group; this rank's
 * block of the sum lands in place. */
static int rs_unit(dl_zero_engine *z, int u)
{
    return dl_zero_unit_reduce(&z->zu, u, unit_comm(z, u), z->dt, z->grads, z->stg, 0);
}

/* Stages 1-2: all-gather unit u's updated parameters into the model's buffer. */
static int ag_unit(dl_zero_engine *z, int u)
{
    const dl_zero_unit *b = &z->zu.u[u];
    size_t ss = (size_t)z->dsize, n = (size_t)b->d * b->shard, r = (size_t)b->r;
    char *full = (char *)z->params + b->lo * ss;
    dl_comm *c = unit_comm(z, u);
    if (n == b->numel)
        return dl_allgather(c, full + r * b->shard * ss, full, n, z->dt, DL_PURPOSE_PARAMS);
    char *own = z->stg + r * b->shard * ss;
    memcpy(own, full + r * b->shard * ss, b->owned * ss);
    memset(own + b->owned * ss, 0, (b->shard - b->owned) * ss);
    int rc = dl_allgather(c, own, z->stg, n, z->dt, DL_PURPOSE_PARAMS);
    if (rc == DL_OK)
        memcpy(full, z->stg, b->numel * ss);
    return rc;
}

/* Engine unit u's gradient as its collective takes it (d S_u elements, the padding zero): in
 * place when it needs no staging (the model's whole unit, padded by the model: `whole`), else in
 * stg, bf16 rounded there first. */
static char *rs_source(dl_zero_engine *z, int u, char *grad, int whole)
{
    const dl_zero_unit *b = &z->zu.u[u];
    size_t ss = (size_t)z->dsize, n = (size_t)b->d * b->shard, k = whole ? n : b->numel;
    if (z->bf16)
        dl_bf16_from_f32((uint16_t *)z->stg, (const float *)grad, k);
    else if (whole || n == b->numel)
        return grad;
    else
        memcpy(z->stg, grad, k * ss);
    memset(z->stg + k * ss, 0, (n - k) * ss);
    return z->stg;
}

/* Stages 2-3: engine unit u's gradient (at grad) reduce-scattered over its group, this rank's
 * block added into the gradient shard. */
static int rs_add(dl_zero_engine *z, int u, char *grad, int whole)
{
    const dl_zero_unit *b = &z->zu.u[u];
    size_t ss = (size_t)z->dsize, n = (size_t)b->d * b->shard, r = (size_t)b->r;
    char *src = rs_source(z, u, grad, whole);
    char *mine = src + r * b->shard * ss, *dst = dl_zero_grad_block(z, u);
    int rc = dl_reduce_scatter(unit_comm(z, u), src, mine, n, z->dt, DL_SUM, DL_PURPOSE_GRADS);
    if (rc)
        return rc;
    if (z->bf16)
        dl_bf16_acc((uint16_t *)dst, (const uint16_t *)mine, b->owned);
    else if (z->dsize == 8)
        for (size_t i = 0; i < b->owned; i++) ((double *)dst)[i] += ((const double *)mine)[i];
    else
        for (size_t i = 0; i < b->owned; i++) ((float *)dst)[i] += ((const float *)mine)[i];
    return DL_OK;
}

/* Stages 2-3: the model's unit m's gradient of one backward (compute type, padded, the padding
 * zero) is reduce-scattered at once, each engine unit of it over its group (bf16: rounded to
 * bf16 first, the ring adds in f32 and rounds per hop), and this rank's blocks are added into
 * the gradient shard. So the full gradient never exists; with several micro-batches each one's
 * gradient is reduced (DeepSpeed's stage 2 does the same): the traffic grows with the
 * micro-batches. The last engine unit first: an in-place collective may use the elements past
 * its own as scratch only where they are already reduced. */
int dl_zero_reduce_hook(void *arg, int m, void *grad)
{
    dl_zero_engine *z = arg;
    int lo, hi, rc = DL_OK;
    model_unit(z, m, &lo, &hi);
    size_t base = z->zu.u[lo].lo, ss = (size_t)(z->bf16 ? 4 : z->dsize);
    for (int u = hi - 1; u >= lo && rc == DL_OK; u--)
        rc = rs_add(z, u, (char *)grad + (z->zu.u[u].lo - base) * ss, hi - lo == 1);
    return rc;
}

/* Stage 3: the model's unit m's parameters from every rank's block, before its forward and
 * again before its backward, into the model's unit buffer (an engine unit of several whose
 * gather would overrun its place goes through stg). */
int dl_zero_gather_hook(void *arg, int m, void *dst)
{
    dl_zero_engine *z = arg;
    int lo, hi, rc = DL_OK;
    model_unit(z, m, &lo, &hi);
    size_t ss = (size_t)z->dsize, base = z->zu.u[lo].lo;
    for (int u = lo; u < hi && rc == DL_OK; u++) {
        const dl_zero_unit *b = &z->zu.u[u];
        size_t n = (size_t)b->d * b->shard;
        char *to = (char *)dst + (b->lo - base) * ss;
        char *via = hi - lo == 1 || n == b->numel ? to : z->stg;
        rc = dl_allgather(unit_comm(z, u), dl_zero_param_block(z, u), via, n, z->dt,
                          DL_PURPOSE_PARAMS);
        if (rc == DL_OK && via != to)
            memcpy(to, via, b->numel * ss);
    }
    return rc;
}

int dl_zero_ready(dl_zero_engine *z, size_t first)
{
    int rc = DL_OK;
    if (z->stage != 1)
        return DL_OK;
    while (rc == DL_OK && z->next_unit > 0 && z->zu.u[z->next_unit - 1].lo >= first)
        rc = rs_unit(z, --z->next_unit);
    return rc;
}

int dl_zero_gather_params(dl_zero_engine *z)
{
    int rc = DL_OK;
    for (int u = 0; rc == DL_OK && u < z->zu.n; u++) rc = ag_unit(z, u);
    return rc;
}

int dl_zero_export(dl_zero_engine *z, int which, void *out)
{
    size_t es = z->bf16 ? 4 : (size_t)z->dsize, ss = (size_t)z->dsize;
    int widen = z->bf16 && which == 1;
    if (!z->stage) {
        const void *src = which ? z->grads : z->bf16 ? (void *)z->master : z->params;
        if (widen)
            dl_bf16_widen(out, src, z->numel);
        else
            memcpy(out, src, z->numel * es);
        return DL_OK;
    }
    size_t bs = which == 0 && z->bf16 ? 4 : ss; /* element size of what travels */
    dl_dtype t = which == 0 && z->bf16 ? DL_F32 : z->dt;
    char *blk = malloc(z->zu.max_padded * bs + 64), *all = malloc(z->zu.max_padded * bs + 64);
    int rc = blk && all ? DL_OK : dl_error(DL_ENOMEM, "export: out of memory");
    for (int u = 0; rc == DL_OK && u < z->zu.n; u++) {
        const dl_zero_unit *b = &z->zu.u[u];
        const char *src = which     ? dl_zero_grad_block(z, u)
                          : z->bf16 ? z->master + b->sbase * 4
                                    : dl_zero_param_block(z, u);
        memcpy(blk, src, b->owned * bs);
        memset(blk + b->owned * bs, 0, (b->shard - b->owned) * bs);
        if ((rc = dl_allgather(unit_comm(z, u), blk, all, (size_t)b->d * b->shard, t,
                               DL_PURPOSE_OTHER)))
            break;
        if (widen)
            dl_bf16_widen((float *)out + b->lo, (const uint16_t *)all, b->numel);
        else
            memcpy((char *)out + b->lo * es, all, b->numel * es);
    }
    free(blk), free(all);
    return rc;
}

void dl_zero_import(dl_zero_engine *z, const void *full)
{
    size_t es = z->bf16 ? 4 : (size_t)z->dsize, ss = (size_t)z->dsize;
    for (int u = 0; u < z->zu.n; u++) {
        const dl_zero_unit *b = &z->zu.u[u];
        const char *src = (const char *)full + b->begin * es;
        if (z->bf16)
            memcpy(z->master + b->sbase * 4, src, b->owned * 4);
        if (z->stage == 3 && z->bf16)
            dl_bf16_from_f32((uint16_t *)dl_zero_param_block(z, u), (const float *)src, b->owned);
        else if (z->stage == 3)
            memcpy(dl_zero_param_block(z, u), src, b->owned * ss);
    }
    if (z->stage < 3 && z->bf16)
        dl_bf16_from_f32(z->params, full, z->numel);
    else if (z->stage < 3)
        memcpy(z->params, full, z->numel * ss);
}
