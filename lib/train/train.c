/* The trainer: each rank's set-up, its step loop over the strategy modules (parallel/module.h,
 * composed in train/compose.c from the list in train/modules.def) and the run around the ranks.
 * This file also holds ZeRO's per-unit sharding and its module (stage 0: one shard, d = 1). */
#define _GNU_SOURCE
#include "config.h"
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/gpt_priv.h"
#include "model/ops.h"
#include "parallel/zero.h"
#include "distlab/train.h"
#include "distlab/data.h"
#include "distlab/ckpt.h"
#include "distlab/mpi.h"
#include "core/testhook.h"
#include "train/compose.h"
#include "train/dump.h"
#include "train/eval.h"
#include "train/report.h"
#include "train/run.h"

/* ZeRO's state (see docs/ARCHITECTURE.md, "The trainer"): stage 0 when off or dp == 1. */
typedef struct rank_state {
    tr_env *e;
    dl_mesh mesh;
    dl_gpt *g;
    size_t numel;
    int dsize;
    dl_dtype dt;
    int stage;
    dl_zero_units zu; /* per-unit shards (stage 0: d = 1, the blocks are the units) */
    int bf16;
    char *master;  /* bf16: fp32 master weights of the shard (optimizer category) */
    char *gshard;  /* stages 2-3: the reduced gradient of the shard */
    char *pshard;  /* stage 3: the parameters of the shard */
    char *stg;     /* one padded unit in the storage type (comm), when needed */
    int next_unit; /* stage 1: units >= next_unit are reduce-scattered (this step) */
    tr_shards shards;
} rank_state;

/* ---- ZeRO: per-unit shards (lib/parallel/zero.h) ---- */

/* This rank's reduced gradient of unit u's block (storage type): in the model's gradient buffer
 * (stages 0-1) or in the shard (2-3). */
static char *zgrad(rank_state *s, int u)
{
    const dl_zero_unit *z = &s->zu.u[u];
    if (s->stage >= 2)
        return s->gshard + z->sbase * (size_t)s->dsize;
    return (char *)dl_gpt_grads(s->g) + z->begin * (size_t)s->dsize;
}

/* ... and its parameters (storage type). */
static char *zparam(rank_state *s, int u)
{
    const dl_zero_unit *z = &s->zu.u[u];
    if (s->stage == 3)
        return s->pshard + z->sbase * (size_t)s->dsize;
    return (char *)dl_gpt_params(s->g) + z->begin * (size_t)s->dsize;
}

/* Stage 1: reduce-scatter unit u of the model's gradient buffer over the dp group; this rank's
 * block of the sum lands in place (through the staging buffer when the unit is padded). */
static int zero_rs_unit(rank_state *s, int u)
{
    const dl_zero_unit *z = &s->zu.u[u];
    size_t ss = (size_t)s->dsize, n = (size_t)s->zu.dp * z->shard, r = (size_t)s->zu.rank;
    char *full = (char *)dl_gpt_grads(s->g) + z->lo * ss;
    if (n == z->numel)
        return dl_reduce_scatter(s->mesh.dp_comm, full, full + r * z->shard * ss, n, s->dt, DL_SUM,
                                 DL_PURPOSE_GRADS);
    memcpy(s->stg, full, z->numel * ss);
    memset(s->stg + z->numel * ss, 0, (n - z->numel) * ss);
    int rc = dl_reduce_scatter(s->mesh.dp_comm, s->stg, s->stg + r * z->shard * ss, n, s->dt,
                               DL_SUM, DL_PURPOSE_GRADS);
    if (rc == DL_OK)
        memcpy(full + r * z->shard * ss, s->stg + r * z->shard * ss, z->owned * ss);
    return rc;
}

