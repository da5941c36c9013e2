/* The composition (train/compose.h): the modules modules.def lists, each phase a loop over their
 * hooks in the list's order. */
#include <math.h>
#include <stdlib.h>
#include "train/compose.h"
#include "model/gpt_priv.h"

#define TR_MODULE(fn, resolve) int fn(tr_env *e, tr_module *m);
#include "train/modules.def"
#undef TR_MODULE

static const tr_make_fn makers[] = {
#define TR_MODULE(fn, resolve) fn,
#include "train/modules.def"
#undef TR_MODULE
};

/* each module's hook of one kind, in order, returning the first error */
#define EACH(c, hook, ...)                                                                         \
    do {                                                                                           \
        for (int i_ = 0; i_ < (c)->n; i_++) {                                                      \
            int rc_ = (c)->m[i_].hook ? (c)->m[i_].hook((c)->m[i_].st __VA_ARGS__) : DL_OK;        \
            if (rc_)                                                                               \
                return rc_;                                                                        \
        }                                                                                          \
    } while (0)

/* the async pipeline's update of one micro-batch: norm, clipping, this step's learning rate */
static int norm_update(tr_comp *c)
{
    const dl_train_opts *o = c->e->o;
    double norm = 0;
    int rc = tr_grad_norm(c, &norm);
    if (rc)
        return rc;
    return tr_update(c, tr_clip_scale(o->optim.clip, norm),
                     tr_lr_at(o->optim.lr, o->optim.min_lr, o->optim.warmup, o->optim.steps,
                              c->e->step));
}

int tr_compose(tr_env *e, tr_comp **out)
{
    tr_comp *c = *out = calloc(1, sizeof *c);
    if (!c)
        return dl_error(DL_ENOMEM, "training: out of memory");
    c->e = e;
    e->comp = c;
    e->call = (tr_calls){tr_grads_ready, tr_has_ready, norm_update};
    for (size_t k = 0; k < sizeof makers / sizeof makers[0]; k++) {
        if (c->n == TR_MAX_MODULES)
            return dl_error(DL_EINVAL, "training: more than %d modules", TR_MAX_MODULES);
        tr_module *m = &c->m[c->n];
        int rc = makers[k](e, m);
        if (m->name) {
            c->sh = m->shards ? m->shards : c->sh;
            c->n++;
        }
        if (rc)
            return rc;
    }
    if (!c->sh)
        return dl_error(DL_EINVAL, "training: no module shards the parameters");
    return DL_OK;
}

int tr_model_opts(tr_comp *c, dl_gpt_opts *go)
{
    EACH(c, model_opts, , go);
    return DL_OK;
}

int tr_setup(tr_comp *c)
{
    EACH(c, setup, );
    const dl_train_opts *o = c->e->o;
    tr_adam_hp hp = {o->optim.beta1, o->optim.beta2, o->optim.eps, o->optim.weight_decay};
    return tr_optim_init(&c->opt, c->sh, &c->e->pr, &hp, dl_ctx_arena(c->e->ctx));
}

int tr_begin(tr_comp *c)
{
    EACH(c, begin, );
    return DL_OK;
}

int tr_has_ready(const tr_comp *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->m[i].grads_ready)
            return 1;
    return 0;
}

int tr_grads_ready(size_t first, void *comp)
{
    tr_comp *c = comp;
    EACH(c, grads_ready, , first);
    return DL_OK;
}

/* the first runner's hook (modules.def lists the pipeline before the plain runner) */
static const tr_module *runner(const tr_comp *c, int fwd)
{
    for (int i = 0; i < c->n; i++)
        if (fwd ? c->m[i].forward != NULL : c->m[i].fwd_bwd != NULL)
            return &c->m[i];
    return NULL;
}

int tr_fwd_bwd(tr_comp *c, double *loss)
{
    const tr_module *r = runner(c, 0);
    *loss = 0;
    return r ? r->fwd_bwd(r->st, loss) : dl_error(DL_EINVAL, "training: no runner module");
}

int tr_forward(tr_comp *c, const int *in, const int *tg, int B, double *loss)
{
    const tr_module *r = runner(c, 1);
    return r ? r->forward(r->st, in, tg, B, loss) : dl_error(DL_EINVAL, "training: no runner");
}

int tr_from_head(tr_comp *c, double *v, int n)
{
    EACH(c, from_head, , v, n);
    return DL_OK;
}

int tr_reduce(tr_comp *c)
{
    EACH(c, reduce, );
    return DL_OK;
}

int tr_reduce_loss(tr_comp *c, double *loss)
{
    EACH(c, reduce_loss, , loss);
    return DL_OK;
}

int tr_grad_norm(tr_comp *c, double *norm)
{
    double sq = tr_grad_sumsq(c->sh, &c->e->pr, dl_gpt_get_layout(c->e->g));
    EACH(c, reduce_norm, , &sq);
    *norm = sqrt(sq);
    return DL_OK;
}

int tr_update(tr_comp *c, double scale, double lr)
{
    tr_optim_step(&c->opt, scale, lr);
    EACH(c, after_update, );
    return DL_OK;
}

int tr_export(tr_comp *c, int which, void *out)
{
    EACH(c, export_state, , which, out);
    return DL_OK;
}

void tr_import(tr_comp *c, const void *full)
{
    for (int i = 0; i < c->n; i++)
        if (c->m[i].import_state)
            c->m[i].import_state(c->m[i].st, full);
}

void *tr_whole_params(tr_comp *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->m[i].whole_params)
            return c->m[i].whole_params(c->m[i].st);
    return NULL;
}

void tr_counter(tr_comp *c, int64_t *v, int set)
{
    if (!set)
        *v = 0;
    for (int i = 0; i < c->n; i++)
        if (c->m[i].counter)
            c->m[i].counter(c->m[i].st, v, set);
}

void tr_report(tr_comp *c, dl_train_result *res)
{
    for (int i = 0; i < c->n; i++)
        if (c->m[i].report)
            c->m[i].report(c->m[i].st, res);
}

void tr_teardown(tr_comp *c)
{
    if (!c)
        return;
    tr_optim_free(&c->opt);
    for (int i = c->n - 1; i >= 0; i--)
        if (c->m[i].teardown)
            c->m[i].teardown(c->m[i].st);
    free(c);
}
