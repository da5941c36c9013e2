/* The trainer's option resolution: defaults, the batch sizes from any two of them, and the
 * checks every strategy's options must pass before a rank starts (the pipeline's part in
 * pp_resolve). */
#include <string.h>
#include "distlab.h"
#include "distlab/train.h"
#include "model/gpt_priv.h"
#include "parallel/pipe_train.h"

void dl_train_opts_init(dl_train_opts *o)
{
    memset(o, 0, sizeof *o);
    dl_gpt_config_default(&o->model);
    o->model.layers = 2;
    o->model.d_model = 128;
    o->model.heads = 4;
    o->model.seq = 64;
    o->precision.dtype = DL_F32;
    o->layout.dp = 1;
    o->layout.tp = 1;
    o->optim.steps = 200;
    o->optim.lr = 3e-3;
    o->optim.min_lr = 3e-4;
    o->optim.warmup = 20;
    o->optim.beta1 = 0.9;
    o->optim.beta2 = 0.999;
    o->optim.eps = 1e-8;
    o->optim.weight_decay = 0.01;
    o->optim.clip = 1.0;
    o->optim.seed = 1;
    o->data.seed = 1;
    o->comm.bucket_mb = 1.0;
    o->comm.algo = DL_ALGO_AUTO;
    o->eval.every = 0;
    o->eval.windows = 64;
    o->output.log_every = 10;
    o->machine.timeout_s = 120;
}

/* The pipeline's part of the configuration (after the batch sizes are known). */
static int pp_resolve(dl_train_opts *o)
{
    int p = o->layout.pp, L = o->model.layers, m = o->batch.microbatches;
    if (o->pipeline.schedule == DL_SCHED_CUSTOM)
        o->pipeline.schedule = DL_SCHED_GPIPE;
    int k = o->pipeline.schedule;
    if (!tr_pipe_trains(k)) {
        char list[128];
        tr_pipe_kind_list(list, sizeof list);
        return dl_error(DL_EINVAL, "schedule %s cannot train: use %s",
                        dl_sched_kind_name((dl_sched_kind)k), list);
    }
    if (k == DL_SCHED_NAIVE && m != 1)
        return dl_error(DL_EINVAL, "the naive schedule runs one micro-batch (got %d)", m);
    if (k != DL_SCHED_INTERLEAVED && o->pipeline.virtual_stages > 1)
        return dl_error(DL_EINVAL, "--virtual-stages %d needs --schedule interleaved",
                        o->pipeline.virtual_stages);
    int v = k == DL_SCHED_INTERLEAVED
                ? (o->pipeline.virtual_stages > 0 ? o->pipeline.virtual_stages : 2)
                : 1;
    o->pipeline.virtual_stages = v;
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
    if (o->pipeline.weight_stashing && k != DL_SCHED_ASYNC)
        return dl_error(DL_EINVAL, "--weight-stashing needs --schedule async");
    if (p == 1)
        return DL_OK;
    if (k == DL_SCHED_ASYNC && (o->zero.stage || o->model.tie))
        return dl_error(DL_EINVAL, "the async schedule updates each stage on its own: it does "
                                   "not combine with ZeRO or tied embeddings");
    if (o->model.tie && o->zero.stage)
        return dl_error(DL_EINVAL, "tied embeddings with pp > 1 and ZeRO are not supported yet");
    return DL_OK;
}

int dl_train_resolve(dl_train_opts *o, int nranks)
{
    if (o->layout.pp == 0)
        o->layout.pp = 1;
    if (o->layout.dp < 1 || o->layout.tp < 1 || o->layout.pp < 1)
        return dl_error(DL_EINVAL, "dp, tp and pp must be >= 1 (got dp %d, tp %d, pp %d)",
                        o->layout.dp, o->layout.tp, o->layout.pp);
    if (nranks > 0 && o->layout.dp * o->layout.tp * o->layout.pp != nranks)
        return dl_error(DL_EINVAL, "dp %d x tp %d x pp %d = %d is not the rank count %d",
                        o->layout.dp, o->layout.tp, o->layout.pp,
                        o->layout.dp * o->layout.tp * o->layout.pp, nranks);
    int rc = dl_gpt_config_check(&o->model, o->layout.tp);
    if (rc)
        return rc;
    if (o->model.vocab != 256)
        return dl_error(DL_EINVAL, "the vocabulary is bytes: 256 (got %d)", o->model.vocab);
    int G = o->batch.global, mb = o->batch.micro, m = o->batch.microbatches, d = o->layout.dp;
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
    o->batch.micro = mb;
    o->batch.microbatches = m;
    o->batch.global = d * m * mb;
    if (o->optim.steps < 0 || (o->optim.steps == 0 && !o->eval.only))
        return dl_error(DL_EINVAL, "steps must be >= 1 (got %d)", o->optim.steps);
    if (o->trace.first < 0 || o->trace.last < o->trace.first ||
        (o->trace.first == 0) != (o->trace.last == 0) ||
        (!o->eval.only && o->trace.last > o->optim.steps))
        return dl_error(DL_EINVAL,
                        "traced steps %d..%d: want 1 <= first <= last <= steps %d (or 0, 0: all)",
                        o->trace.first, o->trace.last, o->optim.steps);
    if (!(o->optim.lr > 0) || o->optim.min_lr < 0 || o->optim.warmup < 0)
        return dl_error(DL_EINVAL, "learning rate must be > 0, min-lr >= 0, warm-up >= 0");
    if (o->eval.only && !o->ckpt.load)
        return dl_error(DL_EINVAL, "--eval-only needs --load FILE");
    if (o->comm.bucket_mb < 0)
        return dl_error(DL_EINVAL, "bucket size must be >= 0 MiB");
    if (o->precision.dtype != DL_F32 && o->precision.dtype != DL_F64 &&
        o->precision.dtype != DL_BF16)
        return dl_error(DL_EINVAL, "dtype must be f32, f64 or bf16");
    if (o->zero.stage < 0 || o->zero.stage > 3)
        return dl_error(DL_EINVAL, "ZeRO stage must be 0, 1, 2 or 3 (got %d)", o->zero.stage);
    return pp_resolve(o);
}

double dl_train_step_flops(const dl_gpt_config *c, int G)
{
    double L = c->layers, C = c->d_model, V = c->vocab, T = c->seq;
    double fwd_per_token = 24.0 * L * C * C + 2.0 * V * C + 2.0 * L * C * (T + 1);
    return 3.0 * fwd_per_token * T * G;
}