/* Stages 1-2: all-gather unit u's updated parameters into the model's buffer. */
static int zero_ag_unit(rank_state *s, int u)
{
    const dl_zero_unit *z = &s->zu.u[u];
    size_t ss = (size_t)s->dsize, n = (size_t)s->zu.dp * z->shard, r = (size_t)s->zu.rank;
    char *full = (char *)dl_gpt_params(s->g) + z->lo * ss;
    if (n == z->numel)
        return dl_allgather(s->mesh.dp_comm, full + r * z->shard * ss, full, n, s->dt,
                            DL_PURPOSE_PARAMS);
    char *own = s->stg + r * z->shard * ss;
    memcpy(own, full + r * z->shard * ss, z->owned * ss);
    memset(own + z->owned * ss, 0, (z->shard - z->owned) * ss);
    int rc = dl_allgather(s->mesh.dp_comm, own, s->stg, n, s->dt, DL_PURPOSE_PARAMS);
    if (rc == DL_OK)
        memcpy(full, s->stg, z->numel * ss);
    return rc;
}

/* Stages 2-3 (the model's reduce hook): unit u's gradient of one backward (compute type, padded,
 * the padding zero) is reduce-scattered at once (bf16: rounded to bf16 first, the ring adds in
 * f32 and rounds per hop) and this rank's block is added into the gradient shard. So the full
 * gradient never exists; with several micro-batches each one's gradient is reduced (DeepSpeed's
 * stage 2 does the same): the traffic grows with the micro-batches. */
static int zero_reduce_hook(void *arg, int u, void *grad)
{
    rank_state *s = arg;
    const dl_zero_unit *z = &s->zu.u[u];
    size_t ss = (size_t)s->dsize, n = (size_t)s->zu.dp * z->shard, r = (size_t)s->zu.rank;
    char *src = grad;
    if (s->bf16) {
        dl_bf16_from_f32((uint16_t *)s->stg, grad, n);
        src = s->stg;
    }
    char *mine = src + r * z->shard * ss, *dst = zgrad(s, u);
    int rc = dl_reduce_scatter(s->mesh.dp_comm, src, mine, n, s->dt, DL_SUM, DL_PURPOSE_GRADS);
    if (rc)
        return rc;
    if (s->bf16)
        dl_bf16_acc((uint16_t *)dst, (const uint16_t *)mine, z->owned);
    else if (s->dsize == 8)
        for (size_t i = 0; i < z->owned; i++) ((double *)dst)[i] += ((const double *)mine)[i];
    else
        for (size_t i = 0; i < z->owned; i++) ((float *)dst)[i] += ((const float *)mine)[i];
    return DL_OK;
}

/* Stage 3 (the model's gather hook): unit u's parameters from every rank's block, before its
 * forward and again before its backward, into the model's unit buffer. */
static int zero_gather_hook(void *arg, int u, void *dst)
{
    rank_state *s = arg;
    const dl_zero_unit *z = &s->zu.u[u];
    return dl_allgather(s->mesh.dp_comm, zparam(s, u), dst, (size_t)s->zu.dp * z->shard, s->dt,
                        DL_PURPOSE_PARAMS);
}

/* Gradients at [first, numel) are final (the last micro-batch's backward): stage 1
 * reduce-scatters every unit that is complete, as soon as it is. Stages 2-3 reduced in the
 * model's hook already. */
static int zero_ready(rank_state *s, size_t first)
{
    int rc = DL_OK;
    if (s->stage != 1)
        return DL_OK;
    while (rc == DL_OK && s->next_unit > 0 && s->zu.u[s->next_unit - 1].lo >= first)
        rc = zero_rs_unit(s, --s->next_unit);
    return rc;
}

/* The whole buffer (P elements) for the caller, in the export type (f64 for f64 runs, f32
 * otherwise: a bf16 run exports its fp32 master weights and its gradients widened): the
 * parameters (which = 0) or the reduced gradients (1). Collective over the dp group with ZeRO
 * (purpose OTHER: not training traffic); `out` is host memory. */
