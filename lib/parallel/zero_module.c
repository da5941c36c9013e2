/* ZeRO 0-3 as the trainer's sharding module (lib/parallel/module.h): the engine
 * (lib/parallel/zero_engine.h) under the GPT, its blocks handed to the optimizer as the shards
 * (stage 0: one shard, d = 1). See docs/ARCHITECTURE.md, "The trainer". */
#include "config.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "distlab/ckpt.h"
#include "core/testhook.h"
#include "model/gpt_priv.h"
#include "parallel/zero_engine.h"
#include "parallel/module.h"

typedef struct zm_state {
    tr_env *e;
    dl_zero_engine z;
    tr_shards shards;
} zm_state;

/* The test hook's perturbation (lib/core/testhook.h): one element of this rank's parameters, where
 * the rank keeps it (the shard at stage 3, where this rank owns the element). */
static void test_perturb(zm_state *s, int rank)
{
    dl_zero_engine *z = &s->z;
    dl__test_hook *h = dl__test_hook_get();
    if (!h || h->perturb_rel == 0 || h->perturb_rank != rank || z->bf16 ||
        h->perturb_index >= z->numel)
        return;
    size_t i = h->perturb_index;
    char *base = z->params;
    if (z->stage == 3) {
        base = NULL;
        for (int u = 0; u < z->zu.n && !base; u++) {
            const dl_zero_unit *b = &z->zu.u[u];
            if (i >= b->begin && i < b->begin + b->owned)
                base = dl_zero_param_block(z, u), i -= b->begin;
        }
        if (!base)
            return;
    }
    if (z->dsize == 8)
        ((double *)base)[i] *= 1 + h->perturb_rel;
    else
        ((float *)base)[i] *= (float)(1 + h->perturb_rel);
    atomic_fetch_add(&h->perturbed, 1);
}

static char *shard_grad(void *arg, int u) { return dl_zero_grad_block(arg, u); }
static char *shard_param(void *arg, int u) { return dl_zero_param_block(arg, u); }

static int shard_model_opts(void *st, dl_gpt_opts *go)
{
    zm_state *s = st;
    go->unit_pad = s->z.stage ? s->e->o->layout.dp : 1;
    go->gather = s->z.stage == 3 ? dl_zero_gather_hook : NULL;
    go->reduce = s->z.stage >= 2 ? dl_zero_reduce_hook : NULL;
    go->hook_arg = &s->z;
    return DL_OK;
}

/* The initial (or loaded) parameters: with bf16 or at stage 3 the whole model in host memory
 * once, in the export type, each rank keeping its part (FSDP initialises on the host and shards
 * likewise); otherwise loaded in place (the model initialised itself). */
static int shard_load(zm_state *s)
{
    const dl_train_opts *o = s->e->o;
    const dl_gpt_layout *l = dl_gpt_get_layout(s->e->g);
    dl_zero_engine *z = &s->z;
    if (!z->bf16 && z->stage < 3)
        return o->ckpt.load ? dl_ckpt_load(o->ckpt.load, l, z->params, z->dsize) : DL_OK;
    size_t es = z->bf16 ? 4 : (size_t)z->dsize;
    void *full = malloc(z->numel * es + 64);
    if (!full)
        return dl_error(DL_ENOMEM, "training: out of host memory for the initial parameters");
    int rc = DL_OK;
    if (o->ckpt.load)
        rc = dl_ckpt_load(o->ckpt.load, l, full, (int)es);
    else
        dl_gpt_init(l, full, (int)es, o->optim.seed);
    if (rc == DL_OK)
        dl_zero_import(z, full);
    free(full);
    return rc;
}

void tr_pieces_free(tr_pieces *c)
{
    free(c->bounds), free(c->expert), free(c->first);
    memset(c, 0, sizeof *c);
}

int tr_unit_bounds(const tr_env *e, size_t **bounds, int *n)
{
    *n = dl_gpt_num_units(e->g);
    *bounds = malloc(sizeof(size_t) * (size_t)(*n + 1));
    if (!*bounds)
        return dl_error(DL_ENOMEM, "training: the units' bounds: out of memory");
    for (int u = 0; u <= *n; u++) (*bounds)[u] = dl_gpt_unit_offset(e->g, u);
    return DL_OK;
}

int tr_unit_pieces(const tr_env *e, const size_t *ub, int nu, tr_pieces *c)
{
    const dl_gpt_layout *l = dl_gpt_get_layout(e->g);
    size_t cap = (size_t)(nu + l->ntensors + 1);
    c->bounds = malloc(sizeof(size_t) * cap), c->expert = malloc(cap);
    c->first = malloc(sizeof(int) * (size_t)(nu + 1));
    if (!c->bounds || !c->expert || !c->first)
        return dl_error(DL_ENOMEM, "the units' expert pieces: out of memory");
    c->n = 0;
    for (int u = 0, k = 0; u < nu; u++) {
        c->first[u] = c->n;
        for (; k < l->ntensors && l->t[k].offset < ub[u + 1]; k++) {
            int x = dl__is_expert(l->t[k].name);
            if (l->t[k].offset == ub[u] || x != c->expert[c->n - 1])
                c->bounds[c->n] = l->t[k].offset, c->expert[c->n++] = (unsigned char)x;
        }
    }
    c->first[nu] = c->n;
    c->bounds[c->n] = ub[nu];
    return DL_OK;
}

