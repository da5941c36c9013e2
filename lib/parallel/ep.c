/* Mixture of experts in the trainer (parallel/module.h): expert parallelism and the MoE
 * layers' measurements.
 *
 * With --ep N the model's MoE layers spread their experts over the ep group (N consecutive dp
 * ranks, the mesh's ep_comm; the dispatch and combine are the sublayer's own all-to-all-v's,
 * model/sublayer_moe.c). Dense parameters are replicated over the whole dp group and reduced
 * there (the dp module); each expert's parameters are held by the dp / N ranks with the same ep
 * rank, the expert-data-parallel group (mesh edp_comm), and this module reduces their gradients
 * over it, as each MoE unit's gradient becomes final; the dp module leaves those ranges
 * (tr_env.excl). The gradient norm adds the other ep ranks' experts. With ZeRO 1-3 the sharding
 * module does both instead (parallel/zero_module.c): expert pieces of the units are sharded and
 * reduce-scattered over edp, dense ones over dp.
 *
 * With any MoE layer (ep 1 included) it resets the model's measurements before each step and,
 * after the backward, sums them over the dp group into rank 0's per-step tables
 * (dl_train_moe_result): choices routed and dropped per layer and expert, the auxiliary and z
 * losses, the routing hash; each rank's all-to-all bytes and combine wait. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/module.h"
#include "model/gpt_priv.h"

typedef struct ep_state {
    tr_env *e;
    int ep, nmoe, E;
    int nall;    /* the model's MoE layers (a pipeline stage holds nmoe of them) */
    int reduces; /* this module reduces the expert gradients over edp (ep > 1, no ZeRO, not bf16) */
    size_t *xr;  /* [2 * nxr]: the expert tensors' ranges [lo, hi) of the flat buffer, merged */
    int nxr;
    size_t *tr; /* [2 * ntr]: tp > 1: the MoE sublayers' tensors (ln_2, router, experts), merged */
    int ntr;
    int pending;  /* ranges [0, pending) are not reduced yet this step (they end at the top) */
    double *sums; /* the dp sum's buffer */
} ep_state;

/* tensor t of an MoE layer's MoE sublayer (its ln_2, its router, its experts) */
static int moe_tensor(const dl_gpt_config *c, const char *name)
{
    int L, at = 0;
    if (sscanf(name, "h.%d.%n", &L, &at) != 1 || !at || !dl__moe_layer(c, L))
        return 0;
    return !strncmp(name + at, "ln_2.", 5) || !strncmp(name + at, "mlp.", 4);
}

/* the ranges of the tensors `pick` selects (0: experts, 1: MoE sublayers), merged where
 * adjacent, in offset order */
static int find_ranges(const dl_gpt_layout *l, int pick, size_t **out, int *n)
{
    size_t *r = malloc(sizeof(size_t) * 2 * (size_t)(l->ntensors + 1));
    if (!(*out = r))
        return dl_error(DL_ENOMEM, "expert parallelism: out of memory");
    *n = 0;
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        if (pick ? !moe_tensor(&l->cfg, t->name) : !dl__is_expert(t->name))
            continue;
        if (*n && r[2 * *n - 1] == t->offset)
            r[2 * *n - 1] += t->numel;
        else
            r[2 * *n] = t->offset, r[2 * *n + 1] = t->offset + t->numel, ++*n;
    }
    return DL_OK;
}

static int ep_model_opts(void *st, dl_gpt_opts *go)
{
    ep_state *s = st;
    go->ep = s->ep;
    go->ep_comm = s->e->mesh->ep_comm;
    return DL_OK;
}

