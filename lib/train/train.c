/* The training engine: data and tensor parallelism, bucketed gradient all-reduce (or, with ZeRO
 * stages 1 and 2, reduce-scatter into dp shards, a sharded AdamW step and a parameter
 * all-gather), global-norm clipping, AdamW with warm-up and cosine decay, evaluation, sampling,
 * checkpoints. */
#define _GNU_SOURCE
#include "config.h"
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "io/path.h"
#include "model/gpt_priv.h"
#include "model/ops.h"
#include "parallel/zero.h"
#include "distlab/train.h"
#include "distlab/data.h"
#include "distlab/ckpt.h"
#include "distlab/mpi.h"
#include "core/stats.h"
#include "core/testhook.h"

void dl_train_opts_init(dl_train_opts *o)
{
    memset(o, 0, sizeof *o);
    dl_gpt_config_default(&o->model);
    o->model.layers = 2;
    o->model.d_model = 128;
    o->model.heads = 4;
    o->model.seq = 64;
    o->dtype = DL_F32;
    o->dp = 1;
    o->tp = 1;
    o->steps = 200;
    o->lr = 3e-3;
    o->min_lr = 3e-4;
    o->warmup = 20;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->weight_decay = 0.01;
    o->clip = 1.0;
    o->seed = 1;
    o->data_seed = 1;
    o->bucket_mb = 1.0;
    o->algo = DL_ALGO_AUTO;
    o->eval_every = 0;
    o->eval_windows = 64;
    o->log_every = 10;
    o->timeout_s = 120;
}

/* The pipeline's part of the configuration (after the batch sizes are known). */
static int pp_resolve(dl_train_opts *o)
{
    int p = o->pp, L = o->model.layers, m = o->microbatches;
    if (o->schedule == DL_SCHED_CUSTOM)
        o->schedule = DL_SCHED_GPIPE;
    int k = o->schedule;
    if (k != DL_SCHED_GPIPE && k != DL_SCHED_1F1B && k != DL_SCHED_INTERLEAVED &&
        k != DL_SCHED_ASYNC && k != DL_SCHED_NAIVE)
        return dl_error(DL_EINVAL,
                        "schedule %s cannot train: use gpipe, 1f1b, interleaved or "
                        "async",
                        dl_sched_kind_name((dl_sched_kind)k));
    if (k == DL_SCHED_NAIVE && m != 1)
        return dl_error(DL_EINVAL, "the naive schedule runs one micro-batch (got %d)", m);
    if (k != DL_SCHED_INTERLEAVED && o->virtual_stages > 1)
        return dl_error(DL_EINVAL, "--virtual-stages %d needs --schedule interleaved",
                        o->virtual_stages);
    int v = k == DL_SCHED_INTERLEAVED ? (o->virtual_stages > 0 ? o->virtual_stages : 2) : 1;
    o->virtual_stages = v;
    if (p > L)
        return dl_error(DL_EINVAL, "pp %d is larger than the layers %d: every stage needs a layer",
                        p, L);
    if (v > DL_GPT_MAX_CHUNKS)
        return dl_error(DL_EINVAL, "at most %d virtual stages (got %d)", DL_GPT_MAX_CHUNKS, v);
    if (k == DL_SCHED_INTERLEAVED) {
        if (p < 2)
            return dl_error(DL_EINVAL, "the interleaved schedule needs pp >= 2");
        if (L % (p * v))
            return dl_error(DL_EINVAL,
                            "interleaving: layers %d are not divisible by pp %d x "
                            "virtual stages %d",
                            L, p, v);
        if (m % p)
            return dl_error(DL_EINVAL,
                            "interleaving: micro-batches %d must be a multiple of pp "
                            "%d (try --microbatches %d)",
                            m, p, (m / p + 1) * p);
    }
    if (o->weight_stashing && k != DL_SCHED_ASYNC)
        return dl_error(DL_EINVAL, "--weight-stashing needs --schedule async");
    if (p == 1)
        return DL_OK;
    if (k == DL_SCHED_ASYNC && (o->zero || o->model.tie))
        return dl_error(DL_EINVAL, "the async schedule updates each stage on its own: it does "
                                   "not combine with ZeRO or tied embeddings");
    if (o->model.tie && o->zero)
        return dl_error(DL_EINVAL, "tied embeddings with pp > 1 and ZeRO are not supported yet");
    return DL_OK;
}

int dl_train_resolve(dl_train_opts *o, int nranks)
{
    if (o->pp == 0)
        o->pp = 1;
    if (o->dp < 1 || o->tp < 1 || o->pp < 1)
        return dl_error(DL_EINVAL, "dp, tp and pp must be >= 1 (got dp %d, tp %d, pp %d)", o->dp,
                        o->tp, o->pp);
    if (nranks > 0 && o->dp * o->tp * o->pp != nranks)
        return dl_error(DL_EINVAL, "dp %d x tp %d x pp %d = %d is not the rank count %d", o->dp,
                        o->tp, o->pp, o->dp * o->tp * o->pp, nranks);
    int rc = dl_gpt_config_check(&o->model, o->tp);
    if (rc)
        return rc;
    if (o->model.vocab != 256)
        return dl_error(DL_EINVAL, "the vocabulary is bytes: 256 (got %d)", o->model.vocab);
    int G = o->global_batch, mb = o->micro_batch, m = o->microbatches, d = o->dp;
    if (G < 0 || mb < 0 || m < 0)
        return dl_error(DL_EINVAL, "batch sizes must be positive");
    int given = (G > 0) + (mb > 0) + (m > 0);
    if (given == 3) {
        if (G != d * m * mb)
            return dl_error(DL_EINVAL,
                            "global batch %d != dp %d x microbatches %d x micro-batch "
                            "%d = %d: give any two of them",
                            G, d, m, mb, d * m * mb);
    } else if (G > 0 && mb > 0) {
        if (G % (d * mb))
            return dl_error(DL_EINVAL,
                            "global batch %d is not divisible by dp %d x micro-batch %d "
                            "(try --global-batch %d)",
                            G, d, mb, (G / (d * mb) + 1) * d * mb);
        m = G / (d * mb);
    } else if (G > 0 && m > 0) {
        if (G % (d * m))
            return dl_error(DL_EINVAL,
                            "global batch %d is not divisible by dp %d x microbatches "
                            "%d (try --global-batch %d)",
                            G, d, m, (G / (d * m) + 1) * d * m);
        mb = G / (d * m);
    } else if (G > 0) {
        if (G % d)
            return dl_error(DL_EINVAL,
                            "global batch %d is not divisible by dp %d (try "
                            "--global-batch %d)",
                            G, d, (G / d + 1) * d);
        m = 1;
        mb = G / d;
    } else {
        if (mb <= 0)
            mb = 8;
        if (m <= 0)
            m = 1;
    }
    o->micro_batch = mb;
    o->microbatches = m;
    o->global_batch = d * m * mb;
    if (o->steps < 0 || (o->steps == 0 && !o->eval_only))
        return dl_error(DL_EINVAL, "steps must be >= 1 (got %d)", o->steps);
    if (o->trace_first < 0 || o->trace_last < o->trace_first ||
        (o->trace_first == 0) != (o->trace_last == 0) ||
        (!o->eval_only && o->trace_last > o->steps))
        return dl_error(DL_EINVAL,
                        "traced steps %d..%d: want 1 <= first <= last <= steps %d (or 0, 0: all)",
                        o->trace_first, o->trace_last, o->steps);
    if (!(o->lr > 0) || o->min_lr < 0 || o->warmup < 0)
        return dl_error(DL_EINVAL, "learning rate must be > 0, min-lr >= 0, warm-up >= 0");
    if (o->eval_only && !o->load_path)
        return dl_error(DL_EINVAL, "--eval-only needs --load FILE");
    if (o->bucket_mb < 0)
        return dl_error(DL_EINVAL, "bucket size must be >= 0 MiB");
    if (o->dtype != DL_F32 && o->dtype != DL_F64 && o->dtype != DL_BF16)
        return dl_error(DL_EINVAL, "dtype must be f32, f64 or bf16");
    if (o->zero < 0 || o->zero > 3)
        return dl_error(DL_EINVAL, "ZeRO stage must be 0, 1, 2 or 3 (got %d)", o->zero);
    return pp_resolve(o);
}

double dl_train_step_flops(const dl_gpt_config *c, int G)
{
    double L = c->layers, C = c->d_model, V = c->vocab, T = c->seq;
    double fwd_per_token = 24.0 * L * C * C + 2.0 * V * C + 2.0 * L * C * (T + 1);
    return 3.0 * fwd_per_token * T * G;
}

/* ---- shared state between the caller and the rank threads ---- */