static int zero_export(rank_state *s, int which, void *out)
{
    size_t es = s->bf16 ? 4 : (size_t)s->dsize, ss = (size_t)s->dsize;
    int widen = s->bf16 && which == 1;
    if (!s->stage) {
        const void *src = which     ? dl_gpt_grads(s->g)
                          : s->bf16 ? (void *)s->master
                                    : dl_gpt_params(s->g);
        if (widen)
            dl_bf16_widen(out, src, s->numel);
        else
            memcpy(out, src, s->numel * es);
        return DL_OK;
    }
    size_t bs = which == 0 && s->bf16 ? 4 : ss; /* element size of what travels */
    dl_dtype t = which == 0 && s->bf16 ? DL_F32 : s->dt;
    size_t d = (size_t)s->zu.dp;
    char *blk = malloc(s->zu.max_padded / d * bs + 64), *all = malloc(s->zu.max_padded * bs + 64);
    int rc = blk && all ? DL_OK : dl_error(DL_ENOMEM, "export: out of memory");
    for (int u = 0; rc == DL_OK && u < s->zu.n; u++) {
        const dl_zero_unit *z = &s->zu.u[u];
        const char *src = which ? zgrad(s, u) : s->bf16 ? s->master + z->sbase * 4 : zparam(s, u);
        memcpy(blk, src, z->owned * bs);
        memset(blk + z->owned * bs, 0, (z->shard - z->owned) * bs);
        if ((rc = dl_allgather(s->mesh.dp_comm, blk, all, d * z->shard, t, DL_PURPOSE_OTHER)))
            break;
        if (widen)
            dl_bf16_widen((float *)out + z->lo, (const uint16_t *)all, z->numel);
        else
            memcpy((char *)out + z->lo * es, all, z->numel * es);
    }
    free(blk), free(all);
    return rc;
}

/* Set the parameters (and bf16's master weights) from a whole buffer in the export type. */
static void zero_import(rank_state *s, const void *full)
{
    size_t es = s->bf16 ? 4 : (size_t)s->dsize, ss = (size_t)s->dsize;
    for (int u = 0; u < s->zu.n; u++) {
        const dl_zero_unit *z = &s->zu.u[u];
        const char *src = (const char *)full + z->begin * es;
        if (s->bf16)
            memcpy(s->master + z->sbase * 4, src, z->owned * 4);
        if (s->stage == 3 && s->bf16)
            dl_bf16_from_f32((uint16_t *)zparam(s, u), (const float *)src, z->owned);
        else if (s->stage == 3)
            memcpy(zparam(s, u), src, z->owned * ss);
    }
    if (s->stage < 3 && s->bf16)
        dl_bf16_from_f32(dl_gpt_params(s->g), full, s->numel);
    else if (s->stage < 3)
        memcpy(dl_gpt_params(s->g), full, s->numel * ss);
}

/* The test hook's perturbation (lib/core/testhook.h): one element of this rank's parameters, where
 * the rank keeps it (the shard at stage 3, where this rank owns the element). */
static void test_perturb(rank_state *s, int rank)
{
    dl__test_hook *h = dl__test_hook_get();
    if (!h || h->perturb_rel == 0 || h->perturb_rank != rank || s->bf16 ||
        h->perturb_index >= s->numel)
        return;
    size_t i = h->perturb_index;
    char *base = dl_gpt_params(s->g);
    if (s->stage == 3) {
        base = NULL;
        for (int u = 0; u < s->zu.n && !base; u++) {
            const dl_zero_unit *z = &s->zu.u[u];
            if (i >= z->begin && i < z->begin + z->owned)
                base = zparam(s, u), i -= z->begin;
        }
        if (!base)
            return;
    }
    if (s->dsize == 8)
        ((double *)base)[i] *= 1 + h->perturb_rel;
    else
        ((float *)base)[i] *= (float)(1 + h->perturb_rel);
    atomic_fetch_add(&h->perturbed, 1);
}

/* ---- the sharding module: the section above as the composition's shards ---- */

static char *shard_grad(void *arg, int u) { return zgrad(arg, u); }
static char *shard_param(void *arg, int u) { return zparam(arg, u); }