/* the engine over the model's units, or (expert parallelism) over their dense and expert pieces */
static int setup_engine(zm_state *s, const size_t *ub, int nu)
{
    tr_env *e = s->e;
    const dl_mesh *m = e->mesh;
    void *p = dl_gpt_params(e->g), *gr = dl_gpt_grads(e->g);
    dl_arena *a = dl_ctx_arena(e->ctx);
    if (!m->edp_comm || !s->z.stage)
        return dl_zero_engine_setup(&s->z, ub, nu, m->dp, m->dp_rank, p, gr, a);
    tr_pieces c = {0};
    int rc = tr_unit_pieces(e, ub, nu, &c);
    dl_zero_experts x = {c.expert, c.first, nu, m->edp_comm, m->dp / m->ep, m->dp_rank / m->ep};
    if (rc == DL_OK)
        rc = dl_zero_engine_setup_ep(&s->z, c.bounds, c.n, m->dp, m->dp_rank, &x, p, gr, a);
    tr_pieces_free(&c);
    return rc;
}

/* After the model: the units, the engine's buffers, the parameters. */
static int shard_setup(void *st)
{
    zm_state *s = st;
    tr_env *e = s->e;
    int nu;
    size_t *bounds;
    int rc = tr_unit_bounds(e, &bounds, &nu);
    if (rc == DL_OK)
        rc = setup_engine(s, bounds, nu);
    free(bounds);
    if (rc)
        return rc;
    s->shards = (tr_shards){&s->z.zu, shard_grad, shard_param, (float *)s->z.master, &s->z};
    if ((rc = shard_load(s)))
        return rc;
    test_perturb(s, e->rank);
    return DL_OK;
}

static int shard_begin(void *st)
{
    dl_zero_begin_step(&((zm_state *)st)->z);
    return DL_OK;
}

static int shard_ready(void *st, size_t first)
{
    return dl_zero_ready(&((zm_state *)st)->z, first);
}

/* each dp rank summed its shard of the reduced gradient */
static int shard_norm(void *st, double *sq)
{
    zm_state *s = st;
    return dl_allreduce(s->z.comm, sq, sq, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
}

/* stages 1-2 all-gather the updated parameters unit by unit (stage 3 gathers before each use) */
static int shard_gather(void *st) { return dl_zero_gather_params(&((zm_state *)st)->z); }

static int shard_export(void *st, int which, void *out)
{
    return dl_zero_export(&((zm_state *)st)->z, which, out);
}

static void shard_import(void *st, const void *full) { dl_zero_import(&((zm_state *)st)->z, full); }

static void *shard_whole(void *st)
{
    dl_zero_engine *z = &((zm_state *)st)->z;
    return !z->bf16 && z->stage < 3 ? z->params : NULL;
}

static void shard_report(void *st, dl_train_result *res)
{
    const dl_zero_engine *z = &((zm_state *)st)->z;
    res->zero.stage = z->stage;
    res->zero.padded = (int64_t)z->zu.padded;
    res->zero.padding = (int64_t)z->zu.padding;
    res->zero.shard = (int64_t)z->zu.shard;
    res->zero.units = z->zu.n;
}

static void shard_teardown(void *st)
{
    zm_state *s = st;
    dl_zero_engine_free(&s->z);
    free(s);
}

/* ZeRO's part of the configuration (modules.def: dl_train_resolve calls it). */
int tr_shard_resolve(dl_train_opts *o)
{
    if (o->zero.stage < 0 || o->zero.stage > 3)
        return dl_error(DL_EINVAL, "ZeRO stage must be 0, 1, 2 or 3 (got %d)", o->zero.stage);
    return DL_OK;
}

int tr_zero_stage(const dl_train_opts *o)
{
    /* with dp = 1 the one shard is the whole buffer: stage 0 runs (nothing to scatter) */
    return o->layout.dp > 1 && !o->eval.only ? o->zero.stage : 0;
}

int tr_shard_make(tr_env *e, tr_module *m)
{
    const dl_train_opts *o = e->o;
    zm_state *s = calloc(1, sizeof *s);
    if (!s)
        return dl_error(DL_ENOMEM, "training: out of memory");
    s->e = e;
    int stage = tr_zero_stage(o);
    dl_zero_engine_init(&s->z, stage, e->pr.dt, e->mesh->dp_comm);
    e->lockstep_fwd = stage == 3;
    *m = (tr_module){.name = "zero",
                     .st = s,
                     .model_opts = shard_model_opts,
                     .setup = shard_setup,
                     .begin = shard_begin,
                     .grads_ready = stage == 1 ? shard_ready : NULL,
                     .reduce_norm = stage ? shard_norm : NULL,
                     .after_update = stage == 1 || stage == 2 ? shard_gather : NULL,
                     .shards = &s->shards,
                     .export_state = shard_export,
                     .import_state = shard_import,
                     .whole_params = shard_whole,
                     .report = shard_report,
                     .teardown = shard_teardown};
    return DL_OK;
}