/* rank 0's per-step tables */
static int alloc_tables(ep_state *s)
{
    tr_env *e = s->e;
    dl_train_moe_result *m = &e->res->moe;
    size_t steps = (size_t)e->o->optim.steps + 1, le = (size_t)s->nall * s->E;
    size_t nr = (size_t)e->res->nranks;
    m->layers = s->nall, m->experts = s->E;
    m->layer = calloc((size_t)s->nall, sizeof(int));
    m->routed = calloc(steps * le, sizeof(int64_t));
    m->dropped = calloc(steps * le, sizeof(int64_t));
    m->aux = calloc(steps, sizeof(double)), m->z = calloc(steps, sizeof(double));
    m->hash = calloc(steps * (size_t)s->nall, sizeof(uint64_t));
    m->a2a_bytes = calloc(steps * nr, sizeof(double));
    m->combine_wait_ms = calloc(steps * nr, sizeof(double));
    if (!m->layer || !m->routed || !m->dropped || !m->aux || !m->z || !m->hash || !m->a2a_bytes ||
        !m->combine_wait_ms)
        return dl_error(DL_ENOMEM, "mixture of experts: out of memory");
    for (int i = 0; i < s->nall; i++) m->layer[i] = i * e->o->model.moe_every;
    return DL_OK;
}

static int ep_setup(void *st)
{
    ep_state *s = st;
    tr_env *e = s->e;
    s->nmoe = dl_gpt_moe_layers(e->g);
    s->nall = (e->o->model.layers - 1) / e->o->model.moe_every + 1;
    s->E = e->o->model.experts;
    /* per layer of the model: routed, dropped per expert, aux, z, seqs, the hash's two halves;
     * then bytes and wait per rank */
    size_t n = (size_t)s->nall * (2 * (size_t)s->E + 5) + 2 * (size_t)e->res->nranks;
    int rc;
    if (!(s->sums = calloc(n, sizeof(double))))
        return dl_error(DL_ENOMEM, "mixture of experts: out of memory");
    const dl_gpt_layout *l = dl_gpt_get_layout(e->g);
    if ((rc = find_ranges(l, 0, &s->xr, &s->nxr)) ||
        (e->o->layout.tp > 1 && (rc = find_ranges(l, 1, &s->tr, &s->ntr))))
        return rc;
    /* every forward is collective over the ep group: evaluations keep step */
    e->lockstep_fwd |= s->ep > 1;
    e->excl = s->reduces ? s->xr : NULL;
    e->nexcl = s->reduces ? s->nxr : 0;
    return e->rank == 0 ? alloc_tables(s) : DL_OK;
}

static int ep_begin(void *st)
{
    ep_state *s = st;
    dl_gpt_moe_reset(s->e->g);
    s->pending = s->nxr;
    return DL_OK;
}

/* the expert ranges now final, over the expert-data-parallel group */
static int ep_grads_ready(void *st, size_t first)
{
    ep_state *s = st;
    tr_env *e = s->e;
    int rc = DL_OK;
    while (rc == DL_OK && s->pending > 0 && s->xr[2 * (s->pending - 1)] >= first) {
        s->pending--;
        size_t lo = s->xr[2 * s->pending], n = s->xr[2 * s->pending + 1] - lo;
        char *base = (char *)dl_gpt_grads(e->g) + lo * (size_t)e->pr.dsize;
        if (e->mesh->edp_comm)
            rc = dl_allreduce(e->mesh->edp_comm, base, base, n, e->pr.dt, DL_SUM, DL_PURPOSE_GRADS);
    }
    return rc;
}

/* one layer's measurements into its place of the sum buffer, and back from it into rank 0's
 * tables */
static void put_layer(double *p, const dl_moe_stats *m)
{
    for (int x = 0; x < m->E; x++) *p++ = (double)m->routed[x], *p++ = (double)m->dropped[x];
    *p++ = m->aux, *p++ = m->z, *p++ = (double)m->seqs;
    *p++ = (double)(m->hash & 0xFFFFFFFFu), *p++ = (double)(m->hash >> 32);
}