static int shard_model_opts(void *st, dl_gpt_opts *go)
{
    rank_state *s = st;
    go->unit_pad = s->stage ? s->e->o->dp : 1;
    go->gather = s->stage == 3 ? zero_gather_hook : NULL;
    go->reduce = s->stage >= 2 ? zero_reduce_hook : NULL;
    go->hook_arg = s;
    return DL_OK;
}

/* The initial (or loaded) parameters: with bf16 or at stage 3 the whole model in host memory
 * once, in the export type, each rank keeping its part (FSDP initialises on the host and shards
 * likewise); otherwise loaded in place (the model initialised itself). */
static int shard_load(rank_state *s)
{
    const dl_train_opts *o = s->e->o;
    const dl_gpt_layout *l = dl_gpt_get_layout(s->g);
    if (!s->bf16 && s->stage < 3)
        return o->load_path ? dl_ckpt_load(o->load_path, l, dl_gpt_params(s->g), s->dsize) : DL_OK;
    size_t es = s->bf16 ? 4 : (size_t)s->dsize;
    void *full = malloc(s->numel * es + 64);
    if (!full)
        return dl_error(DL_ENOMEM, "training: out of host memory for the initial parameters");
    int rc = DL_OK;
    if (o->load_path)
        rc = dl_ckpt_load(o->load_path, l, full, (int)es);
    else
        dl_gpt_init(l, full, (int)es, o->seed);
    if (rc == DL_OK)
        zero_import(s, full);
    free(full);
    return rc;
}

/* After the model: the units, the shard buffers (bf16's master weights, the reduced gradient
 * at stages 2-3, the parameters at stage 3, the staging of one padded unit), the parameters. */
static int shard_setup(void *st)
{
    rank_state *s = st;
    const dl_train_opts *o = s->e->o;
    s->g = s->e->g;
    s->numel = s->e->numel;
    int nu = dl_gpt_num_units(s->g), rc;
    size_t *bounds = malloc(sizeof(size_t) * (size_t)(nu + 1));
    if (!bounds)
        return dl_error(DL_ENOMEM, "training: out of memory");
    for (int u = 0; u <= nu; u++) bounds[u] = dl_gpt_unit_offset(s->g, u);
    rc = dl_zero_units_init(&s->zu, bounds, nu, s->stage ? o->dp : 1,
                            s->stage ? s->mesh.dp_rank : 0);
    free(bounds);
    if (rc)
        return rc;
    s->next_unit = s->zu.n;
    dl_arena *arena = dl_ctx_arena(s->e->ctx);
    size_t Sh = s->zu.shard, ss = (size_t)s->dsize;
    int padded = 0;
    for (int u = 0; u < s->zu.n; u++)
        padded |= s->zu.u[u].numel != (size_t)s->zu.dp * s->zu.u[u].shard;
    if ((s->bf16 && (rc = dl_arena_alloc(arena, DL_MEM_OPTIMIZER, Sh * 4, (void **)&s->master))) ||
        (s->stage >= 2 &&
         (rc = dl_arena_alloc(arena, DL_MEM_GRADS, Sh * ss, (void **)&s->gshard))) ||
        (s->stage == 3 &&
         (rc = dl_arena_alloc(arena, DL_MEM_PARAMS, Sh * ss, (void **)&s->pshard))) ||
        ((((s->stage == 1 || s->stage == 2) && padded) || (s->bf16 && s->stage >= 2)) &&
         (rc = dl_arena_alloc(arena, DL_MEM_COMM, s->zu.max_padded * ss, (void **)&s->stg))))
        return rc;
    s->shards = (tr_shards){&s->zu, shard_grad, shard_param, (float *)s->master, s};
    if ((rc = shard_load(s)))
        return rc;
    test_perturb(s, s->e->rank);
    return DL_OK;
}

static int shard_begin(void *st)
{
    rank_state *s = st;
    if (s->gshard)
        memset(s->gshard, 0, s->zu.shard * (size_t)s->dsize);
    s->next_unit = s->zu.n;
    return DL_OK;
}