typedef struct run {
    const dl_train_opts *o;
    dl_train_result *res;
    dl_data *data;
    int nranks;
    double *step_ms; /* [steps * nranks] */
    double *loss;    /* [steps] */
    double *val;     /* [steps] */
    double *norm;    /* [steps] */
    double *lr;      /* [steps] */
    int *skip;       /* [steps] skipped: non-finite gradient */
    int steps_done;
    atomic_int *finished; /* [steps] ranks of this process that finished the step */
    int local_ranks;      /* ranks of this process */
    int emitted;          /* steps handed to o->on_step */
    dl_gemm_log *gemm;    /* rank 0's GEMMs of one step (the second: the first warms up) */
    dl_trace *trace;      /* NULL unless a trace or timeline was asked for */
    /* pipeline: per step and rank */
    double *pp_busy, *pp_wall, *pp_engine;
    int *pp_gap, *pp_slots;
    uint64_t pp_bytes;        /* rank 0, all steps */
    int trace_done, trace_rc; /* the trace file and timeline written (rank 0), its status */
} run;

typedef struct rank_state {
    run *R;
    dl_ctx *ctx;
    dl_mesh mesh;
    dl_gpt *g;
    void *m, *v; /* AdamW state */
    size_t numel;
    int dsize;
    dl_dtype dt;
    /* bucketed gradient all-reduce */
    size_t launched; /* gradients at [launched, numel) have been handed to the dp reduce */
    size_t bucket_elems;
    dl_request *req[512];
    int nreq;
    uint64_t eval_tp_bytes; /* bytes sent by evaluations (excluded from per-step figures) */
    uint64_t eval_loss_bytes;
    /* ZeRO (stage 0 when off or dp == 1; see docs/ARCHITECTURE.md, "The trainer") */
    int stage;
    dl_zero_units zu; /* per-unit shards (stage 0: d = 1, the blocks are the units) */
    dl_dtype ct;      /* the compute type: f32 for bf16 mixed precision */
    int csize, bf16;
    char *master;              /* bf16: fp32 master weights of the shard (optimizer category) */
    char *gshard;              /* stages 2-3: the reduced gradient of the shard */
    char *pshard;              /* stage 3: the parameters of the shard */
    char *stg;                 /* one padded unit in the storage type (comm), when needed */
    int next_unit;             /* stage 1: units >= next_unit are reduce-scattered (this step) */
    dl_zero_units zr;          /* bf16 at stage 0 with dp > 1: the units cut into dp blocks, each
                             * all-reduced as reduce-scatter + all-gather (ZeRO's order) */
    uint64_t eval_param_bytes; /* stage 3: gathers of evaluations (not training traffic) */
    int skipped;               /* steps skipped for a non-finite gradient */
    /* pipeline (pp > 1) */
    int pp_on;
    dl_pipe *eng;
    dl_sched *sched;
    int pp_p, pp_v, pp_stage, step;
    dl_trace *tr; /* R->trace during the traced steps (trace_first..trace_last), else NULL */
    int nslots, *slot_of, *free_slot, nfree;
    int *pin, *ptg; /* a micro-batch's tokens */
    double loss_sum;
    int version, adam_t, max_gap, *fwd_version;
    char *stash;   /* weight stashing: one parameter copy per slot */
    void *tie_buf; /* tied embeddings: the other end's wte gradient */
} rank_state;

static int launch_bucket(rank_state *s, size_t first)
{
    const dl_train_opts *o = s->R->o;
    size_t n = s->launched - first;
    if (n == 0)
        return DL_OK;
    char *base = (char *)dl_gpt_grads(s->g) + first * (size_t)s->dsize;
    int rc;
    uint64_t t0 = dl_now_ns();
    if (o->overlap && s->nreq < (int)(sizeof s->req / sizeof s->req[0]))
        rc = dl_iallreduce(s->mesh.dp_comm, base, base, n, s->dt, DL_SUM, DL_PURPOSE_GRADS,
                           &s->req[s->nreq++]);
    else
        rc = dl_allreduce(s->mesh.dp_comm, base, base, n, s->dt, DL_SUM, DL_PURPOSE_GRADS);
    /* a blocking bucket runs inside the backward: the trace shows it there */
    dl_trace_add(s->tr, dl_ctx_rank(s->ctx), DL_TR_COMM, s->step, -1, 0, t0, dl_now_ns());
    s->launched = first;
    return rc;
}

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

/* bf16 at stage 0: all-reduce unit u of the gradient as the ring all-reduce's two halves, a
 * reduce-scatter and an all-gather of the padded unit, in place (through the staging buffer
 * when padded). The same volume as one all-reduce, but every element's sum is formed in the
 * ring order of ZeRO's reduce-scatter, so in bf16 (one rounding per hop) stage 0 reduces to
 * bitwise the gradient stages 1-3 reduce (one micro-batch), not merely to within bf16 rounding. */
static int bf16_allreduce_unit(rank_state *s, int u)
{
    const dl_zero_unit *z = &s->zr.u[u];
    size_t ss = 2, n = (size_t)s->zr.dp * z->shard, r = (size_t)s->zr.rank;
    char *full = (char *)dl_gpt_grads(s->g) + z->lo * ss, *buf = full;
    if (n != z->numel) {
        memcpy(s->stg, full, z->numel * ss);
        memset(s->stg + z->numel * ss, 0, (n - z->numel) * ss);
        buf = s->stg;
    }
    char *mine = buf + r * z->shard * ss;
    int rc = dl_reduce_scatter(s->mesh.dp_comm, buf, mine, n, DL_BF16, DL_SUM, DL_PURPOSE_GRADS);
    if (rc == DL_OK)
        rc = dl_allgather(s->mesh.dp_comm, mine, buf, n, DL_BF16, DL_PURPOSE_GRADS);
    if (rc == DL_OK && buf != full)
        memcpy(full, buf, z->numel * ss);
    return rc;
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

/* Gradients at [first, numel) are final: launch a bucket once enough has accumulated. */
static int grad_ready(size_t first, void *arg)
{
    rank_state *s = arg;
    if (s->stage)
        return zero_ready(s, first);
    if (s->zr.u) {
        int rc = DL_OK;
        while (rc == DL_OK && s->next_unit > 0 && s->zr.u[s->next_unit - 1].lo >= first)
            rc = bf16_allreduce_unit(s, --s->next_unit);
        return rc;
    }
    if (s->launched - first >= s->bucket_elems || (first == 0 && s->launched > 0))
        return launch_bucket(s, first);
    return DL_OK;
}

static int wait_buckets(rank_state *s)
{
    int rc = DL_OK;
    for (int i = 0; i < s->nreq; i++) {
        int r = dl_wait(s->req[i]);
        if (r && !rc)
            rc = r;
    }
    s->nreq = 0;
    return rc;
}

static double lr_at(const dl_train_opts *o, int step /* 1-based */)
{
    if (o->warmup > 0 && step <= o->warmup)
        return o->lr * step / o->warmup;
    int decay = o->steps - o->warmup;
    if (decay <= 0)
        return o->lr;
    double t = (double)(step - o->warmup) / decay;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * (t > 1 ? 1 : t)));
}

/* Squared global norm: sharded tensors on every tp rank, replicated ones once (tp rank 0). With
 * ZeRO each dp rank sums the part of every tensor that lies in its shard of the reduced gradient,
 * and the dp group adds the shards up. */