static void record(ep_state *s, const double *p)
{
    tr_env *e = s->e;
    dl_train_moe_result *m = &e->res->moe;
    size_t st = (size_t)e->step - 1, le = (size_t)s->nall * s->E;
    double aux = 0, z = 0;
    for (int i = 0; i < s->nall; i++) {
        for (int x = 0; x < s->E; x++) {
            m->routed[st * le + (size_t)i * s->E + x] = (int64_t)*p++;
            m->dropped[st * le + (size_t)i * s->E + x] = (int64_t)*p++;
        }
        double a = *p++, zz = *p++, seqs = *p++, lo = *p++, hi = *p++;
        aux += a / (seqs * s->nall), z += zz / (seqs * s->nall);
        /* the halves' sums are exact (< 2^53); their recombination wraps as a u64 sum does */
        m->hash[st * s->nall + i] = (uint64_t)lo + ((uint64_t)hi << 32);
    }
    m->aux[st] = aux, m->z[st] = z;
}

/* After the backward: the measurements summed over the dp group and the pipeline's stages (each
 * stage its own MoE layers, each rank its own bytes and wait), into rank 0's tables at this
 * step. */
static int ep_reduce(void *st)
{
    ep_state *s = st;
    tr_env *e = s->e;
    int rc = s->reduces ? ep_grads_ready(st, 0) : DL_OK, nr = e->res->nranks;
    /* tp: each tp rank's share of the MoE sublayers' gradients (its sequences) summed */
    for (int i = 0; rc == DL_OK && i < s->ntr; i++) {
        char *base = (char *)dl_gpt_grads(e->g) + s->tr[2 * i] * (size_t)e->pr.dsize;
        rc = dl_allreduce(e->mesh->tp_comm, base, base, s->tr[2 * i + 1] - s->tr[2 * i], e->pr.dt,
                          DL_SUM, DL_PURPOSE_GRADS);
    }
    if (rc)
        return rc;
    size_t per = 2 * (size_t)s->E + 5, n = (size_t)s->nall * per + 2 * (size_t)nr;
    double *p = s->sums + (size_t)s->nall * per;
    memset(s->sums, 0, sizeof(double) * n);
    for (int i = 0; i < s->nmoe; i++) {
        const dl_moe_stats *m = dl_gpt_moe_stats(e->g, i);
        put_layer(s->sums + (size_t)(m->layer / e->o->model.moe_every) * per, m);
    }
    for (int i = 0; i < s->nmoe; i++) {
        const dl_moe_stats *m = dl_gpt_moe_stats(e->g, i);
        p[e->rank] += m->a2a_bytes, p[nr + e->rank] += (double)m->combine_wait_ns / 1e6;
    }
    if (e->o->layout.dp > 1 &&
        (rc = dl_allreduce(e->mesh->dp_comm, s->sums, s->sums, n, DL_F64, DL_SUM, DL_PURPOSE_LOSS)))
        return rc;
    if (e->mesh->pp > 1 &&
        (rc = dl_allreduce(e->mesh->pp_comm, s->sums, s->sums, n, DL_F64, DL_SUM, DL_PURPOSE_LOSS)))
        return rc;
    if (e->mesh->tp > 1 && /* each tp rank routed its own sequences */
        (rc = dl_allreduce(e->mesh->tp_comm, s->sums, s->sums, n, DL_F64, DL_SUM, DL_PURPOSE_LOSS)))
        return rc;
    if (e->rank == 0) {
        dl_train_moe_result *m = &e->res->moe;
        record(s, s->sums);
        memcpy(m->a2a_bytes + (size_t)(e->step - 1) * nr, p, sizeof(double) * (size_t)nr);
        memcpy(m->combine_wait_ms + (size_t)(e->step - 1) * nr, p + nr,
               sizeof(double) * (size_t)nr);
    }
    return DL_OK;
}