static int shard_ready(void *st, size_t first) { return zero_ready(st, first); }

/* each dp rank summed its shard of the reduced gradient */
static int shard_norm(void *st, double *sq)
{
    rank_state *s = st;
    return dl_allreduce(s->mesh.dp_comm, sq, sq, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
}

/* stages 1-2 all-gather the updated parameters unit by unit (stage 3 gathers before each use) */
static int shard_gather(void *st)
{
    rank_state *s = st;
    int rc = DL_OK;
    for (int u = 0; rc == DL_OK && u < s->zu.n; u++) rc = zero_ag_unit(s, u);
    return rc;
}

static int shard_export(void *st, int which, void *out) { return zero_export(st, which, out); }
static void shard_import(void *st, const void *full) { zero_import(st, full); }

static void *shard_whole(void *st)
{
    rank_state *s = st;
    return !s->bf16 && s->stage < 3 ? dl_gpt_params(s->g) : NULL;
}

static void shard_report(void *st, dl_train_result *res)
{
    rank_state *s = st;
    res->zero = s->stage;
    res->zero_padded = (int64_t)s->zu.padded;
    res->zero_padding = (int64_t)s->zu.padding;
    res->zero_shard = (int64_t)s->zu.shard;
    res->zero_units = s->zu.n;
}

static void shard_teardown(void *st)
{
    rank_state *s = st;
    dl_arena *a = dl_ctx_arena(s->e->ctx);
    dl_arena_free(a, s->master);
    dl_arena_free(a, s->gshard);
    dl_arena_free(a, s->pshard);
    dl_arena_free(a, s->stg);
    dl_zero_units_free(&s->zu);
    free(s);
}

int tr_shard_make(tr_env *e, tr_module *m)
{
    const dl_train_opts *o = e->o;
    rank_state *s = calloc(1, sizeof *s);
    if (!s)
        return dl_error(DL_ENOMEM, "training: out of memory");
    s->e = e;
    s->mesh = *e->mesh;
    s->dt = e->pr.dt;
    s->dsize = e->pr.dsize;
    s->bf16 = e->pr.bf16;
    /* with dp = 1 the one shard is the whole buffer: stage 0 runs (nothing to scatter) */
    s->stage = o->dp > 1 && !o->eval_only ? o->zero : 0;
    e->lockstep_fwd = s->stage == 3;
    *m = (tr_module){.name = "zero",
                     .st = s,
                     .model_opts = shard_model_opts,
                     .setup = shard_setup,
                     .begin = shard_begin,
                     .grads_ready = s->stage == 1 ? shard_ready : NULL,
                     .reduce_norm = s->stage ? shard_norm : NULL,
                     .after_update = s->stage == 1 || s->stage == 2 ? shard_gather : NULL,
                     .shards = &s->shards,
                     .export_state = shard_export,
                     .import_state = shard_import,
                     .whole_params = shard_whole,
                     .report = shard_report,
                     .teardown = shard_teardown};
    return DL_OK;
}

/* ---- the step ---- */

/* Every step: the runner's forwards and backwards (the modules reducing gradients as they are
 * final), the reductions' end and the loss, the norm, the optimizer (unless the runner updated
 * already), the records, evaluations. */
static int train_steps(tr_env *e, tr_comp *c)
{
    tr_run *R = e->R;
    const dl_train_opts *o = e->o;
    int rank = e->rank, rc = DL_OK, last_logged = 0, skipped = 0;
    tr_eval_bytes eb = {0, 0, 0};
    dl_comm_reset_stats(e->mesh->dp_comm);
    dl_comm_reset_stats(e->mesh->tp_comm);
    dl_comm_reset_stats(dl_ctx_comm(e->ctx));
    for (int step = 1; step <= o->steps && rc == DL_OK; step++) {
        int logging = rank == 0 && R->gemm && step == (o->steps > 1 ? 2 : 1);
        if (logging)
            dl_ops_gemm_log(R->gemm);
        uint64_t t0 = dl_now_ns();
        e->step = step;
        e->tr =
            !o->trace_first || (step >= o->trace_first && step <= o->trace_last) ? R->trace : NULL;
        dl_gpt_zero_grads(e->g);
        tr_step_rec r = {.val = NAN, .lr = tr_lr_at(o->lr, o->min_lr, o->warmup, o->steps, step)};
        if ((rc = tr_begin(c)) || (rc = tr_fwd_bwd(c, &r.loss)))
            break;
        uint64_t c0 = dl_now_ns();
        if ((rc = tr_reduce(c)) || (rc = tr_reduce_loss(c, &r.loss)))
            break;
        /* a non-finite loss does not recover (a non-finite gradient alone skips the step): stop */
        if (!isfinite(r.loss))
            rc = dl_error(DL_EINVAL,
                          "training: step %d: the loss is %g, not finite; stopping (the "
                          "model diverged: try a lower learning rate)",
                          step, r.loss);
        /* the gradient reduction's wait (and whatever of it did not overlap) and the loss */
        dl_trace_add(e->tr, rank, DL_TR_COMM, step, -1, 0, c0, dl_now_ns());
        if (rc == DL_OK && !e->self_update)
            rc = tr_grad_norm(c, &r.norm);
        if (rc || (rc = tr_dump_grads(e)))
            break;
        /* a non-finite gradient anywhere (the norm is global) skips the step on every rank */
        r.skip = !e->self_update && !isfinite(r.norm);
        skipped += r.skip;
        uint64_t a0 = dl_now_ns();
        if (!e->self_update && !r.skip && (rc = tr_update(c, tr_clip_scale(o->clip, r.norm), r.lr)))
            break;
        dl_trace_add(e->tr, rank, DL_TR_OPT, step, -1, 0, a0, dl_now_ns());
        if (!e->runner_span)
            dl_trace_add(e->tr, rank, DL_TR_STEP, step, -1, 0, t0, dl_now_ns());
        R->step_ms[(size_t)(step - 1) * R->nranks + rank] = (double)(dl_now_ns() - t0) / 1e6;
        atomic_fetch_add_explicit(&R->finished[step - 1], 1, memory_order_release);
        if (logging)
            dl_ops_gemm_log(NULL);
        if (((o->eval_every > 0 && step % o->eval_every == 0) || step == o->steps) &&
            (rc = tr_evaluate_counted(e, &eb, &r.val, &r.used)))
            break;
        if (rank == 0)
            tr_record_step(e, &r, &last_logged, &rc);
    }
    if (rc == DL_OK && rank == 0) {
        tr_report_traffic(e, &eb, skipped);
        tr_report(c, R->res);
    }
    return rc;
}

/* Only evaluate (--eval-only): the loaded model's validation loss. */
static int eval_only(tr_env *e)
{
    double v;
    int used, rc = tr_evaluate(e, &v, &used);
    if (rc == DL_OK && e->rank == 0) {
        e->R->res->final_val_loss = v;
        e->R->res->eval_windows_used = used;
    }
    return rc;
}

/* The modules, the model; the steps; the saved parameters and the sample. */
static int rank_run(tr_env *e, tr_comp **c)
{
    const dl_train_opts *o = e->o;
    int rc;
    dl_comm_set_algo(e->mesh->dp_comm, o->algo);
    dl_comm_set_algo(e->mesh->tp_comm, o->algo);
    dl_comm_set_algo(e->mesh->pp_comm, o->algo);
    dl_gpt_opts go = {.cfg = o->model,
                      .dtype = o->dtype,
                      .micro_batch = o->micro_batch,
                      .tp = o->tp,
                      .tp_comm = o->tp > 1 ? e->mesh->tp_comm : NULL,
                      .recompute = o->recompute,
                      .seed = o->seed,
                      .arena = dl_ctx_arena(e->ctx),
                      .act_slots = 1};
    if ((rc = tr_compose(e, c)) || (rc = tr_model_opts(*c, &go)) ||
        (rc = dl_gpt_create(&go, &e->g)))
        return rc;
    e->numel = dl_gpt_numel(e->g);
    if ((rc = tr_setup(*c)) || (rc = o->eval_only ? eval_only(e) : train_steps(e, *c)) ||
        (rc = tr_save_params(e)))
        return rc;
    return o->sample > 0 ? tr_sample_text(e) : DL_OK;
}

static int train_rank(dl_ctx *ctx, void *arg)
{
    tr_run *R = arg;
    dl_mesh mesh = {0};
    tr_env E = {.o = R->o,
                .R = R,
                .data = R->data,
                .res = R->res,
                .pp = {R->nranks, R->pp_busy, R->pp_wall, R->pp_engine, R->pp_gap, &R->pp_bytes},
                .ctx = ctx,
                .rank = dl_ctx_rank(ctx),
                .mesh = &mesh,
                .head = 1};
    tr_prec_init(&E.pr, R->o->dtype);
    tr_comp *c = NULL;
    dl_comm *world = dl_ctx_comm(ctx);
    dl_comm_set_algo(world, R->o->algo);
    int rc = dl_mesh_create(world, R->o->dp, R->o->pp, R->o->tp, 1, &mesh);
    if (rc)
        return rc;
    rc = rank_run(&E, &c);
    if (rc == DL_OK) {
        /* measured before the model is freed: what this rank held at its peak */
        dl_arena_stats as;
        dl_arena_get_stats(dl_ctx_arena(ctx), &as);
        for (int k = 0; k < DL_MEM_NCATEGORIES; k++)
            R->res->peak[(size_t)E.rank * DL_MEM_NCATEGORIES + k] = as.peak[k];
        if (dl_mpi_size() > 1)
            rc = tr_share_rank_stats(R, E.rank, world, as.peak);
    }
    tr_teardown(c);
    dl_gpt_destroy(E.g);
    if (rc == DL_OK)
        return dl_mesh_destroy(&mesh);
    /* abort the world first (the peers may wait for this rank in a collective), then free the
     * communicators (their barriers return at once), keeping this rank's message */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dl_errmsg());
    dl_comm_fail(world);
    dl_mesh_destroy(&mesh);
    dl_error(rc, "%s", msg);
    return rc;
}