static int grad_norm(rank_state *s, double *norm)
{
    const dl_gpt_layout *l = dl_gpt_get_layout(s->g);
    double sq = 0;
    for (int u = 0; u < s->zu.n; u++) {
        const dl_zero_unit *z = &s->zu.u[u];
        const char *gr = zgrad(s, u);
        size_t lo = z->begin, hi = z->begin + z->owned;
        for (int k = 0; k < l->ntensors; k++) {
            const dl_tensor_info *t = &l->t[k];
            if (t->shard == DL_SHARD_NONE && l->tp_rank != 0)
                continue;
            if (t->id == 0 && !l->part.embed) /* the head stage's copy of tied wte: counted once */
                continue;
            size_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->numel;
            if (b > hi)
                b = hi;
            if (a >= b)
                continue;
            const char *p = gr + (a - lo) * (size_t)s->dsize;
            sq += s->bf16         ? dl_sumsq_bf16((const uint16_t *)p, b - a)
                  : s->dsize == 8 ? dl_sumsq_f64((const double *)p, b - a)
                                  : dl_sumsq_f32((const float *)p, b - a);
        }
    }
    if (s->stage && s->mesh.dp > 1) {
        int rc = dl_allreduce(s->mesh.dp_comm, &sq, &sq, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
        if (rc)
            return rc;
    }
    if (s->mesh.tp > 1) {
        int rc = dl_allreduce(s->mesh.tp_comm, &sq, &sq, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
        if (rc)
            return rc;
    }
    /* the stages hold different tensors (async updates each stage on its own norm) */
    if (s->pp_on && s->sched->flush) {
        int rc = dl_allreduce(s->mesh.pp_comm, &sq, &sq, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
        if (rc)
            return rc;
    }
    *norm = sqrt(sq);
    return DL_OK;
}


/* ---- pipeline parallelism: the GPT stage under the engine (include/distlab/pipe.h) ---- */

static int pp_take_slot(rank_state *s, int mb, int ch, int *slot)
{
    int *so = &s->slot_of[mb * s->pp_v + ch];
    if (*so < 0) {
        if (s->nfree == 0)
            return dl_error(DL_EINVAL,
                            "pipeline: no free activation slot for micro-batch %d "
                            "(the schedule holds at most %d)",
                            mb, s->nslots);
        *so = s->free_slot[--s->nfree];
    }
    *slot = *so;
    return DL_OK;
}

static void *pp_fwd_in(void *arg, int mb, int ch)
{
    rank_state *s = arg;
    int slot = 0;
    if (pp_take_slot(s, mb, ch, &slot))
        return NULL;
    return dl_gpt_stage_input(s->g, slot, ch);
}

static int pp_fwd(void *arg, int mb, int ch, const void **out)
{
    rank_state *s = arg;
    const dl_train_opts *o = s->R->o;
    int slot = 0, rc = pp_take_slot(s, mb, ch, &slot);
    if (rc)
        return rc;
    int first = s->pp_stage == 0 && ch == 0, last = s->pp_stage == s->pp_p - 1 && ch == s->pp_v - 1;
    int G = o->global_batch, mbs = o->micro_batch;
    if ((first || last) && (rc = dl_data_batch(s->R->data, s->step - 1, G, o->dp, s->mesh.dp_rank,
                                               mb, mbs, s->pin, s->ptg)))
        return rc;
    if (s->stash)
        memcpy(s->stash + (size_t)slot * s->numel * s->dsize, dl_gpt_params(s->g),
               s->numel * s->dsize);
    s->fwd_version[mb * s->pp_v + ch] = s->version;
    double loss = 0;
    if ((rc = dl_gpt_stage_forward(s->g, slot, ch, first ? s->pin : NULL, last ? s->ptg : NULL, mbs,
                                   &loss)))
        return rc;
    if (last)
        s->loss_sum += loss * mbs / G;
    *out = last ? NULL : dl_gpt_stage_output(s->g, slot, ch);
    return DL_OK;
}

static void *pp_bwd_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return dl_gpt_stage_grad(((rank_state *)arg)->g);
}

static int pp_bwd(void *arg, int mb, int ch, const void **din)
{
    rank_state *s = arg;
    const dl_train_opts *o = s->R->o;
    int *so = &s->slot_of[mb * s->pp_v + ch], slot = *so, rc;
    if (slot < 0)
        return dl_error(DL_EINVAL, "pipeline: backward of micro-batch %d without its forward", mb);
    /* flush: the mean over the global batch; async: each update applies one micro-batch (over
     * the dp group), so its mean */
    double T = o->model.seq;
    double dloss = s->sched->flush ? 1.0 / ((double)o->global_batch * T)
                                   : 1.0 / ((double)o->micro_batch * o->dp * T);
    int fv = s->fwd_version[mb * s->pp_v + ch];
    int used = s->stash ? fv : s->version; /* the weight version this backward computes with */
    if (used - fv > s->max_gap)
        s->max_gap = used - fv;
    void *prev =
        s->stash ? dl_gpt_use_params(s->g, s->stash + (size_t)slot * s->numel * s->dsize) : NULL;
    rc = dl_gpt_stage_backward(s->g, slot, ch, dloss, NULL, NULL);
    if (s->stash)
        dl_gpt_use_params(s->g, prev);
    *so = -1;
    s->free_slot[s->nfree++] = slot;
    if (rc)
        return rc;
    *din = s->pp_stage == 0 && ch == 0 ? NULL : dl_gpt_stage_grad(s->g);
    return DL_OK;
}

static int adam_update(rank_state *s, double scale, double lr, int t);

/* Async (PipeDream): this micro-batch's gradient, averaged over the dp group, updates the
 * stage's weights at once (clipped by the stage's own norm: the stages do not wait for each
 * other). A flush schedule's OPT is the step after the pipeline (train_rank). */
static int pp_opt(void *arg, int mb)
{
    rank_state *s = arg;
    const dl_train_opts *o = s->R->o;
    (void)mb;
    if (s->sched->flush)
        return DL_OK;
    int rc = DL_OK;
    if (o->dp > 1)
        rc = dl_allreduce(s->mesh.dp_comm, dl_gpt_grads(s->g), dl_gpt_grads(s->g), s->numel, s->dt,
                          DL_SUM, DL_PURPOSE_GRADS);
    double norm = 0;
    if (rc == DL_OK)
        rc = grad_norm(s, &norm);
    if (rc)
        return rc;
    double scale = o->clip > 0 && norm > o->clip ? o->clip / norm : 1.0;
    rc = adam_update(s, scale, lr_at(o, s->step), ++s->adam_t);
    dl_gpt_zero_grads(s->g);
    s->version++;
    return rc;
}

static const dl_pipe_ops pp_ops = {pp_fwd_in, pp_fwd, pp_bwd_in, pp_bwd, pp_opt};

/* Layers to virtual stages: evenly, or by the given per-layer costs (the lecture's dynamic
 * program, which minimises the slowest stage). */
static int pp_bounds(const dl_train_opts *o, int k, int *bounds)
{
    int L = o->model.layers;
    double *c = malloc(sizeof(double) * (size_t)L);
    if (!c)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    for (int i = 0; i < L; i++) c[i] = o->layer_costs ? o->layer_costs[i] : 1.0;
    int rc = dl_sched_partition(c, L, k, o->layer_costs != NULL, bounds, NULL, NULL);
    free(c);
    return rc;
}

static int pp_make_sched(const dl_train_opts *o, dl_sched **out)
{
    int p = o->pp, m = o->microbatches;
    switch (o->schedule) {
    case DL_SCHED_NAIVE: return dl_sched_naive(p, out);
    case DL_SCHED_1F1B: return dl_sched_1f1b(p, m, out);
    case DL_SCHED_INTERLEAVED: return dl_sched_interleaved(p, m, o->virtual_stages, out);
    case DL_SCHED_ASYNC: return dl_sched_async(p, m, o->weight_stashing, out);
    default: return dl_sched_gpipe(p, m, out);
    }
}

/* The stage's part, its slots and the engine (after the mesh exists, before the model). */
static int pp_setup(rank_state *s, dl_gpt_part *part)
{
    const dl_train_opts *o = s->R->o;
    s->pp_p = o->pp;
    s->pp_v = o->virtual_stages;
    s->pp_stage = s->mesh.pp_rank;
    int rc = pp_make_sched(o, &s->sched);
    if (rc)
        return rc;
    dl_sched_sim *sim;
    if ((rc = dl_sched_simulate(s->sched, NULL, &sim)))
        return rc;
    s->nslots = sim->peak_act[s->pp_stage];
    dl_sched_sim_free(sim);
    int k = s->pp_p * s->pp_v, bounds[DL_GPT_MAX_CHUNKS * 64 + 1];
    if (k > (int)(sizeof bounds / sizeof bounds[0]) - 1)
        return dl_error(DL_EINVAL, "pipeline: too many virtual stages (%d)", k);
    if ((rc = pp_bounds(o, k, bounds)) ||
        (rc = dl_gpt_part_stage(&o->model, s->pp_p, s->pp_v, s->pp_stage, bounds, part)))
        return rc;
    if (dl_ctx_rank(s->ctx) == 0 && s->R->res->pp_bounds)
        memcpy(s->R->res->pp_bounds, bounds, sizeof(int) * (size_t)(k + 1));
    int m = o->microbatches, T = o->model.seq;
    s->slot_of = malloc(sizeof(int) * (size_t)m * s->pp_v);
    s->fwd_version = calloc((size_t)m * s->pp_v, sizeof(int));
    s->free_slot = malloc(sizeof(int) * (size_t)s->nslots);
    s->pin = malloc(sizeof(int) * (size_t)o->micro_batch * T);
    s->ptg = malloc(sizeof(int) * (size_t)o->micro_batch * T);
    if (!s->slot_of || !s->fwd_version || !s->free_slot || !s->pin || !s->ptg)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    for (int i = 0; i < m * s->pp_v; i++) s->slot_of[i] = -1;
    for (int i = 0; i < s->nslots; i++) s->free_slot[i] = s->nslots - 1 - i;
    s->nfree = s->nslots;
    return dl_pipe_create(s->mesh.pp_comm, (size_t)o->micro_batch * T * o->model.d_model, s->ct,
                          dl_ctx_arena(s->ctx), &s->eng);
}

static void pp_free(rank_state *s)
{
    dl_pipe_destroy(s->eng);
    dl_sched_free(s->sched);
    free(s->slot_of), free(s->fwd_version), free(s->free_slot), free(s->pin), free(s->ptg);
    if (s->stash)
        dl_arena_free(dl_ctx_arena(s->ctx), s->stash);
    if (s->tie_buf)
        dl_arena_free(dl_ctx_arena(s->ctx), s->tie_buf);
}

/* Tied embeddings across stages: the first stage's wte and the last stage's copy receive the
 * sum of both gradients (a + b on one side, b + a on the other: the same bits), as Megatron's
 * embedding group all-reduce does. */
static int pp_tie_sync(rank_state *s)
{
    const dl_gpt_layout *l = dl_gpt_get_layout(s->g);
    if (!s->R->o->model.tie || s->pp_p == 1 || (s->pp_stage != 0 && s->pp_stage != s->pp_p - 1))
        return DL_OK;
    const dl_tensor_info *t = &l->t[s->pp_stage == 0 ? 0 : l->ntensors - 1];
    int peer = s->pp_stage == 0 ? s->pp_p - 1 : 0, rc;
    char *g = (char *)dl_gpt_grads(s->g) + t->offset * (size_t)s->dsize;
    uint64_t ticket;
    if ((rc = dl_isend(s->mesh.pp_comm, g, t->numel, s->dt, peer, 77, DL_PURPOSE_GRADS, &ticket)) ||
        (rc = dl_recv_tag(s->mesh.pp_comm, s->tie_buf, t->numel, s->dt, peer, 77,
                          DL_PURPOSE_GRADS)) ||
        (rc = dl_send_wait(s->mesh.pp_comm, peer, ticket)))
        return rc;
    if (s->bf16)
        dl_bf16_acc((uint16_t *)g, s->tie_buf, t->numel);
    else if (s->dsize == 8)
        for (size_t i = 0; i < t->numel; i++) ((double *)g)[i] += ((const double *)s->tie_buf)[i];
    else
        for (size_t i = 0; i < t->numel; i++) ((float *)g)[i] += ((const float *)s->tie_buf)[i];
    return DL_OK;
}

/* A forward through every stage without the engine (evaluation, sampling): each virtual stage
 * in turn receives, computes, sends on; the loss (and the head's probabilities) end on the last
 * stage, the loss is then broadcast over the pipeline. */
static int model_forward(rank_state *s, const int *in, const int *tg, int B, double *loss)
{
    if (!s->pp_on)
        return dl_gpt_forward(s->g, in, tg, B, loss);
    const dl_train_opts *o = s->R->o;
    size_t n = (size_t)B * o->model.seq * o->model.d_model;
    double l = 0;
    int rc = DL_OK;
    for (int ch = 0; ch < s->pp_v && rc == DL_OK; ch++) {
        int prev, next;
        dl_pipe_peers(s->pp_p, s->pp_v, s->pp_stage, ch, &prev, &next);
        if (prev >= 0 && (rc = dl_recv(s->mesh.pp_comm, dl_gpt_stage_input(s->g, 0, ch), n, s->ct,
                                       prev, DL_PURPOSE_ACTIVATIONS)))
            break;
        if ((rc = dl_gpt_stage_forward(s->g, 0, ch, in, tg, B, &l)))
            break;
        if (next >= 0)
            rc = dl_send(s->mesh.pp_comm, dl_gpt_stage_output(s->g, 0, ch), n, s->ct, next,
                         DL_PURPOSE_ACTIVATIONS);
    }
    if (rc == DL_OK)
        rc = dl_broadcast(s->mesh.pp_comm, &l, &l, 1, DL_F64, s->pp_p - 1, DL_PURPOSE_LOSS);
    if (loss)
        *loss = l;
    return rc;
}

/* Mean validation loss over the first `windows` windows, split over the dp ranks. */
static int evaluate(rank_state *s, double *out, int *used)
{
    const dl_train_opts *o = s->R->o;
    long W = dl_data_val_windows(s->R->data);
    if (o->eval_windows > 0 && o->eval_windows < W)
        W = o->eval_windows;
    int T = o->model.seq, mb = o->micro_batch, d = s->mesh.dp, r = s->mesh.dp_rank;
    long lo = W * r / d, hi = W * (r + 1) / d;
    int *in = malloc(sizeof(int) * (size_t)mb * T), *tg = malloc(sizeof(int) * (size_t)mb * T);
    if (!in || !tg) {
        free(in), free(tg);
        return dl_error(DL_ENOMEM, "evaluation: out of memory");
    }
    double sum = 0;
    int rc = DL_OK;
    /* stage 3 gathers parameters in every forward: every dp rank runs as many (a rank out of
     * windows runs one window and drops its loss) */
    long rounds = ((W + d - 1) / d + mb - 1) / mb;
    for (long i = 0; s->stage == 3 && i < rounds && rc == DL_OK; i++) {
        if (lo + i * mb < hi)
            continue;
        double junk;
        if ((rc = dl_data_val_window(s->R->data, 0, in, tg)) == DL_OK)
            rc = model_forward(s, in, tg, 1, &junk);
    }
    for (long w = lo; w < hi && rc == DL_OK; w += mb) {
        int B = (int)(hi - w < mb ? hi - w : mb);
        for (int b = 0; b < B && rc == DL_OK; b++)
            rc = dl_data_val_window(s->R->data, w + b, in + (size_t)b * T, tg + (size_t)b * T);
        double loss;
        if (rc == DL_OK && (rc = model_forward(s, in, tg, B, &loss)) == DL_OK)
            sum += loss * B;
    }
    free(in), free(tg);
    if (rc == DL_OK && d > 1)
        rc = dl_allreduce(s->mesh.dp_comm, &sum, &sum, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
    *out = W > 0 ? sum / (double)W : NAN;
    *used = (int)W;
    return rc;
}

/* Scatter this rank's shard (f32 or f64) into an unsharded f64 buffer (tp = 1 layout order). */
static void gather_into(rank_state *s, const void *src, int es, double *dst)
{
    if (s->mesh.dp_rank != 0)
        return;
    const dl_gpt_layout *l = dl_gpt_get_layout(s->g);
    dl_gpt_layout *full;
    if (dl_gpt_layout_create(&l->cfg, 1, 0, &full))
        return;
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        if (t->shard == DL_SHARD_NONE && l->tp_rank != 0)
            continue;
        if (t->id == 0 && !l->part.embed) /* tied wte's copy on the head stage: equal */
            continue;
        for (size_t i = 0; i < t->numel; i++) {
            size_t j = t->offset + i;
            double v = es == 8 ? ((const double *)src)[j] : ((const float *)src)[j];
            dst[full->t[t->id].offset + (size_t)dl_gpt_global_index(l, k, i)] = v;
        }
    }
    dl_gpt_layout_destroy(full);
}

static int sample_text(rank_state *s)
{
    const dl_train_opts *o = s->R->o;
    int T = o->model.seq, V = o->model.vocab, n = o->sample;
    const unsigned char *val = dl_data_bytes(s->R->data) + dl_data_train_len(s->R->data);
    int *ctx = calloc((size_t)T, sizeof(int));
    char *out = calloc((size_t)n + 1, 1);
    if (!ctx || !out) {
        free(ctx), free(out);
        return dl_error(DL_ENOMEM, "sampling: out of memory");
    }
    int len = T < 16 ? T : 16; /* prompt: the start of the validation split */
    for (int i = 0; i < len; i++) ctx[i] = val[i];
    uint64_t st = o->seed * 0x9E3779B97F4A7C15ull + 12345;
    int rc = DL_OK;
    for (int i = 0; i < n && rc == DL_OK; i++) {
        if ((rc = model_forward(s, ctx, NULL, 1, NULL)))
            break;
        st = st * 6364136223846793005ull + 1442695040888963407ull; /* same on every rank */
        double u = (double)(st >> 11) * (1.0 / 9007199254740992.0), acc = 0;
        int c = V - 1;
        if (!s->pp_on || s->pp_stage == s->pp_p - 1) { /* the head's probabilities */
            const void *p = dl_gpt_probs(s->g, 0, len - 1);
            for (int v = 0; v < V; v++) {
                acc += s->csize == 8 ? ((const double *)p)[v] : ((const float *)p)[v];
                if (u < acc) {
                    c = v;
                    break;
                }
            }
        }
        if (s->pp_on) {
            double cv = c;
            if ((rc = dl_broadcast(s->mesh.pp_comm, &cv, &cv, 1, DL_F64, s->pp_p - 1,
                                   DL_PURPOSE_OTHER)))
                break;
            c = (int)cv;
        }
        out[i] = (char)c;
        if (len < T)
            ctx[len++] = c;
        else {
            memmove(ctx, ctx + 1, sizeof(int) * (size_t)(T - 1));
            ctx[T - 1] = c;
        }
    }
    if (rc == DL_OK && dl_ctx_rank(s->ctx) == 0)
        s->R->res->sample = out;
    else
        free(out);
    free(ctx);
    return rc;
}

/* Step 1's gradients as a safetensors file (every rank writes its own slices) and its global
 * batch (rank 0), for comparisons with other frameworks. */
static int dump_step(rank_state *s, const void *grads, int es)
{
    const dl_train_opts *o = s->R->o;
    int rc = dl_ckpt_save(o->dump_grads, dl_gpt_get_layout(s->g), grads, es, dl_ctx_comm(s->ctx),
                          s->mesh.dp_rank == 0);
    if (rc || dl_ctx_rank(s->ctx) != 0)
        return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s.tokens", o->dump_grads);
    if ((rc = dl_path_check_output(path, "gradient dump")))
        return rc;
    FILE *f = fopen(path, "wb");
    if (!f)
        return dl_error(DL_ESYS, "cannot write '%s'", path);
    int T = o->model.seq, G = o->global_batch;
    int *in = malloc(sizeof(int) * (size_t)T * G), *tg = malloc(sizeof(int) * (size_t)T * G);
    for (int i = 0; in && tg && i < G && rc == DL_OK; i++)
        rc = dl_data_sample(s->R->data, i, in + (size_t)i * T, tg + (size_t)i * T);
    if (!in || !tg)
        rc = dl_error(DL_ENOMEM, "dump: out of memory");
    if (rc == DL_OK) {
        for (size_t i = 0; i < (size_t)T * G; i++) {
            int32_t v = in[i];
            fwrite(&v, 4, 1, f);
        }
        for (size_t i = 0; i < (size_t)T * G; i++) {
            int32_t v = tg[i];
            fwrite(&v, 4, 1, f);
        }
    }
    if (fclose(f) != 0 && rc == DL_OK)
        rc = dl_error(DL_ESYS, "cannot write '%s'", path);
    free(in), free(tg);
    return rc;
}

/* Under MPI the world spans processes and each process has its own copy of the run's tables,
 * filled by its own ranks: every rank shares its peaks and per-step figures with all (an
 * all-gather over the world), and each process's first rank fills the other processes' rows, so
 * that every process's summary covers every rank. */
static int share_rank_stats(rank_state *s, dl_comm *world, const uint64_t *peak)
{
    run *R = s->R;
    int n = R->nranks, rank = dl_ctx_rank(s->ctx), S = R->o->eval_only ? 0 : R->o->steps;
    int P = dl_mpi_size();
    size_t per = DL_MEM_NCATEGORIES + 5 * (size_t)S;
    double *all = calloc(per * (size_t)n, sizeof(double)), *mine;
    if (!all)
        return dl_error(DL_ENOMEM, "training: out of memory sharing the ranks' figures");
    mine = all + per * (size_t)rank;
    for (int c = 0; c < DL_MEM_NCATEGORIES; c++) mine[c] = (double)peak[c];
    for (int i = 0; i < S; i++) {
        size_t at = (size_t)i * n + rank;
        double *v = mine + DL_MEM_NCATEGORIES + 5 * (size_t)i;
        v[0] = R->step_ms[at], v[1] = R->pp_busy[at], v[2] = R->pp_wall[at];
        v[3] = R->pp_engine[at], v[4] = R->pp_gap[at];
    }
    int rc = dl_allgather(world, mine, all, per * (size_t)n, DL_F64, DL_PURPOSE_OTHER);
    int local = n / P, first = dl_mpi_rank() * local;
    if (rc == DL_OK && rank == first)
        for (int r = 0; r < n; r++) {
            if (r >= first && r < first + local)
                continue; /* this process's own ranks wrote theirs */
            const double *v = all + per * (size_t)r;
            for (int c = 0; c < DL_MEM_NCATEGORIES; c++)
                R->res->peak[(size_t)r * DL_MEM_NCATEGORIES + c] = (uint64_t)v[c];
            for (int i = 0; i < S; i++) {
                size_t at = (size_t)i * n + r;
                const double *w = v + DL_MEM_NCATEGORIES + 5 * (size_t)i;
                R->step_ms[at] = w[0], R->pp_busy[at] = w[1], R->pp_wall[at] = w[2];
                R->pp_engine[at] = w[3], R->pp_gap[at] = (int)w[4];
            }
        }
    free(all);
    return rc;
}

/* AdamW over this rank's blocks of every unit (stage 0: the units themselves), from the reduced
 * gradient, with state of the shard's size; bf16: on the fp32 master copy, then the bf16
 * parameters are its rounding. Stages 1-2 then all-gather the updated parameters unit by unit;
 * stage 3 keeps them sharded (gathered before each use). t: the Adam step (bias correction). */
static int adam_update(rank_state *s, double scale, double lr, int t)
{
    const dl_train_opts *o = s->R->o;
    int rc = DL_OK;
    for (int u = 0; u < s->zu.n; u++) {
        const dl_zero_unit *z = &s->zu.u[u];
        size_t nw = z->owned, sb = z->sbase;
        if (!nw)
            continue;
        char *pw = zparam(s, u), *gw = zgrad(s, u);
        if (s->bf16)
            dl_adamw_bf16((float *)s->master + sb, (const uint16_t *)gw, (float *)s->m + sb,
                          (float *)s->v + sb, nw, (float)lr, (float)o->beta1, (float)o->beta2,
                          (float)o->eps, (float)o->weight_decay, (float)scale, t, (uint16_t *)pw);
        else if (s->dsize == 8)
            dl_adamw_f64((double *)pw, (const double *)gw, (double *)s->m + sb, (double *)s->v + sb,
                         nw, lr, o->beta1, o->beta2, o->eps, o->weight_decay, scale, t);
        else
            dl_adamw_f32((float *)pw, (const float *)gw, (float *)s->m + sb, (float *)s->v + sb, nw,
                         (float)lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                         (float)o->weight_decay, (float)scale, t);
    }
    if (s->stage == 1 || s->stage == 2)
        for (int u = 0; rc == DL_OK && u < s->zu.n; u++) rc = zero_ag_unit(s, u);
    return rc;
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

/* Step i's record (0-based) from the run's tables: ms is the slowest rank's. */
static void fill_step(const run *R, int i, dl_train_step *st)
{
    const dl_train_opts *o = R->o;
    double mx = 0;
    for (int r = 0; r < R->nranks; r++) mx = fmax(mx, R->step_ms[(size_t)i * R->nranks + r]);
    st->step = i + 1;
    st->loss = R->loss[i];
    st->val_loss = R->val[i];
    st->lr = R->lr[i];
    st->grad_norm = R->norm[i];
    st->skipped = R->skip[i];
    st->ms = mx;
    st->tokens_per_s = (double)o->global_batch * o->model.seq / (mx / 1e3);
}

/* Hand the completed steps not yet handed to o->on_step: while training (all = 0) those every
 * rank of this process has finished (the acquire pairs with each rank's release after its
 * step time), after the run (all = 1) every step rank 0 recorded. */
static int emit_steps(run *R, int all)
{
    const dl_train_opts *o = R->o;
    if (!o->on_step)
        return DL_OK;
    while (R->emitted < R->steps_done &&
           (all || atomic_load_explicit(&R->finished[R->emitted], memory_order_acquire) ==
                       R->local_ranks)) {
        dl_train_step st;
        fill_step(R, R->emitted, &st);
        R->emitted++;
        int rc = o->on_step(&st, o->on_step_arg);
        if (rc != DL_OK)
            return rc;
    }
    return DL_OK;
}

static char *trace_timeline(const dl_trace *t, int step, int nranks);

/* Once, on rank 0 (or after the run): the trace file and the timeline of step `step`. */
static void finish_trace(run *R, int step)
{
    const dl_train_opts *o = R->o;
    if (!R->trace || R->trace_done)
        return;
    R->trace_done = 1;
    if (o->trace_path)
        R->trace_rc = dl_trace_write_chrome(R->trace, o->trace_path, NULL);
    if (o->timeline)
        R->res->timeline = trace_timeline(R->trace, step, R->nranks);
}

/* Rank 0's progress line: loss, tokens/s and ms/step over the steps since the last line (one
 * step alone is noisy: 2,285 tok/s printed against 4,831 in a summary), and the bytes this rank
 * sent per step so far, its pipeline hand-offs included (they go through the engine's own
 * communicators, not the world, dp or tp ones: 0.00 MB was printed for a pipeline). */
static void log_progress(rank_state *s, const run *R, int step, int last, double loss, double val)
{
    const dl_train_opts *o = R->o;
    dl_comm *c[3] = {dl_ctx_comm(s->ctx), s->mesh.dp_comm, s->mesh.tp_comm};
    uint64_t sent = R->pp_bytes;
    for (int i = 0; i < 3; i++) {
        dl_comm_stats st;
        dl_comm_get_stats(c[i], &st);
        for (int p = 0; p < DL_NPURPOSES; p++) sent += st.bytes_sent[p];
    }
    double ms = 0;
    for (int k = last; k < step; k++) ms += R->step_ms[(size_t)k * R->nranks];
    int n = step - last;
    char vbuf[32] = "     -";
    if (!isnan(val))
        snprintf(vbuf, sizeof vbuf, "%6.4f", val);
    fprintf(o->log,
            "step %5d/%d | loss %6.4f | val %s | %8.0f tok/s | %7.1f ms/step | "
            "%7.2f MB sent/rank\n",
            step, o->steps, loss, vbuf, (double)o->global_batch * o->model.seq * n / (ms / 1e3),
            ms / n, (double)sent / 1e6 / step);
    fflush(o->log);
}

static int train_rank(dl_ctx *ctx, void *arg)
{
    run *R = arg;
    const dl_train_opts *o = R->o;
    dl_train_result *res = R->res;
    int rank = dl_ctx_rank(ctx), rc;
    rank_state S = {.R = R, .ctx = ctx};
    rank_state *s = &S;
    dl_comm *world = dl_ctx_comm(ctx);
    dl_comm_set_algo(world, o->algo);
    if ((rc = dl_mesh_create(world, o->dp, o->pp, o->tp, 1, &s->mesh)))
        return rc;
    dl_comm_set_algo(s->mesh.dp_comm, o->algo);
    dl_comm_set_algo(s->mesh.tp_comm, o->algo);
    dl_comm_set_algo(s->mesh.pp_comm, o->algo);
    s->dt = o->dtype; /* storage of parameters and gradients */
    s->dsize = (int)dl_dtype_size(o->dtype);
    s->bf16 = o->dtype == DL_BF16;
    s->ct = s->bf16 ? DL_F32 : o->dtype; /* activations and arithmetic */
    s->csize = (int)dl_dtype_size(s->ct);
    /* ZeRO: with dp = 1 the one shard is the whole buffer: stage 0 runs (nothing to scatter) */
    s->stage = o->dp > 1 && !o->eval_only ? o->zero : 0;
    dl_gpt_part part;
    s->pp_on = o->pp > 1;
    if (s->pp_on && (rc = pp_setup(s, &part)))
        goto out;
    dl_gpt_opts go = {.cfg = o->model,
                      .dtype = o->dtype,
                      .micro_batch = o->micro_batch,
                      .tp = o->tp,
                      .tp_comm = o->tp > 1 ? s->mesh.tp_comm : NULL,
                      .recompute = o->recompute,
                      .seed = o->seed,
                      .arena = dl_ctx_arena(ctx),
                      .part = s->pp_on ? &part : NULL,
                      .act_slots = s->pp_on ? s->nslots : 1,
                      .unit_pad = s->stage ? o->dp : 1,
                      .gather = s->stage == 3 ? zero_gather_hook : NULL,
                      .reduce = s->stage >= 2 ? zero_reduce_hook : NULL,
                      .hook_arg = s};
    if ((rc = dl_gpt_create(&go, &s->g)))
        goto out;
    s->numel = dl_gpt_numel(s->g);
    {
        int nu = dl_gpt_num_units(s->g);
        size_t *bounds = malloc(sizeof(size_t) * (size_t)(nu + 1));
        if (!bounds) {
            rc = dl_error(DL_ENOMEM, "training: out of memory");
            goto out;
        }
        for (int u = 0; u <= nu; u++) bounds[u] = dl_gpt_unit_offset(s->g, u);
        rc = dl_zero_units_init(&s->zu, bounds, nu, s->stage ? o->dp : 1,
                                s->stage ? s->mesh.dp_rank : 0);
        if (rc == DL_OK && s->bf16 && !s->stage && o->dp > 1 && !o->eval_only)
            rc = dl_zero_units_init(&s->zr, bounds, nu, o->dp, s->mesh.dp_rank);
        free(bounds);
        if (rc)
            goto out;
    }
    s->next_unit = s->zu.n;
    s->bucket_elems = (size_t)(o->bucket_mb * 1048576.0 / s->dsize);
    dl_arena *arena = dl_ctx_arena(ctx);
    /* model state besides the model's own buffers: AdamW's m and v (and bf16's fp32 master) of
     * the shard (stage 0: everything), the reduced gradient shard (stages 2-3), the parameter
     * shard (stage 3) */
    size_t Sh = s->zu.shard, cs = (size_t)s->csize, ss = (size_t)s->dsize;
    if ((rc = dl_arena_alloc(arena, DL_MEM_OPTIMIZER, Sh * cs, &s->m)) ||
        (rc = dl_arena_alloc(arena, DL_MEM_OPTIMIZER, Sh * cs, &s->v)) ||
        (s->bf16 && (rc = dl_arena_alloc(arena, DL_MEM_OPTIMIZER, Sh * 4, (void **)&s->master))) ||
        (s->stage >= 2 &&
         (rc = dl_arena_alloc(arena, DL_MEM_GRADS, Sh * ss, (void **)&s->gshard))) ||
        (s->stage == 3 &&
         (rc = dl_arena_alloc(arena, DL_MEM_PARAMS, Sh * ss, (void **)&s->pshard))))
        goto out;
    /* staging of one padded unit: stages 1-2 for padded units, stages 2-3 in bf16 (the rounded
     * gradient handed to the reduce-scatter) */
    int padded_units = 0;
    const dl_zero_units *zs = s->zr.u ? &s->zr : &s->zu;
    for (int u = 0; u < zs->n; u++)
        padded_units |= zs->u[u].numel != (size_t)zs->dp * zs->u[u].shard;
    if ((((s->stage == 1 || s->stage == 2 || s->zr.u) && padded_units) ||
         (s->bf16 && s->stage >= 2)) &&
        (rc = dl_arena_alloc(arena, DL_MEM_COMM, zs->max_padded * ss, (void **)&s->stg)))
        goto out;
    if (s->pp_on && o->weight_stashing &&
        (rc = dl_arena_alloc(dl_ctx_arena(ctx), DL_MEM_PARAMS,
                             (size_t)s->nslots * s->numel * s->dsize, (void **)&s->stash)))
        goto out;
    if (s->pp_on && o->model.tie && (s->pp_stage == 0 || s->pp_stage == s->pp_p - 1) &&
        (rc = dl_arena_alloc(dl_ctx_arena(ctx), DL_MEM_COMM,
                             (size_t)o->model.vocab * o->model.d_model * s->dsize, &s->tie_buf)))
        goto out;
    if (s->bf16 || s->stage == 3) {
        /* the whole initial (or loaded) model in host memory once, in the export type; each rank
         * keeps its part (FSDP initialises on the host and shards likewise) */
        size_t es = s->bf16 ? 4 : ss;
        void *full = malloc(s->numel * es + 64);
        if (!full) {
            rc = dl_error(DL_ENOMEM, "training: out of host memory for the initial parameters");
            goto out;
        }
        if (o->load_path)
            rc = dl_ckpt_load(o->load_path, dl_gpt_get_layout(s->g), full, (int)es);
        else
            dl_gpt_init(dl_gpt_get_layout(s->g), full, (int)es, o->seed);
        if (rc == DL_OK)
            zero_import(s, full);
        free(full);
        if (rc)
            goto out;
    } else if (o->load_path && (rc = dl_ckpt_load(o->load_path, dl_gpt_get_layout(s->g),
                                                  dl_gpt_params(s->g), s->dsize))) {
        goto out;
    }
    test_perturb(s, rank);
    int T = o->model.seq, mb = o->micro_batch, G = o->global_batch;
    if (o->eval_only) {
        double v;
        int used;
        if ((rc = evaluate(s, &v, &used)))
            goto out;
        if (rank == 0) {
            res->final_val_loss = v;
            res->eval_windows_used = used;
        }
        goto finish;
    }
    int *in = malloc(sizeof(int) * (size_t)mb * T), *tg = malloc(sizeof(int) * (size_t)mb * T);
    if (!in || !tg) {
        free(in), free(tg);
        rc = dl_error(DL_ENOMEM, "training: out of memory");
        goto out;
    }
    dl_comm_reset_stats(s->mesh.dp_comm);
    dl_comm_reset_stats(s->mesh.tp_comm);
    dl_comm_reset_stats(world);
    int last_logged = 0;
    for (int step = 1; step <= o->steps && rc == DL_OK; step++) {
        int logging = rank == 0 && R->gemm && step == (o->steps > 1 ? 2 : 1);
        if (logging)
            dl_ops_gemm_log(R->gemm);
        uint64_t t0 = dl_now_ns();
        s->step = step;
        s->tr =
            !o->trace_first || (step >= o->trace_first && step <= o->trace_last) ? R->trace : NULL;
        dl_gpt_zero_grads(s->g);
        if (s->gshard)
            memset(s->gshard, 0, s->zu.shard * (size_t)s->dsize);
        double loss_sum = 0;
        s->launched = s->numel;
        s->next_unit = s->zu.n;
        if (s->pp_on) {
            /* the pipeline: the engine runs this stage's actions; gradients are reduced after
             * it (stage by stage, not overlapped with the backward) */
            dl_pipe_stats ps;
            s->loss_sum = 0;
            s->max_gap = 0;
            rc = dl_pipe_run(s->eng, s->sched, &pp_ops, s, step, s->tr, rank, &ps);
            loss_sum = s->loss_sum;
            size_t at = (size_t)(step - 1) * R->nranks + rank;
            R->pp_busy[at] = (double)ps.busy_ns;
            R->pp_wall[at] = (double)ps.wall_ns;
            R->pp_engine[at] = ps.actions ? (double)ps.engine_ns / ps.actions : 0;
            R->pp_gap[at] = s->max_gap;
            if (rank == 0)
                R->pp_bytes += ps.bytes_sent;
            if (rc == DL_OK && s->sched->flush && (rc = pp_tie_sync(s)) == DL_OK) {
                if (s->stage)
                    rc = zero_ready(s, 0);
                else if (o->dp > 1)
                    rc = grad_ready(0, s);
            }
        } else {
            for (int micro = 0; micro < o->microbatches && rc == DL_OK; micro++) {
                double loss;
                int last = micro == o->microbatches - 1 && o->dp > 1;
                uint64_t f0 = dl_now_ns(), f1 = 0;
                double dloss = 1.0 / ((double)G * T);
                if (step == o->nan_step && micro == 0 && s->mesh.dp_rank == 0)
                    dloss = NAN; /* test hook: a non-finite gradient on one rank */
                if ((rc = dl_data_batch(R->data, step - 1, G, o->dp, s->mesh.dp_rank, micro, mb, in,
                                        tg)) ||
                    (rc = dl_gpt_forward(s->g, in, tg, mb, &loss)) ||
                    ((f1 = dl_now_ns()),
                     (rc = dl_gpt_backward(s->g, dloss, last ? grad_ready : NULL, s))))
                    break;
                dl_trace_add(s->tr, rank, DL_TR_FWD, step, micro, 0, f0, f1);
                dl_trace_add(s->tr, rank, DL_TR_BWD, step, micro, 0, f1, dl_now_ns());
                loss_sum += loss * mb / G;
            }
            if (rc == DL_OK && s->stage) /* whatever the model did not report (nothing, normally) */
                rc = zero_ready(s, 0);
        }
        uint64_t c0 = dl_now_ns();
        if (rc == DL_OK)
            rc = wait_buckets(s);
        if (rc == DL_OK && o->dp > 1)
            rc = dl_allreduce(s->mesh.dp_comm, &loss_sum, &loss_sum, 1, DL_F64, DL_SUM,
                              DL_PURPOSE_LOSS);
        if (rc == DL_OK && s->pp_on) /* the loss is the last stage's */
            rc = dl_allreduce(s->mesh.pp_comm, &loss_sum, &loss_sum, 1, DL_F64, DL_SUM,
                              DL_PURPOSE_LOSS);
        /* a non-finite loss does not recover (a non-finite gradient alone skips the step): stop */
        if (rc == DL_OK && !isfinite(loss_sum))
            rc = dl_error(DL_EINVAL,
                          "training: step %d: the loss is %g, not finite; stopping (the "
                          "model diverged: try a lower learning rate)",
                          step, loss_sum);
        /* the gradient reduction's wait (and whatever of it did not overlap) and the loss */
        dl_trace_add(s->tr, rank, DL_TR_COMM, step, -1, 0, c0, dl_now_ns());
        /* async: every update happened inside the pipeline */
        int updated = s->pp_on && !s->sched->flush;
        double norm = 0;
        if (rc == DL_OK && !updated)
            rc = grad_norm(s, &norm);
        if (rc)
            break;
        int want_full = (o->want_grads && step == o->steps) || (o->dump_grads && step == 1);
        if (want_full) {
            /* the reduced gradient, whole, for the caller (not training traffic) */
            int es = s->bf16 ? 4 : s->dsize;
            void *full = malloc(s->numel * (size_t)es + 64);
            if (!full) {
                rc = dl_error(DL_ENOMEM, "training: out of host memory");
                break;
            }
            rc = zero_export(s, 1, full);
            if (rc == DL_OK && o->want_grads && step == o->steps)
                gather_into(s, full, es, res->grads);
            if (rc == DL_OK && o->dump_grads && step == 1)
                rc = dump_step(s, full, es);
            free(full);
            if (rc)
                break;
        }
        double scale = o->clip > 0 && norm > o->clip ? o->clip / norm : 1.0, lr = lr_at(o, step);
        /* a non-finite gradient anywhere (the norm is global) skips the step on every rank */
        int skip = !updated && !isfinite(norm);
        if (skip)
            s->skipped++;
        uint64_t a0 = dl_now_ns();
        if (!updated && !skip && (rc = adam_update(s, scale, lr, ++s->adam_t)))
            break;
        dl_trace_add(s->tr, rank, DL_TR_OPT, step, -1, 0, a0, dl_now_ns());
        if (!s->pp_on) /* a pipeline's step span is the engine's (its bubble's window) */
            dl_trace_add(s->tr, rank, DL_TR_STEP, step, -1, 0, t0, dl_now_ns());
        R->step_ms[(size_t)(step - 1) * R->nranks + rank] = (double)(dl_now_ns() - t0) / 1e6;
        atomic_fetch_add_explicit(&R->finished[step - 1], 1, memory_order_release);
        if (logging)
            dl_ops_gemm_log(NULL);
        double val = NAN;
        int used = 0;
        if ((o->eval_every > 0 && step % o->eval_every == 0) || step == o->steps) {
            /* evaluation traffic is not training traffic: keep it out of the per-step counters */
            dl_comm_stats b0, b1, d0, d1;
            dl_comm_get_stats(s->mesh.tp_comm, &b0);
            dl_comm_get_stats(s->mesh.dp_comm, &d0);
            if ((rc = evaluate(s, &val, &used)))
                break;
            dl_comm_get_stats(s->mesh.tp_comm, &b1);
            dl_comm_get_stats(s->mesh.dp_comm, &d1);
            s->eval_tp_bytes +=
                b1.bytes_sent[DL_PURPOSE_ACTIVATIONS] - b0.bytes_sent[DL_PURPOSE_ACTIVATIONS];
            s->eval_loss_bytes += d1.bytes_sent[DL_PURPOSE_LOSS] - d0.bytes_sent[DL_PURPOSE_LOSS];
            s->eval_param_bytes +=
                d1.bytes_sent[DL_PURPOSE_PARAMS] - d0.bytes_sent[DL_PURPOSE_PARAMS];
        }
        if (rank == 0) {
            R->loss[step - 1] = loss_sum;
            R->val[step - 1] = val;
            R->norm[step - 1] = norm;
            R->lr[step - 1] = lr;
            R->skip[step - 1] = skip;
            R->steps_done = step;
            if (dl_mpi_size() <= 1 && (rc = emit_steps(R, 0)))
                break;
            res->eval_windows_used = used ? used : res->eval_windows_used;
            if (o->log && o->log_every > 0 &&
                (step % o->log_every == 0 || step == 1 || step == o->steps)) {
                log_progress(s, R, step, last_logged, loss_sum, val);
                last_logged = step;
            }
            /* every rank is past the window now (each synchronised with rank 0, directly or
             * through a peer, in this step's collectives, after its last traced event) */
            if (o->trace_last && step == o->trace_last + 1)
                finish_trace(R, o->trace_last);
        }
    }
    free(in), free(tg);
    if (rc)
        goto out;
    if (rank == 0) {
        dl_comm_stats a, b, w;
        dl_comm_get_stats(s->mesh.dp_comm, &a);
        dl_comm_get_stats(s->mesh.tp_comm, &b);
        dl_comm_get_stats(world, &w);
        double n = o->steps;
        res->dp_grad_bytes_per_step = (double)a.bytes_sent[DL_PURPOSE_GRADS] / n;
        res->dp_param_bytes_per_step = (double)a.bytes_sent[DL_PURPOSE_PARAMS] / n;
        res->zero = s->stage;
        res->zero_padded = (int64_t)s->zu.padded;
        res->zero_padding = (int64_t)s->zu.padding;
        res->zero_shard = (int64_t)s->zu.shard;
        res->zero_units = s->zu.n;
        res->dp_param_bytes_per_step =
            (double)(a.bytes_sent[DL_PURPOSE_PARAMS] - s->eval_param_bytes) / n;
        res->dp_elems_per_step =
            (res->dp_grad_bytes_per_step + res->dp_param_bytes_per_step) / s->dsize;
        size_t gathered = 0;
        res->unit_bytes = dl_gpt_unit_bytes(s->g, &gathered);
        res->gathered_bytes = gathered;
        res->skipped_steps = s->skipped;
        res->tp_act_bytes_per_step =
            (double)(b.bytes_sent[DL_PURPOSE_ACTIVATIONS] - s->eval_tp_bytes) / n;
        res->loss_bytes_per_step =
            (double)(a.bytes_sent[DL_PURPOSE_LOSS] + b.bytes_sent[DL_PURPOSE_LOSS] +
                     w.bytes_sent[DL_PURPOSE_LOSS] - s->eval_loss_bytes) /
            n;
        res->grad_bytes = (uint64_t)s->numel * (uint64_t)s->dsize;
    }
finish:
    if (o->want_params || o->save_path) {
        /* the whole parameters (bf16: the fp32 master weights), in host memory when sharded */
        int es = s->bf16 ? 4 : s->dsize, direct = !s->bf16 && s->stage < 3;
        void *full = direct ? dl_gpt_params(s->g) : malloc(s->numel * (size_t)es + 64);
        if (!full) {
            rc = dl_error(DL_ENOMEM, "training: out of host memory");
            goto out;
        }
        if (!direct)
            rc = zero_export(s, 0, full);
        if (rc == DL_OK && o->want_params)
            gather_into(s, full, es, res->params);
        if (rc == DL_OK && o->save_path)
            rc = dl_ckpt_save(o->save_path, dl_gpt_get_layout(s->g), full, es, world,
                              s->mesh.dp_rank == 0);
        if (!direct)
            free(full);
        if (rc)
            goto out;
    }
    if (o->sample > 0 && (rc = sample_text(s)))
        goto out;
out:
    if (rc == DL_OK) {
        /* measured before the model is freed: what this rank held at its peak */
        dl_arena_stats as;
        dl_arena_get_stats(dl_ctx_arena(ctx), &as);
        for (int c = 0; c < DL_MEM_NCATEGORIES; c++)
            res->peak[(size_t)rank * DL_MEM_NCATEGORIES + c] = as.peak[c];
        if (dl_mpi_size() > 1)
            rc = share_rank_stats(s, world, as.peak);
    }
    if (s->m)
        dl_arena_free(dl_ctx_arena(ctx), s->m);
    if (s->v)
        dl_arena_free(dl_ctx_arena(ctx), s->v);
    dl_arena_free(dl_ctx_arena(ctx), s->master);
    dl_arena_free(dl_ctx_arena(ctx), s->gshard);
    dl_arena_free(dl_ctx_arena(ctx), s->pshard);
    dl_arena_free(dl_ctx_arena(ctx), s->stg);
    dl_zero_units_free(&s->zu);
    dl_zero_units_free(&s->zr);
    pp_free(s);
    dl_gpt_destroy(s->g);
    if (rc == DL_OK) {
        rc = dl_mesh_destroy(&s->mesh);
    } else {
        /* abort the world first (the peers may wait for this rank in a collective), then free the
         * communicators (their barriers return at once), keeping this rank's message */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        dl_comm_fail(world);
        dl_mesh_destroy(&s->mesh);
        dl_error(rc, "%s", msg);
    }
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Measured bubbles (each stage's first rank: world rank stage x dp x tp), over the steps after
 * the first when there are more, the engine's overhead per action, the version gaps. */
static void pp_summary(const dl_train_opts *o, const run *R, dl_train_result *res)
{
    int n = R->nranks, p = o->pp, per = o->dp * o->tp, S = R->steps_done;
    int skip = S > 1 ? 1 : 0, k = S - skip;
    /* per step: a stage's figure, or every rank's engine overhead (n >= p) */
    double *x = malloc(sizeof(double) * (size_t)(k > 0 ? k : 1) * (size_t)n);
    if (!x)
        return;
    for (int st = 0; st < p; st++) {
        int r = st * per;
        for (int i = 0; i < k; i++) {
            size_t at = (size_t)(i + skip) * n + r;
            x[i] = R->pp_wall[at] > 0 ? 1.0 - R->pp_busy[at] / R->pp_wall[at] : NAN;
        }
        res->pp_bubble[st] = dl__median(x, (size_t)k);
        int gap = 0;
        for (int i = 0; i < S; i++)
            if (R->pp_gap[(size_t)i * n + r] > gap)
                gap = R->pp_gap[(size_t)i * n + r];
        res->pp_max_gap[st] = gap;
    }
    for (int i = 0; i < k; i++) {
        double busy = 0, wall = 0;
        for (int st = 0; st < p; st++) {
            size_t at = (size_t)(i + skip) * n + (size_t)st * per;
            busy += R->pp_busy[at];
            if (R->pp_wall[at] > wall)
                wall = R->pp_wall[at];
        }
        x[i] = wall > 0 ? 1.0 - busy / (p * wall) : NAN;
    }
    res->pp_bubble_total = dl__median(x, (size_t)k);
    for (int i = 0; i < k; i++)
        for (int r = 0; r < n; r++)
            x[(size_t)i * n + r] = R->pp_engine[(size_t)(i + skip) * n + r] / 1e3;
    res->pp_engine_us =
        dl__median(x, (size_t)(k * n)); /* sorted x: the 90th percentile is an index */
    res->pp_engine_p90_us = k * n > 0 ? x[(size_t)((k * n - 1) * 0.9 + 0.5)] : NAN;
    res->pp_bytes_per_step = (double)R->pp_bytes / S;
    free(x);
    dl_sched *sc = NULL;
    dl_sched_sim *sim = NULL;
    if (pp_make_sched(o, &sc) == DL_OK && dl_sched_simulate(sc, NULL, &sim) == DL_OK)
        for (int st = 0; st < p; st++) res->pp_slots[st] = sim->peak_act[st];
    dl_sched_sim_free(sim);
    dl_sched_free(sc);
}

/* The grid's widest: past it the per-stage list carries what the cells merge. */
#define TIMELINE_MAX_CELLS 200
#define DL_STR_(x) #x
#define DL_STR(x) DL_STR_(x)

/* The step's measured grid with its legend: one cell per the step's shortest forward or
 * backward (so that every action can fill a cell), but at most TIMELINE_MAX_CELLS cells; when
 * some action still shows in no cell, every stage's actions in start order follow. */
static char *trace_timeline(const dl_trace *t, int step, int nranks)
{
    uint64_t unit = UINT64_MAX, w0 = UINT64_MAX, w1 = 0;
    for (int r = 0; r < nranks; r++) {
        size_t cnt = dl_trace_count(t, r);
        const dl_trace_event *ev = dl_trace_events(t, r);
        for (size_t i = 0; i < cnt; i++) {
            const dl_trace_event *e = &ev[i];
            if (e->step != step)
                continue;
            if (e->kind == DL_TR_STEP) {
                w0 = e->t0 < w0 ? e->t0 : w0;
                w1 = e->t1 > w1 ? e->t1 : w1;
            }
            if ((e->kind == DL_TR_FWD || e->kind == DL_TR_BWD) && e->t1 > e->t0 &&
                e->t1 - e->t0 < unit)
                unit = e->t1 - e->t0;
        }
    }
    if (unit == UINT64_MAX || w1 <= w0)
        return NULL;
    uint64_t floor_unit = (w1 - w0 + TIMELINE_MAX_CELLS - 1) / TIMELINE_MAX_CELLS;
    unit = unit > floor_unit ? unit : floor_unit;
    char *grid = NULL, *list = NULL;
    int hidden = 0;
    if (dl_trace_grid_hidden(t, step, unit, &grid, &hidden) != DL_OK)
        return NULL;
    if (hidden && dl_trace_actions(t, step, &list) != DL_OK)
        list = NULL;
    const char *legend =
        "legend: a digit is a forward of that micro-batch (0-9, then A-Z), a letter its backward "
        "(a = micro-batch 0), * an optimizer step, = a collective, \xC2\xB7 idle (waiting: the "
        "bubble); a cell shows the one action covering most of it (ties: forward, then backward, "
        "then the earlier one)\n";
    size_t n = strlen(grid) + strlen(legend) + (list ? strlen(list) : 0) + 400;
    char *out = malloc(n);
    if (out) {
        int k = snprintf(out, n, "one cell = %.1f us (%s); %s\n%s%s", (double)unit / 1e3,
                         unit > floor_unit ? "the shortest forward or backward"
                                           : "the step over " DL_STR(TIMELINE_MAX_CELLS) " cells",
                         hidden ? "some actions are shorter than a cell next to longer ones"
                                : "every forward and backward of every stage fills a cell",
                         grid, legend);
        if (list && k > 0 && (size_t)k < n)
            snprintf(out + k, n - (size_t)k,
                     "%d action(s) hidden by merged cells; every stage's "
                     "actions in start order:\n%s",
                     hidden, list);
    }
    free(grid);
    free(list);
    return out;
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
    run R = {.o = &o, .res = res, .nranks = n};
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
    res->nsteps = R.steps_done;
    res->steps = calloc((size_t)R.steps_done + 1, sizeof *res->steps);
    double *med = calloc((size_t)R.steps_done + 1, sizeof(double));
    for (int i = 0; res->steps && med && i < R.steps_done; i++) {
        fill_step(&R, i, &res->steps[i]);
        med[i] = res->steps[i].ms;
    }
    /* the records still owed to on_step (the last ones, or all of them under MPI) */
    int erc = emit_steps(&R, 1);
    if (erc && rc == DL_OK)
        rc = erc;
    if (R.steps_done > 0 && med) {
        res->final_loss = R.loss[R.steps_done - 1];
        if (!isnan(R.val[R.steps_done - 1]))
            res->final_val_loss = R.val[R.steps_done - 1];
        /* the first step pays for page faults and thread start: leave it out when there are more */
        int skip = R.steps_done > 1 ? 1 : 0;
        qsort(med + skip, (size_t)(R.steps_done - skip), sizeof(double), cmp_double);
        res->ms_per_step = med[skip + (R.steps_done - skip) / 2];
        res->tokens_per_s = (double)o.global_batch * o.model.seq / (res->ms_per_step / 1e3);
        res->model_gflops_per_rank =
            dl_train_step_flops(&o.model, o.global_batch) / (res->ms_per_step / 1e3) / n / 1e9;
    }
    free(med);
    if (o.pp > 1 && R.steps_done > 0)
        pp_summary(&o, &R, res);
    if (R.steps_done > 0)
        finish_trace(&R, o.trace_last && o.trace_last < R.steps_done ? o.trace_last : R.steps_done);
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