/* The squared norm: the other ep ranks' experts added (their gradients differ from ours). */
static int ep_reduce_norm(void *st, double *sq)
{
    ep_state *s = st;
    tr_env *e = s->e;
    double own = 0, all;
    if (e->mesh->tp_rank != 0) /* replicated over tp: counted on tp rank 0 (tr_tensor_counted) */
        return DL_OK;
    for (int i = 0; i < s->nxr; i++)
        own += e->pr.sumsq((char *)dl_gpt_grads(e->g) + s->xr[2 * i] * (size_t)e->pr.dsize,
                           s->xr[2 * i + 1] - s->xr[2 * i]);
    all = own;
    int rc = dl_allreduce(e->mesh->ep_comm, &all, &all, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
    *sq += all - own;
    return rc;
}

static void ep_teardown(void *st)
{
    ep_state *s = st;
    free(s->xr), free(s->tr), free(s->sums), free(s);
}

int tr_ep_make(tr_env *e, tr_module *m)
{
    const dl_train_opts *o = e->o;
    if (o->model.experts <= 0)
        return DL_OK;
    ep_state *s = calloc(1, sizeof *s);
    if (!s)
        return dl_error(DL_ENOMEM, "mixture of experts: out of memory");
    s->e = e;
    s->ep = o->layout.ep > 1 ? o->layout.ep : 1;
    *m = (tr_module){.name = "ep",
                     .st = s,
                     .model_opts = ep_model_opts,
                     .setup = ep_setup,
                     .begin = ep_begin,
                     .reduce = ep_reduce,
                     .teardown = ep_teardown};
    /* with ZeRO the sharding module reduces the expert pieces over edp and sums their norm */
    /* bf16 at stage 0: the dp-bf16 module reduces the expert pieces over edp (parallel/dp_bf16.c),
     * each rank then holding its experts' whole gradient as without bf16 */
    s->reduces = s->ep > 1 && !tr_zero_stage(o) && !e->pr.bf16;
    if (s->reduces)
        m->grads_ready = ep_grads_ready;
    if (s->ep > 1 && !tr_zero_stage(o))
        m->reduce_norm = ep_reduce_norm;
    return DL_OK;
}

/* The layouts a mixture of experts composes with: dp x ep, tp (the micro-batch's sequences split
 * over it), pp (one chunk a stage: pipe_train.c refuses the others), ZeRO 0-3, f32, f64 and bf16;
 * tp with ZeRO 2-3 or bf16, and full recomputation refused by name. */
int tr_ep_resolve(dl_train_opts *o)
{
    int ep = o->layout.ep > 1 ? o->layout.ep : 1, E = o->model.experts;
    if (o->layout.ep < 0)
        return dl_error(DL_EINVAL, "--ep must be >= 1 (got %d)", o->layout.ep);
    if (ep > 1 && E <= 0)
        return dl_error(DL_EINVAL, "--ep %d needs a mixture of experts (--experts)", ep);
    if (E <= 0)
        return DL_OK;
    if (o->layout.dp % ep)
        return dl_error(DL_EINVAL, "--ep %d does not divide dp %d (the ep group lies inside dp)",
                        ep, o->layout.dp);
    if (E % ep)
        return dl_error(DL_EINVAL, "--experts %d is not divisible by --ep %d", E, ep);
    /* tp: each tp rank takes its share of a micro-batch's sequences (model/moe_impl.h); the
     * trainer sums the shares' gradients once the step's are complete, which ZeRO 2-3 (per
     * micro-batch reductions) and bf16 (a sum in bf16) do not wait for */
    int tp = o->layout.tp;
    if (tp > 1 && o->batch.micro % tp)
        return dl_error(DL_EINVAL,
                        "a mixture of experts with tp %d splits each micro-batch's sequences over "
                        "tp: --micro-batch %d is not a multiple of %d",
                        tp, o->batch.micro, tp);
    const char *no = tp > 1 && o->zero.stage >= 2 && o->layout.dp > 1 ? "tp > 1 and ZeRO 2-3"
                     : tp > 1 && o->precision.dtype == DL_BF16        ? "tp > 1 and bf16"
                     : o->precision.recompute == DL_RECOMPUTE_FULL    ? "--recompute"
                                                                      : NULL;
    if (no)
        return dl_error(DL_EINVAL,
                        "a mixture of experts with %s is not supported: it composes with dp and "
                        "--ep, tp, pp, ZeRO 1-3 and bf16",
                        no);
    return DL_OK;
}
