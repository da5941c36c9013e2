/* AdamW over the shards, the schedule and the clipping (train/optim.h). */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "train/optim.h"
#include "model/gpt_priv.h"
#include "parallel/tp_rules.h"

double tr_lr_at(double lr, double min_lr, int warmup, int steps, int step)
{
    if (warmup > 0 && step <= warmup)
        return lr * step / warmup;
    int decay = steps - warmup;
    if (decay <= 0)
        return lr;
    double t = (double)(step - warmup) / decay;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * (t > 1 ? 1 : t)));
}

double tr_clip_scale(double clip, double norm)
{
    return clip > 0 && norm > clip ? clip / norm : 1.0;
}

double tr_grad_sumsq(const tr_shards *sh, const tr_prec *pr, const dl_gpt_layout *l)
{
    double sq = 0;
    for (int u = 0; u < sh->zu->n; u++) {
        const dl_zero_unit *z = &sh->zu->u[u];
        const char *gr = sh->grad(sh->arg, u);
        size_t lo = z->begin, hi = z->begin + z->owned;
        for (int k = 0; k < l->ntensors; k++) {
            const dl_tensor_info *t = &l->t[k];
            if (!tr_tensor_counted(l, k))
                continue;
            size_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->numel;
            if (b > hi)
                b = hi;
            if (a >= b)
                continue;
            sq += pr->sumsq(gr + (a - lo) * (size_t)pr->dsize, b - a);
        }
    }
    return sq;
}

static int alloc_state(dl_arena *a, size_t bytes, void **out)
{
    if (a)
        return dl_arena_alloc(a, DL_MEM_OPTIMIZER, bytes, out);
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? DL_OK : dl_error(DL_ENOMEM, "optimizer: out of memory");
}

int tr_optim_init(tr_optim *op, const tr_shards *sh, const tr_prec *pr, const tr_adam_hp *hp,
                  dl_arena *arena)
{
    memset(op, 0, sizeof *op);
    op->sh = sh, op->pr = pr, op->hp = *hp, op->arena = arena;
    size_t bytes = sh->zu->shard * (size_t)pr->csize;
    int rc = alloc_state(arena, bytes, &op->m);
    if (rc == DL_OK)
        rc = alloc_state(arena, bytes, &op->v);
    return rc;
}

void tr_optim_step(tr_optim *op, double scale, double lr)
{
    const tr_shards *sh = op->sh;
    size_t cs = (size_t)op->pr->csize;
    int t = ++op->t;
    for (int u = 0; u < sh->zu->n; u++) {
        const dl_zero_unit *z = &sh->zu->u[u];
        size_t nw = z->owned, sb = z->sbase;
        if (!nw)
            continue;
        op->pr->adamw(sh->param(sh->arg, u), sh->master ? sh->master + sb : NULL,
                      sh->grad(sh->arg, u), (char *)op->m + sb * cs, (char *)op->v + sb * cs, nw,
                      &op->hp, lr, scale, t);
    }
}

void tr_optim_free(tr_optim *op)
{
    if (op->arena) {
        if (op->m)
            dl_arena_free(op->arena, op->m);
        if (op->v)
            dl_arena_free(op->arena, op->v);
    } else {
        free(op->m), free(op->v);
    }
    op->m = op->v = NULL;
}