int dl_train_run(const dl_train_opts *oin, dl_train_result *res)
{
    memset(res, 0, sizeof *res);
    dl_train_opts o = *oin;
    int n = o.dp * o.tp * (o.pp > 1 ? o.pp : 1);
    int rc = dl_train_resolve(&o, n);
    if (rc)
        return rc;
    dl_data_opts dopt;
    dl_data_opts_init(&dopt);
    dopt.path = o.data_path;
    dopt.seq = o.model.seq;
    dopt.seed = o.data_seed;
    dopt.max_bytes = o.data_max;
    tr_run R = {.o = &o, .res = res, .nranks = n};
    if ((rc = dl_data_open(&dopt, &R.data)))
        return rc;
    int steps = o.eval_only ? 0 : o.steps;
    res->nranks = n;
    res->floor = dl_data_floor(R.data);
    res->nparams = dl_gpt_num_params(&o.model);
    res->peak = calloc((size_t)n * DL_MEM_NCATEGORIES, sizeof *res->peak);
    R.step_ms = calloc((size_t)(steps + 1) * (size_t)n, sizeof(double));
    R.loss = calloc((size_t)steps + 1, sizeof(double));
    R.val = calloc((size_t)steps + 1, sizeof(double));
    R.norm = calloc((size_t)steps + 1, sizeof(double));
    R.lr = calloc((size_t)steps + 1, sizeof(double));
    R.skip = calloc((size_t)steps + 1, sizeof(int));
    R.finished = calloc((size_t)steps + 1, sizeof *R.finished);
    R.local_ranks = n / (dl_mpi_size() > 1 ? dl_mpi_size() : 1);
    if (o.want_params)
        res->params = calloc((size_t)res->nparams, sizeof(double));
    if (o.want_grads)
        res->grads = calloc((size_t)res->nparams, sizeof(double));
    res->pp = o.pp;
    res->pp_v = o.virtual_stages;
    res->pp_bubble_theory =
        (double)(o.pp - 1) / ((double)o.virtual_stages * o.microbatches + o.pp - 1);
    size_t sn = (size_t)(steps + 1) * (size_t)n;
    R.pp_busy = calloc(sn, sizeof(double));
    R.pp_wall = calloc(sn, sizeof(double));
    R.pp_engine = calloc(sn, sizeof(double));
    R.pp_gap = calloc(sn, sizeof(int));
    res->pp_bounds = calloc((size_t)o.pp * o.virtual_stages + 1, sizeof(int));
    res->pp_bubble = calloc((size_t)o.pp, sizeof(double));
    res->pp_slots = calloc((size_t)o.pp, sizeof(int));
    res->pp_max_gap = calloc((size_t)o.pp, sizeof(int));
    int traced = o.trace_last ? o.trace_last - o.trace_first + 1 : steps;
    if (o.trace)
        R.trace = o.trace;
    else if ((o.trace_path || o.timeline) &&
             (rc = dl_trace_create(n,
                                   (size_t)(traced + 1) *
                                       ((size_t)o.microbatches * o.virtual_stages * 6 + 16),
                                   &R.trace)))
        goto done;
    if (!res->peak || !R.step_ms || !R.loss || !R.val || !R.norm || !R.lr || !R.skip ||
        !R.finished || !R.pp_busy || !R.pp_wall || !R.pp_engine || !R.pp_gap || !res->pp_bounds ||
        !res->pp_bubble || !res->pp_slots || !res->pp_max_gap || (o.want_params && !res->params) ||
        (o.want_grads && !res->grads)) {
        rc = dl_error(DL_ENOMEM, "training: out of memory");
        goto done;
    }
    dl_world_opts w;
    dl_world_opts_init(&w);
    w.nranks = n;
    w.gpu_mem = o.gpu_mem;
    w.timeout_s = o.timeout_s;
    w.topology = o.topology;
    if (!o.eval_only)
        R.gemm = calloc(1, sizeof *R.gemm);
    rc = dl_world_run(&w, train_rank, &R);
    /* GEMM utilisation's reference: the step's own GEMMs replayed alone on one thread */
    if (R.gemm && R.gemm->n > 0)
        res->gemm_gflops = dl_ops_gemm_replay(R.gemm, o.dtype == DL_F64 ? 8 : 4, 5);
    free(R.gemm);
    tr_summarise(&R, res);
    /* the records still owed to on_step (the last ones, or all of them under MPI) */
    int erc = tr_emit_steps(&R, 1);
    if (erc && rc == DL_OK)
        rc = erc;
    if (R.steps_done > 0)
        tr_finish_trace(&R,
                        o.trace_last && o.trace_last < R.steps_done ? o.trace_last : R.steps_done);
    if (R.trace_rc && rc == DL_OK)
        rc = R.trace_rc;
done:
    if (R.trace != o.trace)
        dl_trace_destroy(R.trace);
    free(R.pp_busy), free(R.pp_wall), free(R.pp_engine), free(R.pp_gap);
    free(R.step_ms), free(R.loss), free(R.val), free(R.norm), free(R.lr), free(R.skip);
    free(R.finished);
    dl_data_free(R.data);
    return rc;
}

void dl_train_result_free(dl_train_result *r)
{
    free(r->pp_bounds);
    free(r->pp_bubble);
    free(r->pp_slots);
    free(r->pp_max_gap);
    free(r->timeline);
    free(r->steps);
    free(r->peak);
    free(r->params);
    free(r->grads);
    free(r->sample);
    memset(r, 0, sizeof *r);
}
