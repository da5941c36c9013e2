/* The trainer's option resolution: defaults, the batch sizes from any two of them, the common
 * checks, then each strategy module's own (modules.def: ZeRO's, the pipeline's) before a rank
 * starts. */
#include <string.h>
#include "distlab.h"
#include "core/fault_spec.h"
#include "distlab/train.h"
#include "model/gpt_priv.h"

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

/* The strategy modules' own checks (modules.def), after the common ones. */
#define TR_MODULE(make, resolve) int resolve(dl_train_opts *o);
#include "train/modules.def"
#undef TR_MODULE

static int (*const resolvers[])(dl_train_opts *o) = {
#define TR_MODULE(make, resolve) resolve,
#include "train/modules.def"
#undef TR_MODULE
};

int tr_no_resolve(dl_train_opts *o) { return (void)o, DL_OK; }

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
    if (o->output.temperature < 0 || o->output.temperature > 100)
        return dl_error(DL_EINVAL, "sampling temperature must be in (0, 100] (got %g)",
                        o->output.temperature);
    if (o->output.prompt && !*o->output.prompt)
        return dl_error(DL_EINVAL, "the sample's prompt is empty");
    for (const char *p = o->output.prompt; p && *p; p++)
        if ((unsigned char)*p >= (unsigned)o->model.vocab)
            return dl_error(DL_EINVAL, "the sample's prompt has byte %u, beyond the vocabulary %d",
                            (unsigned char)*p, o->model.vocab);
    if (o->comm.bucket_mb < 0)
        return dl_error(DL_EINVAL, "bucket size must be >= 0 MiB");
    if (o->precision.dtype != DL_F32 && o->precision.dtype != DL_F64 &&
        o->precision.dtype != DL_BF16)
        return dl_error(DL_EINVAL, "dtype must be f32, f64 or bf16");
    dl__fault f;
    if (o->machine.inject_fault && (rc = dl__fault_parse(o->machine.inject_fault, &f)))
        return rc;
    if (o->machine.inject_fault && f.rank >= d * o->layout.tp * o->layout.pp)
        return dl_error(DL_EINVAL, "--inject-fault: rank %d of %d ranks", f.rank,
                        d * o->layout.tp * o->layout.pp);
    for (size_t i = 0; i < sizeof resolvers / sizeof resolvers[0]; i++)
        if ((rc = resolvers[i](o)))
            return rc;
    return DL_OK;
}

double dl_train_step_flops(const dl_gpt_config *c, int G)
{
    double L = c->layers, C = c->d_model, V = c->vocab, T = c->seq;
    double fwd_per_token = 24.0 * L * C * C + 2.0 * V * C + 2.0 * L * C * (T + 1);
    return 3.0 * fwd_per_token * T * G;
}
