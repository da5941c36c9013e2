/* Data parallelism in the trainer (parallel/module.h): the step's loss summed over the dp group,
 * and, at ZeRO stage 0 outside bf16, the gradient's all-reduce in buckets launched during the
 * last micro-batch's backward as they fill (with --overlap non-blocking, waited for after the
 * backward). */
#include "parallel/dp_buckets.h"
#include "parallel/module.h"
#include <stdlib.h>

#define MAX_REQ 512

typedef struct dp_state {
    tr_env *e;
    size_t launched; /* gradients at [launched, numel) have been handed to the dp reduce */
    size_t bucket_elems;
    dl_request *req[MAX_REQ];
    int nreq;
} dp_state;

int tr_bucket_next(size_t *launched, size_t first, size_t bucket_elems, size_t *lo, size_t *n)
{
    if (!(*launched - first >= bucket_elems || (first == 0 && *launched > 0)) || *launched == first)
        return 0;
    *lo = first, *n = *launched - first;
    *launched = first;
    return 1;
}

static int dp_begin(void *st)
{
    dp_state *d = st;
    d->launched = d->e->numel;
    return DL_OK;
}

/* the all-reduce of [lo, lo + n) over dp */
static int dp_launch(dp_state *d, size_t lo, size_t n)
{
    tr_env *e = d->e;
    char *base = (char *)dl_gpt_grads(e->g) + lo * (size_t)e->pr.dsize;
    if (e->o->comm.overlap && d->nreq < MAX_REQ)
        return dl_iallreduce(e->mesh->dp_comm, base, base, n, e->pr.dt, DL_SUM, DL_PURPOSE_GRADS,
                             &d->req[d->nreq++]);
    return dl_allreduce(e->mesh->dp_comm, base, base, n, e->pr.dt, DL_SUM, DL_PURPOSE_GRADS);
}

static int dp_grads_ready(void *st, size_t first)
{
    dp_state *d = st;
    tr_env *e = d->e;
    size_t lo, n;
    if (!tr_bucket_next(&d->launched, first, d->bucket_elems, &lo, &n))
        return DL_OK;
    int rc = DL_OK;
    uint64_t t0 = dl_now_ns();
    /* the bucket less the ranges another module reduces (tr_env.excl, in offset order) */
    size_t at = lo, end = lo + n;
    for (int i = 0; i < e->nexcl && rc == DL_OK; i++) {
        size_t a = e->excl[2 * i], b = e->excl[2 * i + 1];
        if (b <= at || a >= end)
            continue;
        if (a > at)
            rc = dp_launch(d, at, a - at);
        at = b < end ? b : end;
    }
    if (rc == DL_OK && at < end)
        rc = dp_launch(d, at, end - at);
    /* a blocking bucket runs inside the backward: the trace shows it there */
    dl_trace_add(e->tr, e->rank, DL_TR_COMM, e->step, -1, 0, t0, dl_now_ns());
    return rc;
}

static int dp_wait(void *st)
{
    dp_state *d = st;
    int rc = DL_OK;
    for (int i = 0; i < d->nreq; i++) {
        int r = dl_wait(d->req[i]);
        if (r && !rc)
            rc = r;
    }
    d->nreq = 0;
    return rc;
}

static int dp_reduce_loss(void *st, double *loss)
{
    dp_state *d = st;
    return dl_allreduce(d->e->mesh->dp_comm, loss, loss, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
}

static void dp_teardown(void *st) { free(st); }

int tr_dp_make(tr_env *e, tr_module *m)
{
    const dl_train_opts *o = e->o;
    if (o->layout.dp < 2)
        return DL_OK;
    dp_state *d = calloc(1, sizeof *d);
    if (!d)
        return dl_error(DL_ENOMEM, "data parallelism: out of memory");
    d->e = e;
    d->bucket_elems = (size_t)(o->comm.bucket_mb * 1048576.0 / e->pr.dsize);
    *m = (tr_module){.name = "dp", .st = d, .reduce_loss = dp_reduce_loss, .teardown = dp_teardown};
    /* ZeRO and bf16 reduce the gradient their own way (tr_shard_make, tr_dp_bf16_make) */
    if (o->zero.stage == 0 && !e->pr.bf16)
        m->begin = dp_begin, m->grads_ready = dp_grads_ready, m->reduce = dp_wait;
    return DL_OK;
}
