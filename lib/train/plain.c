/* The plain runner (parallel/module.h), when there is no pipeline: the step's micro-batches each
 * through the whole model, forward then backward, gradients accumulating; the last backward
 * tells the modules which gradients are final as it goes (tr_grads_ready), so that their
 * reductions overlap the rest of it. */
#include <math.h>
#include <stdlib.h>
#include "core/testhook.h"
#include "parallel/module.h"
#include "train/compose.h"

typedef struct plain_state {
    tr_env *e;
    int *in, *tg; /* a micro-batch's tokens */
} plain_state;

static int plain_fwd_bwd(void *st, double *loss_sum)
{
    plain_state *p = st;
    tr_env *e = p->e;
    const dl_train_opts *o = e->o;
    int T = o->model.seq, mb = o->batch.micro, G = o->batch.global, rc = DL_OK;
    const dl__test_hook *h = dl__test_hook_get();
    int nan_step = h ? h->nan_step : 0;
    for (int micro = 0; micro < o->batch.microbatches && rc == DL_OK; micro++) {
        double loss;
        int last = micro == o->batch.microbatches - 1;
        uint64_t f0 = dl_now_ns(), f1 = 0;
        double dloss = 1.0 / ((double)G * T);
        if (e->step == nan_step && micro == 0 && e->mesh->dp_rank == 0)
            dloss = NAN; /* test hook: a non-finite gradient on one rank */
        if ((rc = dl_data_batch(e->data, e->step - 1, G, o->layout.dp, e->mesh->dp_rank, micro, mb,
                                p->in, p->tg)) ||
            (rc = dl_gpt_forward(e->g, p->in, p->tg, mb, &loss)) ||
            ((f1 = dl_now_ns()),
             (rc = dl_gpt_backward(e->g, dloss,
                                   last && e->call.has_ready(e->comp) ? e->call.grads_ready : NULL,
                                   e->comp))))
            break;
        dl_trace_add(e->tr, e->rank, DL_TR_FWD, e->step, micro, 0, f0, f1);
        dl_trace_add(e->tr, e->rank, DL_TR_BWD, e->step, micro, 0, f1, dl_now_ns());
        *loss_sum += loss * mb / G;
    }
    /* whatever the model did not report (nothing, normally) */
    return rc == DL_OK ? e->call.grads_ready(0, e->comp) : rc;
}

static int plain_forward(void *st, const int *in, const int *tg, int B, double *loss)
{
    return dl_gpt_forward(((plain_state *)st)->e->g, in, tg, B, loss);
}

static void plain_teardown(void *st)
{
    plain_state *p = st;
    free(p->in), free(p->tg), free(p);
}

int tr_plain_make(tr_env *e, tr_module *m)
{
    if (e->o->layout.pp > 1)
        return DL_OK;
    size_t n = (size_t)e->o->batch.micro * e->o->model.seq;
    plain_state *p = calloc(1, sizeof *p);
    if (p)
        p->e = e, p->in = malloc(sizeof(int) * n), p->tg = malloc(sizeof(int) * n);
    *m = (tr_module){.name = "plain",
                     .st = p,
                     .fwd_bwd = plain_fwd_bwd,
                     .forward = plain_forward,
                     .teardown = plain_teardown};
    if (!p || !p->in || !p->tg)
        return dl_error(DL_ENOMEM, "training: out of memory");
    return DL_OK;
}
